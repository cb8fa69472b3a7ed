"""sources/console_drivers.py and the driver log's reader: which submissions' driver logs the
console source reads (the Jobs API's list, hostile entries left out), and what it reads in a
driver log (the driver's own lines and forwarded non-trainer actors' lines; a trainer's lines,
read from its own stdout, skipped), with hostile bytes between them."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_exporter.frameworks import AREAL, OPENRLHF, SLIME
from rlhf_exporter.sources.console import ConsoleSource
from rlhf_exporter.sources.console_drivers import DRIVER_TAIL, parse
from rlhf_exporter.sources.framework_console import FrameworkConsoleReader, detect
from rlhf_exporter.sources.roles import TRAINER_CLASSES
from rlhf_exporter.thresholds_file import load_thresholds

FIXTURES = Path(__file__).parent / "fixtures" / "frameworks"
TH = load_thresholds(None)
NODE = "4f671d9fb5772dda00c5f06beb8b39c81c50476f6bc24ff6b3f39014"


def entry(sid: Any = "raysubmit_a", status: Any = "RUNNING", **more: Any) -> dict[str, Any]:
    return {"type": "SUBMISSION", "submission_id": sid, "status": status, "job_id": None,
            "driver_node_id": NODE, "start_time": 1796516004171, "end_time": None,
            "metadata": {}, "entrypoint": "python train.py", **more}  # fmt: skip


def test_the_running_submissions_are_listed_with_their_driver_logs_file() -> None:
    drivers = parse(
        [
            entry(metadata={"project": "p", "experiment": "e"}),
            entry("raysubmit_b", "SUCCEEDED", job_id="03000000", end_time=1796516104171),
            entry("raysubmit_c", "PENDING", driver_node_id=None),  # no node yet
            {"type": "DRIVER", "job_id": "01000000", "status": "RUNNING"},  # ray.init by hand
            entry("../../etc/passwd"), entry("a b"), entry(7), entry("x", status=["RUNNING"]),
            entry("raysubmit_d", driver_node_id="../n"), "junk", None, [entry()],
        ]
    )  # fmt: skip
    assert sorted(drivers) == ["raysubmit_a", "raysubmit_b"]
    a, b = drivers["raysubmit_a"], drivers["raysubmit_b"]
    assert a.running and a.named == ("p", "e") and a.key == "raysubmit_a" and a.job_id == ""
    assert a.log_file == {"node_id": NODE, "filename": "job-driver-raysubmit_a.log"}
    assert a.fact.status == "RUNNING" and a.fact.since == 1796516004.171
    assert not b.running and b.key == "03000000" and b.fact.since == 1796516104.171


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=15), inner),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "submission_id": st.one_of(JSON, st.just("raysubmit_x")),
        "status": st.one_of(JSON, st.sampled_from(["RUNNING", "FAILED", "PENDING"])),
        "driver_node_id": st.one_of(JSON, st.just(NODE)),
        "job_id": JSON, "metadata": JSON, "entrypoint": JSON, "start_time": JSON,
        "end_time": JSON,
    },
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(FIELDS, JSON), max_size=8))
def test_any_jobs_api_answer_parses_without_raising(entries: list[Any]) -> None:
    drivers = parse(entries)
    for sid, d in drivers.items():
        assert sid == d.submission_id and d.node_id == NODE and "/" not in sid
        assert d.fact.status in ("PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED")


def driver_reader() -> FrameworkConsoleReader:
    """The reader the console source gives a driver log (console.py's `_driver_reader`)."""
    return FrameworkConsoleReader(1 << 16, None, TRAINER_CLASSES)


def test_a_driver_log_reads_the_drivers_own_steps_and_skips_a_trainers_forwarded_ones() -> None:
    areal = (FIXTURES / "areal" / "regression.console.log").read_bytes()
    openrlhf = (FIXTURES / "openrlhf" / "regression.console.log").read_bytes()
    forwarded = b"".join(b"(PPOTrainer pid=7) " + line for line in openrlhf.splitlines(True))
    reader = driver_reader()
    steps = [r.step for r in reader.feed(forwarded + areal)] + [r.step for r in reader.finish()]
    assert reader.framework == AREAL and steps == list(range(1, 17))
    assert not reader.rejected  # the trainer's lines are no foreign steps: read elsewhere
    # slime's actors are no trainers the console source reads: their forwarded lines count
    slime = (FIXTURES / "slime" / "regression.console.log").read_bytes()
    prefixed = b"".join(
        (b"(RolloutManager pid=8) " if b"rollout" in line else b"(MegatronTrainRayActor pid=9) ")
        + line
        for line in slime.splitlines(True)
    )
    reader = driver_reader()
    assert len(list(reader.feed(prefixed))) == 32 and reader.framework == SLIME


PREFIXES = st.sampled_from([b"", b"(RolloutManager pid=3) ", b"\x1b[36m(pid=4)\x1b[0m "])
TRAINER = st.sampled_from([b"(PPOTrainer pid=1) ", b"(TaskRunner pid=2, ip=10.0.0.2) "])
HOSTILE = st.binary(max_size=80).filter(lambda b: detect(b) is None and b"Global" not in b)


def good_line(step: int) -> bytes:
    return (
        b"INFO 01-01 00:01:30 ppo_trainer.py:551] \xe2\x9c\xa8 Global step %d: {'timing/generation': 4"
        b"0.0, 'timing/ppo_train': 25.0, 'timing/step_total': 65.0}" % step
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), PREFIXES, TRAINER, HOSTILE), max_size=20),
    st.lists(st.integers(0, 4000), max_size=10),
)
def test_hostile_bytes_in_a_driver_log_never_raise_nor_lose_a_good_step(
    lines: list[tuple[bool, bytes, bytes, bytes]], cuts: list[int]
) -> None:
    """The driver's own step lines (or a non-trainer actor's) between random bytes and a
    trainer's forwarded step lines, cut into random chunks: every good step comes out, in
    order, once; the trainer's never do; nothing held exceeds max_line."""
    data, want = b"", []
    for i, (good, prefix, trainer, junk) in enumerate(lines):
        if good:
            data += prefix + good_line(i) + b"\n"
            want.append(i)
        data += trainer + good_line(10_000 + i) + b"\n" + junk + b"\n"
    reader = driver_reader()
    got, bounds = [], [0, *sorted(c for c in cuts if c < len(data)), len(data)]
    for a, b in itertools.pairwise(bounds):
        got += [r.step for r in reader.feed(data[a:b])]
        assert reader.pending_bytes <= reader.max_line
    got += [r.step for r in reader.finish()]
    assert got == want
    assert reader.framework in (None, OPENRLHF)


