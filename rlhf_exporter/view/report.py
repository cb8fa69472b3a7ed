"""Human and machine reports of diagnosed steps: the per-run summary and the formats of
`rlhf-exporter diagnose`. Pure formatting: no file I/O here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ..diagnosis import BALANCED, GROUPS, StepDiagnosis
from ..diagnosis.advice import LOOK_AT, SIDECAR_NOTE, look_at
from ..diagnosis.change import STEADY
from ..diagnosis.episodes import Episode, balanced_look_at, episodes, headline
from ..diagnosis.history import StepPoint, point
from ..diagnosis.words import counted, step_span

MAX_EPISODE_STEPS = 100_000
"""Steps of one run a summary keeps (compact points) to tell its change episodes; a longer
run's episodes are those of its first MAX_EPISODE_STEPS steps, and the summary says so."""


class RunSummary:
    """Everything the per-run summary says, accumulated one step at a time."""

    def __init__(self, run: int):
        self.run = run
        self.steps = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.verdicts: Counter[str] = Counter()
        self.reasons: Counter[tuple[str, str]] = Counter()  # (verdict, reason)
        self.regressions: dict[str, list[int]] = {}  # group -> steps
        self.workload_shifts: list[int] = []
        self.judged = 0  # steps compared with a baseline (the first steps of a run build it)
        self.measured = 0  # steps with a token count and a step time (what a baseline keeps)
        self.share_sums: dict[str, float] = dict.fromkeys(GROUPS, 0.0)
        self.step_seconds = 0.0
        self.points: list[StepPoint] = []  # for the change episodes, at most MAX_EPISODE_STEPS
        self._episodes: list[Episode] | None = None

    def add(self, d: StepDiagnosis, p: StepPoint | None = None) -> None:
        """One more step; `p` its point with the record's throughput and response lengths
        (the episodes' numbers), or None (built from the diagnosis alone)."""
        if len(self.points) < MAX_EPISODE_STEPS:
            self.points.append(p if p is not None else point(d))
            self._episodes = None
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
        self.judged += d.change.baseline is not None
        self.measured += d.change.point is not None
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

    def episodes(self) -> list[Episode]:
        """The run's change episodes (rlhf_exporter/diagnosis/episodes.py)."""
        if self._episodes is None:
            self._episodes = episodes(self.points)
        return self._episodes

    def headline(self) -> str:
        """The run in one sentence: the throughput change, the episodes, the verdict mix."""
        return headline(self.points, self.episodes(), self.verdicts)

    def look_at(self) -> str:
        """Where to look for the run as a whole: the dominant verdict's advice, or for a
        mostly balanced run the two largest windows and what to check in each."""
        dominant = self.dominant
        if dominant is None:
            return ""
        if dominant[0] == BALANCED:
            return balanced_look_at(self.mean_shares(), {})
        return look_at(*dominant)

    def to_json(self) -> dict[str, Any]:
        dominant = self.dominant
        return {
            "run": self.run,
            "headline": self.headline(),
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
                "look_at": self.look_at() or None,
            },
            "regressions": {g: steps for g, steps in self.regressions.items()},
            "workload_shifts": self.workload_shifts,
            "episodes": [e.to_json() for e in self.episodes()],
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
    if d.windows.unnamed:  # v4: their own seconds (`other` counts them clipped)
        out["unnamed_timers"] = {n: round(d.timers[n], 6) for n in d.windows.unnamed}
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
    Column("step", "step", 7, 5, ">"),
    Column("verdict", "verdict", 10, 10),
    Column("reason", "reason", 14, 14),
    Column("shares", "top shares", 36, 12),
    Column("change", "change", 22, 13),
    Column("look", "look at next", max(map(len, LOOK_AT.values())), 20),
)
GAP = 2
SAME = '"'  # a look-at cell that repeats the row above's (a ditto mark)
LOOK_WANTED = 45  # room "look at next" wants (or half the width, when wider) before others stay
# How a narrow table makes room for "look at next", least useful first, until it has
# LOOK_WANTED columns: ("shrink", column) abbreviates to its minimum; ("drop", column) removes
# it. "look at next" is never dropped nor cut: it takes the rest of the width and wraps under
# itself. A dropped `change` goes into the look-at cell of the (few) rows that have one.
FIT = (
    ("shrink", "shares"),
    ("shrink", "change"),
    ("drop", "change"),
    ("shrink", "step"),
    ("drop", "shares"),
    ("drop", "reason"),
)


