"""Label values that come from outside (an answer, a file): cleaned and cut like job names.

A Ray head's `ray_version`, an engine target's name or `engine` label, anything an answer
or a target list says, becomes a label value only through `outside_label`: control
characters and lone surrogates become U+FFFD (as in job names, rlhf_exporter.job.cleaning.clean_label)
and the value is cut to MAX_OUTSIDE_LABEL characters, so a 1 MB string never becomes a
1 MB label on every scrape.
"""

from __future__ import annotations

from ..job.cleaning import clean_label

MAX_OUTSIDE_LABEL = 120  # characters (as long as job.limits.KEY_LABEL_CHARS)


def outside_label(value: object, limit: int = MAX_OUTSIDE_LABEL) -> str:
    """`value` as a label value: a string, cleaned and at most `limit` characters."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value)
    else:  # a list or an object where a string belongs: never its (unbounded) repr
        text = "invalid"
    return clean_label(text[:limit])[0]
