"""Change episodes: a run's per-step change labels told as a person would.

The decision table labels each step on its own (`regression` of a group, `workload_shift`,
`steady`) against a baseline that keeps learning: a window that stays slow is labelled for a
few steps, then the baseline holds the new level and the label stops, though nothing
recovered. This module groups the labels into episodes and measures each against the steps
around it:

- a **regression episode**: consecutive steps labelled `regression` of one group (a gap of
  up to `GAP` unlabelled steps joins two stretches); its cost per unit of work (the group's
  seconds per million tokens), the step time and the throughput before (the last `WINDOW`
  unlabelled steps before it), during (its labelled steps) and after (the next `WINDOW`
  steps), each a median; and how it ended: `recovered` at the first later step whose cost
  is back within `RECOVERED` of the level before, `absorbed` (a new level the baseline
  learnt: still slow through the last step that stays above it), or `ongoing` (the run ends
  inside it).
- a **workload-shift episode**: consecutive `workload_shift` steps; how much the work grew
  (tokens per step, mean response length) and whether the time per token changed.

Pure: plain numbers in, plain values out (no I/O, nothing else of the package).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from .history import StepPoint
from .thresholds import GROUPS

REGRESSION, WORKLOAD_SHIFT, STEADY = "regression", "workload_shift", "steady"
GAP = 2  # unlabelled steps that may separate two stretches of one episode
WINDOW = 5  # steps before and after an episode whose medians are its "before" and "after"
RECOVERED = 1.10  # a cost within 10 % of the level before the episode has recovered
UNCHANGED = 0.10  # a time per token within ±10 % is "unchanged"
RECOVERED_AT, ABSORBED, ONGOING = "recovered", "absorbed", "ongoing"
ENDED = "ended"  # the labels stopped, with no step before the episode to compare with

GROUP_CHECKS: Mapping[str, str] = {
    "rollout": "the rollout engine (version, config, TP, concurrency), its GPUs' node, and "
    "the response length cap",
    "reward": "the reward model servers (placement, batch size, TP) and the reward function",
    "logprob": "log-prob micro-batch size and dynamic bsz, perf/mfu/actor_infer, the "
    "trainer's GPUs",
    "update": "perf/mfu/actor, micro-batch size, offload, the trainer's GPUs and "
    "interconnect (NCCL settings, a slow node)",
    "sync": "the checkpoint-engine backend and bucket size, and the network between the "
    "trainer and the rollout engines",
    "other": "driver work outside the timers: data loading, serialization, the controller's node",
}
"""Where to look when a group got costlier per unit of work."""


class Level(NamedTuple):
    """The medians of a few steps."""

    steps: int  # how many steps the medians are of
    step_seconds: float
    throughput: float | None  # tokens per GPU-second (verl's perf/throughput) or tokens/s
    cost: float | None  # the episode's group: seconds per million tokens
    tokens: float | None
    response_length: float | None  # mean
    longest_response: float | None

    def to_json(self) -> dict[str, Any]:
        return {k: (None if v is None else round(v, 4)) for k, v in self._asdict().items()}


class Episode(NamedTuple):
    kind: str  # regression or workload_shift
    run: int
    group: str | None  # the regressed group (None for a workload shift)
    first: int
    last: int
    steps: tuple[int, ...]  # the labelled steps
    before: Level | None
    during: Level
    after: Level | None
    ended: str  # recovered, absorbed, ongoing, or ended (no step before it to compare with)
    ended_at: int | None  # recovered: the first step back; absorbed: the last labelled step
    slow_through: int | None  # absorbed: the last step still at the new level
    throughput_unit: str  # "tokens/GPU-s" (verl's perf/throughput) or "tokens/s"

    def summary(self) -> str:
        return describe(self)

    def look_at(self) -> str:
        return episode_look_at(self)

    def to_json(self) -> dict[str, Any]:
        """A `diagnose --format jsonl` record of its own (`type: episode`)."""
        return {
            "type": "episode",
            "kind": self.kind,
            "run": self.run,
            "group": self.group,
            "first_step": self.first,
            "last_step": self.last,
            "steps": list(self.steps),
            "before": None if self.before is None else self.before.to_json(),
            "during": self.during.to_json(),
            "after": None if self.after is None else self.after.to_json(),
            "ended": self.ended,
            "ended_at": self.ended_at,
            "slow_through": self.slow_through,
            "throughput_unit": self.throughput_unit,
            "summary": self.summary(),
            "look_at": self.look_at(),
        }


_INDEX = {g: i for i, g in enumerate(GROUPS)}


def _cost(p: StepPoint, group: str | None) -> float | None:
    """The group's seconds per million tokens in the step."""
    i = _INDEX.get(group) if group is not None else None
    if i is None or not p.tokens:
        return None
    return p.group_seconds[i] / p.tokens * 1e6