def wrap(text: str, width: int) -> list[str]:
    """Greedy wrap at spaces; a word longer than a line (a verl key such as
    actor_rollout_ref.rollout.update_weights_bucket_megabytes) breaks after a `.`, `_` or
    `/`, and only as a last resort anywhere."""
    import re

    pieces: list[tuple[str, bool]] = []  # (piece, starts a new word)
    for word in text.split():
        parts = re.split(r"(?<=[._/])", word) if len(word) > width else [word]
        for i, part in enumerate(p for p in parts if p):
            while len(part) > width:
                pieces.append((part[:width], i == 0))
                part, i = part[width:], 1
            pieces.append((part, i == 0))
    lines: list[str] = []
    for piece, new_word in pieces:
        sep = " " if new_word else ""
        if lines and len(lines[-1]) + len(sep) + len(piece) <= width:
            lines[-1] += sep + piece
        else:
            lines.append(piece)
    return lines or [text]


class Table:
    """The per-step table laid out for a width (`width=None`: everything on one line, as
    `--wide`): the least useful columns are abbreviated, then dropped (FIT), until "look at
    next" has LOOK_WANTED columns (half the width, when wider); it takes whatever room is left and wraps under itself,
    so no line is wider than `width` and the advice is always whole."""

    def __init__(self, width: int | None = None):
        widths = {c.name: c.natural for c in COLUMNS}
        by_name = {c.name: c for c in COLUMNS}
        if width is not None:

            def room() -> int:  # what the other columns leave to "look at next"
                others = [w for n, w in widths.items() if n != "look"]
                return width - sum(others) - GAP * len(others)

            wanted = min(max(LOOK_WANTED, width // 2), by_name["look"].natural)
            for action, name in FIT:
                if room() >= wanted:
                    break
                if action == "shrink":
                    widths[name] = by_name[name].minimum
                else:
                    del widths[name]
            widths["look"] = max(room(), 8)
        self.width = width
        self.columns = [c for c in COLUMNS if c.name in widths]
        self.widths = widths
        self._last_advice: str | None = None  # the row above's, folded when repeated
        self._first = True  # the next row is its run's first step

    def _cell_lines(self, c: Column, text: str, last: bool) -> list[str]:
        w = self.widths[c.name]
        if len(text) <= w:
            return [text]
        if last and self.width is not None:  # "look at next": wrapped, never cut
            return wrap(text, w)
        return [text[: max(w - 1, 0)] + "…"]

    def _line(self, cells: Mapping[str, str], style: Style | None = None, verdict: str = "") -> str:
        out = []
        more: list[str] = []
        for i, c in enumerate(self.columns):
            w = self.widths[c.name]
            last = i == len(self.columns) - 1
            lines = self._cell_lines(c, cells[c.name], last)
            text = lines[0]
            if last:
                more = lines[1:]
            if c.name == "verdict" and style is not None:
                out.append(style.verdict(text, verdict, w))
            elif c.align == ">":
                out.append(text.rjust(w))
            else:
                out.append(text if last else text.ljust(w))
        first = (" " * GAP).join(out).rstrip()
        if not more:
            return first
        indent = " " * (sum(self.widths[c.name] + GAP for c in self.columns[:-1]))
        return "\n".join([first, *(indent + m for m in more)])

    def header(self) -> list[str]:
        self._last_advice = None
        self._first = True
        head = self._line({c.name: c.header for c in COLUMNS})
        return [head, "-" * len(head)]

    def row(self, d: StepDiagnosis, style: Style) -> str:
        """One step: a line, or more when "look at next" wraps."""
        first, self._first = self._first, False
        advice = WARM_UP if first and d.reason == "untimed" else look_at(d.verdict, d.reason)
        if advice and advice == self._last_advice:
            advice = SAME  # the same advice as the row above, folded
        else:
            self._last_advice = advice
        if "change" not in self.widths and d.change.change != STEADY:
            advice = f"[{self._change(d)}] {advice}".rstrip()
        cells = {
            "step": str(d.step),
            "verdict": d.verdict,
            "reason": d.reason or "",
            "shares": self._shares(d),
            "change": self._change(d),
            "look": advice,
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
        if change == STEADY:  # before the run has a baseline, nothing was compared
            return "warming up" if d.change.baseline is None else ""
        wide = self.widths.get("change", 22) >= 22
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


WARM_UP = (
    "warm-up: a run's first step carries its start-up (engines warming, the first batch), "
    "untimed by verl; judge the steps after it"
)


def table_header() -> list[str]:
    return Table().header()


def table_row(d: StepDiagnosis, style: Style) -> str:
    return Table().row(d, style)


def summary_lines(s: RunSummary, style: Style) -> list[str]:
    if not s.steps:
        return [f"  run {s.run}: no classified steps (no record had a usable timing_s/step)"]
    lines = [
        style.bold(
            f"  run {s.run}: {counted(s.steps, 'classified step')} "
            f"({step_span(s.first_step, s.last_step)}), "
            f"{s.step_seconds / s.steps:.1f} s per step on average"
        )
    ]
    lines.append(f"    answer:      {s.headline()}")
    dominant = s.dominant
    assert dominant is not None  # s.steps > 0
    verdict, reason = dominant
    n = s.verdicts[verdict]
    lines.append(
        f"    bottleneck:  {style.verdict(verdict, verdict, 0)} in {n} of "
        f"{counted(s.steps, 'step')} "
        f"({n / s.steps:.0%})" + (f", mostly {reason}" if reason else "")
    )
    advice = s.look_at()
    if advice:
        lines.append(f"    look at:     {advice}")
    if verdict == "rollout":  # the log cannot see the engines (docs/engines.md)
        lines.append(f"    engines:     {SIDECAR_NOTE}")
    lines.append("    verdicts:    " + ", ".join(f"{v} {c}" for v, c in s.verdicts.most_common()))
    shares = sorted(s.mean_shares().items(), key=lambda kv: -kv[1])
    lines.append("    mean shares: " + ", ".join(f"{g} {x:.0%}" for g, x in shares if x >= 0.005))
    if s.regressions:
        for group, steps in s.regressions.items():
            at = f"step{'s' if len(steps) > 1 else ''} {ranges(steps)}"
            lines.append(f"    regression:  {group} costs more than its work explains at {at}")
    if s.workload_shifts:
        n = len(s.workload_shifts)
        at = f"step{'s' if n > 1 else ''} {ranges(s.workload_shifts)}"
        lines.append(f"    workload:    more work per step (not a regression) at {at}")
    if not s.regressions and not s.workload_shifts:
        lines.append("    change:      " + no_change_words(s))
    for i, e in enumerate(s.episodes(), 1):
        lines.append(f"    episode {i}:   {e.summary()}")
        lines.append(f"      look at:   {e.look_at()}")
    if len(s.points) < s.steps:
        lines.append(f"    (episodes of the first {len(s.points)} steps only)")
    return lines


def no_change_words(s: RunSummary) -> str:
    """What a run without a regression or workload shift may claim: nothing, until its
    first steps have built the baseline the later ones are compared with."""
    if s.steps and not s.measured:
        return (
            f"not judged: none of its {counted(s.steps, 'step')} logged a token count, which a "
            "baseline is built from (no regression or workload shift can be seen)"
        )
    if not s.judged:
        return (
            f"no baseline yet: {counted(s.steps, 'step')} of this run, none compared (a change "
            "is judged against the job's own earlier steps once there are enough of them)"
        )
    return (
        f"no regression and no workload shift against the job's own baseline "
        f"({counted(s.judged, 'step')} compared; the first {s.steps - s.judged} built it)"
    )


def rejected_line(rejected: Mapping[str, int]) -> str:
    if not rejected:
        return "  rejected lines: none"
    total = sum(rejected.values())
    parts = ", ".join(
        f"{n} {reason}" for reason, n in sorted(rejected.items(), key=lambda kv: -kv[1])
    )
    return f"  rejected lines: {total} ({parts})"
