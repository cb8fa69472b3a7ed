"""Human and machine reports of diagnosed steps: the per-run summary and the formats of
`rlhf-exporter diagnose`. Pure formatting: no file I/O here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ..diagnosis import GROUPS, StepDiagnosis
from ..diagnosis.advice import LOOK_AT, SIDECAR_NOTE, look_at


class RunSummary:
    """Everything the per-run summary says, accumulated one step at a time."""

    def __init__(self, run: int):
        self.run = run
        self.steps = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.verdicts: Counter = Counter()
        self.reasons: Counter = Counter()  # (verdict, reason)
        self.regressions: dict[str, list[int]] = {}  # group -> steps
        self.workload_shifts: list[int] = []
        self.share_sums: dict[str, float] = dict.fromkeys(GROUPS, 0.0)
        self.step_seconds = 0.0

    def add(self, d: StepDiagnosis) -> None:
        self.steps += 1
        if self.first_step is None:
            self.first_step = d.step
        self.last_step = d.step
        self.verdicts[d.verdict] += 1
        if d.reason is not None:
            self.reasons[(d.verdict, d.reason)] += 1
        if d.change.regressed is not None:  # change `regression`
            self.regressions.setdefault(d.change.regressed, []).append(d.step)
        elif d.change.change == "workload_shift":
            self.workload_shifts.append(d.step)
        for g, s in d.windows.shares.items():
            self.share_sums[g] += s
        self.step_seconds += d.windows.step_seconds

    @property
    def dominant(self) -> tuple[str, str | None] | None:
        """The most frequent verdict (balanced counts too) and its most frequent reason."""
        if not self.verdicts:
            return None
        verdict = self.verdicts.most_common(1)[0][0]
        reasons = [(n, r) for (v, r), n in self.reasons.items() if v == verdict]
        reason = max(reasons)[1] if reasons else None
        return verdict, reason

    def mean_shares(self) -> dict[str, float]:
        n = max(self.steps, 1)
        return {g: s / n for g, s in self.share_sums.items()}

    def to_json(self) -> dict[str, Any]:
        dominant = self.dominant
        return {
            "run": self.run,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "verdicts": dict(self.verdicts.most_common()),
            "reasons": {f"{v}/{r}": n for (v, r), n in self.reasons.most_common()},
            "dominant": None
            if dominant is None
            else {
                "verdict": dominant[0],
                "reason": dominant[1],
                "look_at": look_at(*dominant) or None,
            },
            "regressions": {g: steps for g, steps in self.regressions.items()},
            "workload_shifts": self.workload_shifts,
            "mean_shares": {g: round(s, 4) for g, s in self.mean_shares().items()},
        }


def step_json(d: StepDiagnosis) -> dict[str, Any]:
    """The `--format json` step: the contract's object plus the evidence behind it."""
    out = d.to_json()
    out["step_seconds"] = round(d.windows.step_seconds, 6)
    out["group_seconds"] = {g: round(s, 6) for g, s in d.windows.group_seconds.items()}
    out["untimed_seconds"] = round(d.windows.untimed_seconds, 6)
    out["tokens"] = d.tokens
    out["evidence"] = dict(d.evidence)
    out["look_at"] = look_at(d.verdict, d.reason) or None
    if d.change.excess:
        out["excess_seconds"] = {g: round(x, 6) for g, x in d.change.excess.items()}
    base = d.change.baseline
    if base is not None:
        out["baseline"] = {
            "step_seconds": base.busy_seconds,
            "tokens_per_second": base.tokens_per_second,
            "cost_per_token": dict(base.costs),
        }
    return out


