"""sources/console_join.py: slime's two `perf N` lines of a step, arriving in either order
through Ray, are one record before the step is diagnosed; a missing half is forced out by
the steps after it, counted; steps leave in order, each once."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.diagnosis import Record
from rlhf_exporter.diagnosis.steps import STEP_KEY
from rlhf_exporter.frameworks import SLIME
from rlhf_exporter.sources.console_join import (
    HALF_STEP,
    HALVES,
    LATE_HALF,
    MAX_HELD_STEPS,
    StepJoiner,
)
from rlhf_exporter.sources.framework_console import FrameworkConsoleReader

FIXTURE = Path(__file__).parent / "fixtures" / "frameworks" / "slime" / "regression.console.log"
ROLLOUT, TRAINER = HALVES[SLIME]


def halves() -> list[Record]:
    """The fixture's records, as slime's reader gives them: a half a line, rollout first."""
    reader = FrameworkConsoleReader()
    records = list(reader.feed(FIXTURE.read_bytes())) + list(reader.finish())
    assert reader.framework == SLIME and len(records) == 32
    return records


def merged(records: list[Record]) -> list[Record]:
    out: dict[int, dict] = {}
    for r in records:
        out.setdefault(r.step, {}).update(r.data)
    return [Record(s, d) for s, d in sorted(out.items())]


def test_the_halves_mark_the_rollout_manager_and_the_trainer() -> None:
    assert (ROLLOUT, TRAINER) == ("timing_s/gen", STEP_KEY)
    first, second = halves()[:2]
    assert ROLLOUT in first.data and TRAINER not in first.data
    assert TRAINER in second.data and ROLLOUT not in second.data


def test_a_step_leaves_once_both_halves_are_in_whichever_came_first() -> None:
    records = halves()
    swapped = [r for pair in zip(records[1::2], records[0::2], strict=True) for r in pair]
    joiner = StepJoiner(SLIME)
    out = []
    for r in swapped:
        got = list(joiner.feed([r]))
        if TRAINER in r.data:  # the trainer's half came first: the step waits for the other
            assert got == []
        else:
            assert [g.step for g in got] == [r.step]
        out += got
    assert out == merged(records)
    assert not joiner.rejected and joiner.held == 0


def test_a_missing_half_is_forced_out_by_the_step_two_after_it_counted() -> None:
    records = halves()
    without = [r for r in records if not (r.step == 3 and ROLLOUT in r.data)]
    joiner = StepJoiner(SLIME)
    out = list(joiner.feed(without))
    assert [r.step for r in out] == list(range(16))  # in order, each once
    assert joiner.rejected == {HALF_STEP: 1}
    assert ROLLOUT not in out[3].data and TRAINER in out[3].data
    assert out[:3] + out[4:] == merged(records)[:3] + merged(records)[4:]
    assert list(joiner.finish()) == []


def test_a_late_half_of_a_forced_step_is_dropped_counted_and_a_restart_is_a_new_run() -> None:
    records = halves()
    joiner = StepJoiner(SLIME)
    late = next(r for r in records if r.step == 3 and ROLLOUT in r.data)
    cut = [r for r in records if r is not late and r.step <= 6]
    cut = [r for r in cut if not (r.step == 6 and TRAINER in r.data)]
    out = list(joiner.feed(cut))
    assert [r.step for r in out] == [0, 1, 2, 3, 4, 5]  # step 6 holds one half
    assert list(joiner.feed([late])) == [] and joiner.rejected[LATE_HALF] == 1
    # a half of the last step given out passes on (the job merges it into that step)
    again = Record(5, {"perf/extra": 1.0})
    assert list(joiner.feed([again])) == [again]
    # slime restarted from rollout 0: the old run's held step leaves, then the new run's
    restart = list(joiner.feed(records[:2]))
    assert [r.step for r in restart] == [6, 0]
    assert joiner.rejected == {LATE_HALF: 1, HALF_STEP: 2}  # step 3, and step 6 cut short


def test_at_most_max_held_steps_wait_behind_a_missing_half() -> None:
    joiner = StepJoiner(SLIME)
    out = list(joiner.feed([Record(s, {ROLLOUT: 1.0}) for s in range(MAX_HELD_STEPS + 3)]))
    assert [r.step for r in out] == list(range(5))  # each forced by the step two after it
    assert joiner.held <= MAX_HELD_STEPS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=32, max_size=32), st.integers(1, 4))
def test_any_skew_of_up_to_two_halves_between_the_actors_loses_and_repeats_nothing(
    picks: list[bool], batch: int
) -> None:
    """Each actor's lines in their own order, the two interleaved in any way (Ray forwards
    each actor's file on its own): every step leaves once, whole, in order, nothing counted,
    as long as neither actor is more than two halves ahead of the other."""
    records = halves()
    rollout = [r for r in records if ROLLOUT in r.data]
    trainer = [r for r in records if TRAINER in r.data]
    arrived: list[Record] = []
    for pick in itertools.chain(picks, itertools.repeat(True)):
        if not rollout and not trainer:
            break
        lead = len(rollout) - len(trainer)  # > 0: the trainer is that many halves ahead
        take_rollout = not trainer or (bool(rollout) and (lead >= 2 or (lead > -2 and pick)))
        arrived.append((rollout if take_rollout else trainer).pop(0))
    joiner = StepJoiner(SLIME)
    out = []
    for i in range(0, len(arrived), batch):
        out += joiner.feed(arrived[i : i + batch])
    out += joiner.finish()
    assert out == merged(records) and not joiner.rejected
