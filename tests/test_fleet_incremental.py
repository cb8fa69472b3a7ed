"""Fleet scale, in process: a new step of one job costs that job's work, not the fleet's.

The sources publish each job's samples as its own tuple (`Snapshot.parts`) and never copy
every job's samples into one flat tuple; the verl source rebuilds the landing page's summary
of the jobs that changed only. Each test counts the work (calls, cache misses), not time.
"""

from __future__ import annotations

import gzip
import itertools

import pytest

from rlhf_exporter.demo.simulator import REGIMES, encode, records
from rlhf_exporter.job.state import Job
from rlhf_exporter.metrics.exposition import Exposition
from rlhf_exporter.metrics.families import families
from rlhf_exporter.sources.push import PushSource
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds

JOBS = 40


@pytest.fixture(scope="module")
def th():
    return load_thresholds()


class Fleet:
    """JOBS verl files under one root, each with a few steps; `step(i)` appends one."""

    def __init__(self, root):
        regimes = list(REGIMES.values())
        self.paths, self.streams = [], []
        for i in range(JOBS):
            path = root / f"team{i % 4}" / f"exp{i:03d}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            stream = records([(regimes[i % len(regimes)], 10**6)], seed=i, validation=False)
            path.write_bytes(b"".join(encode(next(stream)) for _ in range(4)))
            self.paths.append(path)
            self.streams.append(stream)

    def step(self, i: int) -> None:
        with open(self.paths[i], "ab") as f:
            f.write(encode(next(self.streams[i])))


def test_a_new_step_summarises_one_job_and_copies_no_samples(tmp_path, th, monkeypatch):
    calls = {"summary": 0}
    real = Job.summary

    def counted(self):
        calls["summary"] += 1
        return real(self)

    monkeypatch.setattr(Job, "summary", counted)
    fleet = Fleet(tmp_path)
    src = VerlFileSource(th, [tmp_path])
    first = src.poll_once()
    assert len(first.parts) == JOBS and calls["summary"] == JOBS
    assert [s.name for s in first.rest] == ["rlhf_exporter_jobs"]  # the jobs' samples: parts

    fleet.step(7)
    snap = src.poll_once()
    assert calls["summary"] == JOBS + 1  # only the job with a new step
    assert src.stats["summaries_built"] == JOBS + 1
    changed = [i for i, (a, b) in enumerate(zip(first.parts, snap.parts)) if a is not b]
    assert len(changed) == 1  # every other job's tuple is the same object
    assert [s.name for s in snap.rest] == ["rlhf_exporter_jobs"]

    # the summaries are those of the jobs as they are now
    fresh = {
        (j["project"], j["experiment"]): {**j}
        for j in (
            {**w.job.summary(), "source": str(w.path), "framework": w.framework}
            for w in src._watched.values()
        )
    }
    calls["summary"] = 0
    assert {(j["project"], j["experiment"]): j for j in src.jobs()} == fresh
    assert calls["summary"] == 0  # reading the landing page builds nothing

    src.poll_once()  # nothing new: nothing summarised, the same snapshot contents
    assert calls["summary"] == 0

    # no consumer flattens the jobs' samples: the exposition and a from-scratch render
    ex = Exposition([src.snapshot])
    ex.render("text/plain")
    families([src.snapshot()])
    assert "samples" not in vars(src.snapshot())


def test_push_publishes_each_job_as_its_own_tuple(th):
    push = PushSource(th)
    for i, step in itertools.product(range(3), (1, 2)):
        body = encode({"project": "p", "experiment": f"e{i}", "step": step, "data": {}})
        assert push.handle(None, str(len(body)), lambda n, b=body: b[:n]).status == 200
    before = push.snapshot()
    assert len(before.parts) == 3 and [s.name for s in before.rest] == ["rlhf_exporter_jobs"]
    body = encode({"project": "p", "experiment": "e1", "step": 3, "data": {}})
    assert push.handle(None, str(len(body)), lambda n, b=body: b[:n]).status == 200
    after = push.snapshot()
    assert after.parts[0] is before.parts[0] and after.parts[2] is before.parts[2]
    assert after.parts[1] is not before.parts[1]
    steps = {s.labels: s.value for s in after.samples if s.name == "rlhf_step"}
    assert steps == {("p", "e0"): 2.0, ("p", "e1"): 3.0, ("p", "e2"): 2.0}