def ranges(steps: Iterable[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out: list[str] = []
    start = prev = None
    for s in steps:
        if prev is not None and s == prev + 1:
            prev = s
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = s
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(out)


# -- the terminal table ------------------------------------------------------------------

COLOURS = {
    "rollout": "34",
    "reward": "35",
    "logprob": "36",
    "update": "33",
    "sync": "31",
    "checkpoint": "90",
    "other": "37",
    "balanced": "32",
    "unknown": "90",
}


class Style:
    def __init__(self, colour: bool):
        self.colour = colour

    def verdict(self, text: str, verdict: str, width: int) -> str:
        padded = text.ljust(width)
        if not self.colour:
            return padded
        return f"\033[{COLOURS.get(verdict, '0')}m{padded}\033[0m"

    def bold(self, text: str) -> str:
        return f"\033[1m{text}\033[0m" if self.colour else text


class Column(NamedTuple):
    name: str
    header: str
    natural: int  # width with room for everything (--wide)
    minimum: int  # narrowest abbreviation
    align: str = "<"


COLUMNS = (
    Column("step", "step", 7, 7, ">"),
    Column("verdict", "verdict", 10, 10),
    Column("reason", "reason", 14, 14),
    Column("shares", "top shares", 36, 12),
    Column("change", "change", 22, 13),
    Column("look", "look at next", max(map(len, LOOK_AT.values())), 20),
)
GAP = 2
SHRINK = ("shares", "look", "change")  # abbreviated first, in this order
DROP = ("shares", "look", "change", "reason")  # then dropped, in this order (step, verdict stay)


class Table:
    """The per-step table laid out for a width: columns are abbreviated, then dropped, by
    priority until a row fits (`width=None`: everything, as `--wide`). The last column
    takes whatever room is left, so no row is wider than `width`."""

    def __init__(self, width: int | None = None):
        widths = {c.name: c.natural for c in COLUMNS}
        if width is not None:

            def total() -> int:
                return sum(widths.values()) + GAP * (len(widths) - 1)

            by_name = {c.name: c for c in COLUMNS}
            for name in SHRINK:
                if total() > width:
                    widths[name] = max(by_name[name].minimum, widths[name] - (total() - width))
            for name in DROP:
                if total() > width:
                    del widths[name]
            last = next(c.name for c in reversed(COLUMNS) if c.name in widths)
            widths[last] = max(widths[last] + width - total(), len(last))
        self.width = width
        self.columns = [c for c in COLUMNS if c.name in widths]
        self.widths = widths

    def _line(self, cells: Mapping[str, str], style: Style | None = None, verdict: str = "") -> str:
        out = []
        for i, c in enumerate(self.columns):
            w = self.widths[c.name]
            text = cells[c.name]
            if len(text) > w:
                text = text[: max(w - 1, 0)] + "…"
            last = i == len(self.columns) - 1
            if c.name == "verdict" and style is not None:
                out.append(style.verdict(text, verdict, w))
            elif c.align == ">":
                out.append(text.rjust(w))
            else:
                out.append(text if last else text.ljust(w))
        return (" " * GAP).join(out).rstrip()

    def header(self) -> list[str]:
        head = self._line({c.name: c.header for c in COLUMNS})
        return [head, "-" * len(head)]

    def row(self, d: StepDiagnosis, style: Style) -> str:
        cells = {
            "step": str(d.step),
            "verdict": d.verdict,
            "reason": d.reason or "",
            "shares": self._shares(d),
            "change": self._change(d),
            "look": look_at(d.verdict, d.reason),
        }
        return self._line(cells, style, d.verdict)

    def _shares(self, d: StepDiagnosis) -> str:
        w = self.widths.get("shares", 0)
        top = sorted(d.windows.shares.items(), key=lambda kv: -kv[1])[:3]
        parts = [f"{g} {s:.0%}" for g, s in top if s >= 0.005]
        while len(parts) > 1 and len("  ".join(parts)) > w:
            parts.pop()  # fewer shares rather than a cut one
        return "  ".join(parts)

    def _change(self, d: StepDiagnosis) -> str:
        change = d.change.change
        if change == "none":
            return ""
        wide = self.widths.get("change", 0) >= 22
        if change == "workload_shift":
            return "workload shift" if wide else "wkld shift"
        if change == "regression":
            return f"regression: {d.change.regressed}" if wide else f"regr: {d.change.regressed}"
        return change


def terminal_width(wide: bool, is_tty: bool) -> int | None:
    """The table's width: the terminal's (or $COLUMNS), None (no limit) with --wide or when
    the output is neither a terminal nor given a $COLUMNS (a pipe or a file keeps it all)."""
    import os
    import shutil

    if wide or (not is_tty and not os.environ.get("COLUMNS")):
        return None
    return shutil.get_terminal_size((80, 24)).columns


def table_header() -> list[str]:
    return Table().header()


def table_row(d: StepDiagnosis, style: Style) -> str:
    return Table().row(d, style)


def summary_lines(s: RunSummary, style: Style) -> list[str]:
    if not s.steps:
        return [f"  run {s.run}: no classified steps (no record had a usable timing_s/step)"]
    lines = [
        style.bold(
            f"  run {s.run}: {s.steps} classified steps ({s.first_step}-{s.last_step}), "
            f"{s.step_seconds / s.steps:.1f} s per step on average"
        )
    ]
    dominant = s.dominant
    assert dominant is not None  # s.steps > 0
    verdict, reason = dominant
    n = s.verdicts[verdict]
    lines.append(
        f"    bottleneck:  {style.verdict(verdict, verdict, 0)} in {n} of {s.steps} steps "
        f"({n / s.steps:.0%})" + (f", mostly {reason}" if reason else "")
    )
    advice = look_at(verdict, reason)
    if advice:
        lines.append(f"    look at:     {advice}")
    if verdict == "rollout":  # the log cannot see the engines (docs/engines.md)
        lines.append(f"    engines:     {SIDECAR_NOTE}")
    lines.append("    verdicts:    " + ", ".join(f"{v} {c}" for v, c in s.verdicts.most_common()))
    shares = sorted(s.mean_shares().items(), key=lambda kv: -kv[1])
    lines.append("    mean shares: " + ", ".join(f"{g} {x:.0%}" for g, x in shares if x >= 0.005))
    if s.regressions:
        for group, steps in s.regressions.items():
            lines.append(
                f"    regression:  {group} costs more than its work explains at steps {ranges(steps)}"
            )
    if s.workload_shifts:
        lines.append(
            f"    workload:    more work per step (not a regression) at steps {ranges(s.workload_shifts)}"
        )
    if not s.regressions and not s.workload_shifts:
        lines.append(
            "    change:      no regression and no workload shift against the job's own baseline"
        )
    return lines


def rejected_line(rejected: Mapping[str, int]) -> str:
    if not rejected:
        return "  rejected lines: none"
    total = sum(rejected.values())
    parts = ", ".join(
        f"{n} {reason}" for reason, n in sorted(rejected.items(), key=lambda kv: -kv[1])
    )
    return f"  rejected lines: {total} ({parts})"