def _throughput(p: StepPoint) -> float | None:
    if p.tokens_per_gpu_second is not None:
        return p.tokens_per_gpu_second
    if p.tokens and p.step_seconds > 0:
        return p.tokens / p.step_seconds
    return None


def median(values: Iterable[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _med(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return median(got) if got else None


def level(points: Sequence[StepPoint], group: str | None) -> Level | None:
    if not points:
        return None
    return Level(
        len(points),
        median(p.step_seconds for p in points),
        _med(_throughput(p) for p in points),
        _med(_cost(p, group) for p in points),
        _med(p.tokens for p in points),
        _med(p.response_length for p in points),
        _med(p.longest_response for p in points),
    )


def _key(p: StepPoint) -> tuple[str, str | None] | None:
    if p.change == REGRESSION and p.regressed is not None:
        return (REGRESSION, p.regressed)
    if p.change == WORKLOAD_SHIFT:
        return (WORKLOAD_SHIFT, None)
    return None


def _stretches(points: Sequence[StepPoint]) -> list[tuple[tuple[str, str | None], list[int]]]:
    """(kind and group, indexes of its labelled points), in order of their first step."""
    open_: dict[tuple[str, str | None], list[int]] = {}
    done: list[tuple[tuple[str, str | None], list[int]]] = []
    for i, p in enumerate(points):
        key = _key(p)
        for k in [k for k, idx in open_.items() if i - idx[-1] > GAP + 1]:
            done.append((k, open_.pop(k)))
        if key is not None:
            open_.setdefault(key, []).append(i)
    done += open_.items()
    return sorted(done, key=lambda kv: kv[1][0])


def episodes(points: Sequence[StepPoint]) -> list[Episode]:
    """Every episode of the points (one run or several, in step order per run)."""
    out: list[Episode] = []
    runs: dict[int, list[StepPoint]] = {}
    for p in points:
        runs.setdefault(p.run, []).append(p)
    for run, pts in runs.items():
        for (kind, group), idx in _stretches(pts):
            out.append(_episode(run, pts, kind, group, idx))
    return out


def _episode(
    run: int, pts: Sequence[StepPoint], kind: str, group: str | None, idx: list[int]
) -> Episode:
    a, z = idx[0], idx[-1]
    before_pts = [p for p in pts[:a] if p.change == STEADY][-WINDOW:]
    after_pts = [p for p in pts[z + 1 :] if p.change == STEADY][:WINDOW]
    before, after = level(before_pts, group), level(after_pts, group)
    during = level([pts[i] for i in idx], group)
    assert during is not None
    unit = "tokens/GPU-s" if all(p.tokens_per_gpu_second is not None for p in pts) else "tokens/s"
    ended, ended_at, slow_through = ONGOING, None, None
    if z + 1 < len(pts) and before is None:
        ended, ended_at = ENDED, pts[z].step
    elif z + 1 < len(pts):
        back = _recovered(pts, z, kind, group, before)
        if back is not None:
            ended, ended_at = RECOVERED_AT, back
        else:
            ended, ended_at = ABSORBED, pts[z].step
            slow_through = pts[-1].step
    return Episode(
        kind,
        run,
        group,
        pts[a].step,
        pts[z].step,
        tuple(pts[i].step for i in idx),
        before,
        during,
        after,
        ended,
        ended_at,
        slow_through,
        unit,
    )


def _recovered(
    pts: Sequence[StepPoint], z: int, kind: str, group: str | None, before: Level | None
) -> int | None:
    """The first step after the episode back at the level before it (None: never, in this
    run). A regression is back when its group's cost is; a workload shift when the step
    time is."""
    if before is None:
        return None
    for p in pts[z + 1 :]:
        if kind == REGRESSION:
            cost = _cost(p, group)
            if before.cost is None or cost is None:
                ref, now = before.step_seconds, p.step_seconds
            else:
                ref, now = before.cost, cost
        else:
            ref, now = before.step_seconds, p.step_seconds
        if now <= ref * RECOVERED:
            return p.step
    return None


HELD = 0.05  # a step time or throughput within ±5 % "held"; a cost within it is "as costly"


def _pct(new: float | None, old: float | None) -> str:
    if new is None or old is None or old <= 0:
        return ""
    return f" ({(new - old) / old:+.0%})".replace("+-", "-")


def _ratio(old: float | None, new: float | None) -> float | None:
    return None if old is None or new is None or old <= 0 else new / old - 1


def moved(ratio: float | None, up: str = "rose", down: str = "fell", same: str = "held") -> str:
    """The word for a change: `up` above +HELD, `down` below -HELD, else `same`."""
    if ratio is None or abs(ratio) < HELD:
        return same
    return up if ratio > 0 else down


def _change(
    name: str, old: float | None, new: float | None, fmt: str, unit: str = "", verb: bool = True
) -> str:
    """`name rose 100 -> 133 s (+32%)`: the verb always agrees with the numbers' sign."""
    if new is None:
        return ""
    if old is None:
        return f"{name} {new:{fmt}}{unit}"
    said = f" {moved(_ratio(old, new))}" if verb else ""
    return f"{name}{said} {old:{fmt}} -> {new:{fmt}}{unit}{_pct(new, old)}"


def _steps(e: Episode) -> str:
    return f"step {e.first}" if e.first == e.last else f"steps {e.first}-{e.last}"


def _ending(e: Episode) -> str:
    if e.ended == RECOVERED_AT:
        return f"recovered at step {e.ended_at}"
    if e.ended == ABSORBED:
        return (
            f"not recovered: a new level the baseline absorbed after step {e.ended_at}; "
            f"still slow through step {e.slow_through} (the run's last)"
            if e.kind == REGRESSION
            else f"the new workload stayed: the baseline absorbed it after step {e.ended_at}"
        )
    if e.ended == ENDED:
        return f"labelled until step {e.ended_at} (no earlier step here to compare with)"
    return f"ongoing at step {e.last} (the run's last)"


def _regression(e: Episode) -> str:
    """What got costlier per unit of work, then what the steps did (the step time and the
    throughput), each in words that agree with its numbers: a costlier window whose steps
    still got faster (a smaller workload, other windows faster) says so."""
    b, d = e.before, e.during
    cost = _ratio(b and b.cost, d.cost)
    if cost is not None:
        head = (
            f"{e.group} {moved(cost, 'costlier', 'cheaper', 'about as costly')} per token at "
            f"{_steps(e)}: "
            + _change(e.group or "", b and b.cost, d.cost, ".1f", " s per million tokens", False)
        )
    else:
        head = f"{e.group} costs more than its work explains at {_steps(e)}"
    step = _ratio(b and b.step_seconds, d.step_seconds)
    thr = _ratio(b and b.throughput, d.throughput)
    numbers = ", ".join(
        p
        for p in (
            _change("step time", b and b.step_seconds, d.step_seconds, ".0f", " s"),
            _change(e.throughput_unit, b and b.throughput, d.throughput, ".0f"),
        )
        if p
    )
    tokens = _ratio(b and b.tokens, d.tokens)
    smaller = (
        f"{-tokens:.0%} fewer tokens per step" if tokens is not None and tokens <= -HELD else ""
    )
    if step is None:
        effect = numbers
    elif step >= HELD:
        effect = f"the steps slowed: {numbers}"
    elif thr is not None and thr <= -HELD:
        steps = "the steps got faster" if step <= -HELD else "the step time held"
        effect = f"{steps} but throughput fell: {numbers}" + (f" ({smaller})" if smaller else "")
    else:
        steps = "yet the steps got faster" if step <= -HELD else "yet the step time held"
        by = f"a smaller workload ({smaller})" if smaller else "other windows getting faster"
        effect = f"{steps}: {numbers}, the costlier {e.group} hidden by {by}"
    return "; ".join(p for p in (head, effect, _ending(e)) if p)


def describe(e: Episode) -> str:
    """One sentence: what, when, how much, what the steps did, how it ended."""
    b, d = e.before, e.during
    if e.kind == REGRESSION:
        return _regression(e)
    grew: list[str] = []
    for name, old, new in (
        ("responses", b and b.response_length, d.response_length),
        ("the longest response", b and b.longest_response, d.longest_response),
    ):
        if old and new and abs(new / old - 1) >= 0.05 and not grew:  # the mean, else the max
            ratio = new / old - 1
            grew.append(f"{name} {abs(ratio):.0%} {'longer' if ratio > 0 else 'shorter'}")
    if b is not None and b.tokens and d.tokens:
        ratio = d.tokens / b.tokens - 1
        if abs(ratio) >= 0.05:
            grew.append(f"{abs(ratio):.0%} {'more' if ratio > 0 else 'fewer'} tokens per step")
    what = " and ".join(grew) or "more work per step"
    per_token = ""
    if b is not None and b.tokens and d.tokens:
        old, new = b.step_seconds / b.tokens, d.step_seconds / d.tokens
        ratio = new / old - 1
        if abs(ratio) <= UNCHANGED:
            per_token = "time per token unchanged"
        elif ratio > 0:  # work the token count misses: the measures explain it (§4)
            per_token = (
                f"time per token {ratio:+.0%}, yet no window costs more than its work "
                "measures explain (the tokens logged are not all the work)"
            )
        else:
            per_token = f"time per token {ratio:+.0%}".replace("+-", "-")
    parts = [
        f"workload shift: {what} from step {e.first} (to step {e.last})",
        per_token,
        _change("step time", b and b.step_seconds, d.step_seconds, ".0f", " s"),
        _ending(e),
    ]
    return "; ".join(p for p in parts if p)


def episode_look_at(e: Episode) -> str:
    if e.kind == REGRESSION and e.group is not None:
        return (
            f"what changed at step {e.first} (a deploy, a node, a config, a library) in "
            f"{e.group}: {GROUP_CHECKS.get(e.group, e.group)}"
        )
    return (
        f"the data at step {e.first} (a new dataset mix, a longer prompt or response cap): "
        "not a regression; if it stays, expect this step time"
    )


def balanced_look_at(mean_shares: Mapping[str, float], checks: Mapping[str, str]) -> str:
    """For a mostly balanced run: the two largest windows and what to check in each
    (`checks`: group -> advice, e.g. the decision table's look-at texts)."""
    top = [
        (g, s)
        for g, s in sorted(mean_shares.items(), key=lambda kv: -kv[1])
        if s >= 0.005 and g != "checkpoint"
    ][:2]
    if not top:
        return ""
    parts = [f"{g} ({s:.0%}): {checks.get(g) or GROUP_CHECKS.get(g, g)}" for g, s in top]
    return "no window dominates; the largest are " + "; ".join(parts)


def headline(
    points: Sequence[StepPoint],
    found: Sequence[Episode],
    verdicts: Mapping[str, int],
) -> str:
    """A run in one sentence, the answer first: how its throughput changed from its first to
    its last steps (medians of WINDOW steps), its regressions and how they ended, then the
    verdict mix."""
    parts: list[str] = []
    if len(points) >= 2 * WINDOW:
        unit = (
            "tokens/GPU-s"
            if all(p.tokens_per_gpu_second is not None for p in points)
            else "tokens/s"
        )
        first = _med(_throughput(p) for p in points[:WINDOW])
        last = _med(_throughput(p) for p in points[-WINDOW:])
        if first is not None and last is not None:
            verb = moved(_ratio(first, last))
            if verb == "held" and any(e.kind == REGRESSION for e in found):
                verb = "went"  # not "held": a regression between cost throughput meanwhile
            parts.append(
                f"throughput {verb} {first:.0f} -> {last:.0f} {unit}"
                f"{_pct(last, first)} from the first {WINDOW} steps to the last {WINDOW}"
            )
    regressions = [e for e in found if e.kind == REGRESSION]
    if regressions:
        open_ = sum(e.ended in (ABSORBED, ONGOING) for e in regressions)
        n = len(regressions)
        told = f"{n} regression{'s' if n > 1 else ''}"
        if open_:
            told += (
                (", none recovered" if open_ == n else f", {open_} never recovered")
                if n > 1
                else ", never recovered"
            )
        told += ": " + ", ".join(f"{e.group} ({_steps(e)})" for e in regressions)
        parts.append(told)
    shifts = [e for e in found if e.kind == WORKLOAD_SHIFT]
    if shifts:
        parts.append(
            "workload shift at "
            + ", ".join(f"step {e.first}" for e in shifts)
            + " (not a regression)"
        )
    total = sum(verdicts.values())
    if total:
        mix = sorted(verdicts.items(), key=lambda kv: -kv[1])
        parts.append(
            "verdicts: " + ", ".join(f"{v} {n / total:.0%}" for v, n in mix if n / total >= 0.05)
        )
    text = "; ".join(parts)
    return text[:1].upper() + text[1:]