@pytest.mark.parametrize("direct", [False, True], ids=["prometheus_client", "direct"])
def test_a_new_step_encodes_only_the_families_it_changed(direct):
    """A job's new tuple whose families mostly hold the same values (new Sample objects, equal
    values) re-encodes the changed families only through prometheus_client, and that job
    only when the lines are written directly (issue 37: writing a job costs less than hashing
    its families); the body stays what a from-scratch render gives, in both formats."""
    from prometheus_client.exposition import choose_encoder

    from rlhf_exporter.metrics.exposition import encode as encode_families
    from rlhf_exporter.metrics.snapshot import Sample, Snapshot

    def part(project: str, step: int) -> tuple[Sample, ...]:
        j = (project, "e")
        return (
            Sample("rlhf_step", j, float(step)),
            Sample("rlhf_run", j, 0.0),
            *(Sample("rlhf_group_seconds_total", j + (g,), 5.0) for g in ("generate", "train")),
        )

    snaps = [Snapshot("verl", True, rest=(), parts=(part("a", 1), part("b", 1)))]
    ex = Exposition([lambda: snaps[0]], direct_lines=direct)
    formats = ("text/plain", "application/openmetrics-text;version=1.0.0")
    for accept in formats:
        ex.render(accept)
    encoded, hits = ex.stats["samples_encoded"], ex.stats["family_hits"]
    snaps[0] = Snapshot("verl", True, rest=(), parts=(part("a", 2), snaps[0].parts[1]))
    for accept in formats:
        body, _, _ = ex.render(accept)
        encoder, ctype = choose_encoder(accept)
        eof = b"# EOF\n" if "openmetrics" in ctype else b""
        assert body == encode_families(encoder, families(snaps)) + eof
    if direct:  # job a's 4 samples, once for both formats (they share sample lines)
        assert ex.stats["samples_encoded"] - encoded == 4
        assert ex.stats["direct_fragments"] >= 2 and ex.stats["family_hits"] == hits == 0
        return
    # rlhf_step of a, once: text and OpenMetrics write the same sample lines (shared)
    assert ex.stats["samples_encoded"] - encoded == 1
    assert ex.stats["family_hits"] - hits == 2  # a's rlhf_run and group seconds


def test_the_warm_pass_builds_a_body_only_when_the_next_scrape_is_near():
    """Scraped every 10 s, with jobs changing every second: between scrapes the warm pass
    encodes the changed jobs only; the body (joined, deflated, checksummed) is built just
    before the scrape, which then finds it ready."""
    from rlhf_exporter.metrics import exposition as mod
    from rlhf_exporter.metrics.snapshot import Sample, Snapshot
    from rlhf_exporter.metrics.warm import BUILD_AHEAD

    def part(project: str, step: int) -> tuple[Sample, ...]:
        return (Sample("rlhf_step", (project, "e"), float(step)),)

    now = [0.0]
    snaps = [Snapshot("verl", True, rest=(), parts=(part("a", 1), part("b", 1)))]
    ex = mod.Exposition([lambda: snaps[0]], clock=lambda: now[0])
    om = "application/openmetrics-text;version=1.0.0"
    ex.render(om, want_gzip=True)
    now[0] = 10.0
    ex.render(om, want_gzip=True)  # the scrape interval is now known: 10 s
    renders, bodies = ex.stats["renders"], ex.stats["gzip_bodies"]
    for t in range(11, 20):
        now[0] = float(t)
        snaps[0] = Snapshot("verl", True, rest=(), parts=(part("a", t), snaps[0].parts[1]))
        encoded = ex.stats["samples_encoded"]
        ex.warm()
        assert ex.stats["samples_encoded"] == encoded + 1  # the change, encoded at once
        if t <= 17:  # 20 - BUILD_AHEAD - 2 x the (tiny) build time: not near yet
            assert ex.stats["renders"] == renders and ex.stats["gzip_bodies"] == bodies
    assert BUILD_AHEAD == 2.0 and ex.stats["prepares"] == 7  # t = 11 .. 17
    assert ex.stats["renders"] == renders + 2  # t = 18 and 19: built ahead of the scrape
    assert ex.stats["gzip_bodies"] == bodies + 2
    stats = dict(ex.stats)
    now[0] = 20.0
    body, _, gz = ex.render(om, want_gzip=True)
    assert gz and b'rlhf_step{experiment="e",project="a"} 19.0' in gzip.decompress(body)
    assert ex.stats == stats  # the scrape found its bytes ready


def test_the_former_samples_keyword_still_builds_the_same_snapshot():
    """Callers written against `Snapshot(..., samples=every sample, parts=...)` get the
    same snapshot as with `rest=` (the parts' samples cut off the front)."""
    from dataclasses import replace

    from rlhf_exporter.metrics.snapshot import Sample, Snapshot

    parts = ((Sample("rlhf_step", ("a", "e"), 1.0),), (Sample("rlhf_step", ("b", "e"), 2.0),))
    jobs = Sample("rlhf_exporter_jobs", ("verl",), 2.0)
    old = Snapshot("verl", True, created=5.0, parts=parts, samples=(*parts[0], *parts[1], jobs))
    assert old == Snapshot("verl", True, created=5.0, parts=parts, rest=(jobs,))
    assert old.samples == (*parts[0], *parts[1], jobs) and old.rest == (jobs,)
    bare = Snapshot("adhoc", True, samples=(jobs,))
    assert bare.rest == (jobs,) and bare.samples is bare.rest
    assert list(replace(old, up=False, samples=(), parts=()).series()) == []