class NoTrainers:
    trainers_seen = True

    def trainer_actors(self) -> dict[str, Any]:
        return {}

    def submission_fact(self, job_id: str) -> None:
        return None


def listed(console: ConsoleSource, *entries: dict[str, Any]) -> None:
    """The console source's list of submissions, as if Ray had just answered `entries`."""
    console._drivers.drivers, console._drivers.listed = parse(entries), True
    console._drivers.every = 1e9
    console._drivers._at = 0.0


def test_driver_logs_count_against_max_streams_once_each_and_end_with_their_submission() -> None:
    console = ConsoleSource(TH, NoTrainers(), "http://127.0.0.1:9", max_streams=1, timeout=0.2)
    listed(console, entry("raysubmit_a"), entry("raysubmit_b"), entry("raysubmit_c", "FAILED"))
    for _ in range(3):
        console.poll_once()
    assert sorted(console._jobs) == ["raysubmit_a"]  # one stream; an ended one is not read
    (tail,) = console._jobs["raysubmit_a"].tails.values()
    assert tail.driver and tail.log_file["filename"] == "job-driver-raysubmit_a.log"
    assert console.snapshot().record_errors["too_many_streams"] == 1  # once, for b
    # a's driver connected to Ray (its job is keyed by its Ray job id now), then it ended
    listed(console, entry("raysubmit_a", "SUCCEEDED", job_id="05000000"), entry("raysubmit_b"))
    console.poll_once()
    assert sorted(console._jobs) == ["05000000", "raysubmit_b"]
    assert console._jobs["05000000"].tails[DRIVER_TAIL + "raysubmit_a"].gone_at is not None
    assert console._jobs["05000000"].driver_fact.status == "SUCCEEDED"
    assert console.snapshot().record_errors["too_many_streams"] == 1
    console.close()
