"""Small words that must agree with their numbers: a count and its noun, a range of steps."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`1 record`, `3 records` (`plural` when the noun does not take an s)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def step_span(first: int | None, last: int | None) -> str:
    """`step 7`, `steps 1-40`."""
    if first is None or last is None or first == last:
        return f"step {first if first is not None else last}"
    return f"steps {first}-{last}"
