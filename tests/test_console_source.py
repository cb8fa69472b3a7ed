"""The console source against a real Ray head: a verl-named trainer actor prints its config
and its steps as verl's console logger does, and the exporter, given only the Ray address,
diagnoses the job exactly as it diagnoses the file logger's JSONL of the same steps.

Real parts: Ray 2.60's head, its state API's log stream, a real actor's stdout. The lines the
actor prints are verl's format (`concat_dict_to_str`: `step:N - key:value`, values as NumPy 2
prints them), rendered here from a sample log (tests/test_console_reader.py checks the
rendering against verl's own function).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlhf_exporter.join.names import JobNames
from rlhf_exporter.sources.console import ConsoleSource
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds

from .support.procs import wait_until

ray = pytest.importorskip("ray")
from .support.ray_head import connected_head  # noqa: E402

TRACES = Path(__file__).parent / "fixtures" / "traces"
TRACE = TRACES / "regression_update_v1.jsonl"
TH = load_thresholds(None)


def printed(value: Any) -> str | None:
    """A value as verl prints it under NumPy 2 (None: verl prints no such value)."""
    if isinstance(value, bool) or value is None or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return f"np.int64({value})"
    return f"np.float64({value!r})" if math.isfinite(value) else f"np.float64({value})"


def console_lines(path: Path, project: str, experiment: str) -> list[str]:
    """The trainer's stdout for a JSONL: its resolved config (pprint), then a line a step."""
    out = [
        "{'actor_rollout_ref': {'actor': {'strategy': 'fsdp2'},",
        "                       'rollout': {'name': 'vllm'}},",
        f" 'trainer': {{'experiment_name': {experiment!r},",
        "             'logger': ['console', 'wandb'],",
        f"             'project_name': {project!r},",
        "             'total_epochs': 15}}",
    ]
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        parts = [f"step:{rec['step']}"]
        for k, v in rec["data"].items():
            text = printed(v)
            if text is not None:
                parts.append(f"{k}:{text}")
        out.append(" - ".join(parts))
        out.append("INFO 12-05 08:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0")
    return out


@pytest.fixture(scope="module")
def head():
    with connected_head("console-source", grace=2.0) as h:
        yield h


class _Printer:
    def say(self, lines: list[str]) -> int:
        for line in lines:
            print(line, flush=True)
        return len(lines)


def trainer_class(name: str = "TaskRunner"):
    """An actor class Ray reports as `name` (a verl trainer class) that prints lines."""
    cls = type(name, (_Printer,), {"__qualname__": name})
    return ray.remote(num_cpus=0)(cls)


def sources(head, tmp_path: Path, names: JobNames | None = None):
    ray_src = RaySource(head.dashboard_url, interval=0.5, timeout=10.0)
    console = ConsoleSource(TH, ray_src, head.dashboard_url, interval=0.2, names=names)
    return ray_src, console


def poll_until(ray_src, console, ok, timeout: float = 60.0):
    def step() -> bool:
        ray_src.poll_once()
        console.poll_once()
        return ok()

    wait_until(step, timeout, 0.3, what="the console source's jobs")


def file_job(tmp_path: Path, project: str, experiment: str):
    root = tmp_path / "files"
    (root / project).mkdir(parents=True)
    (root / project / f"{experiment}.jsonl").write_bytes(TRACE.read_bytes())
    src = VerlFileSource(TH, [root])
    src.poll_once()
    ((_, w),) = src._watched.items()
    return w.job


def comparable(job) -> dict[str, Any]:
    return {
        "labels": job.labels,
        "steps": job.steps,
        "verdicts": job.verdict_steps,
        "reasons": job.reason_steps,
        "changes": job.change_steps,
        "regressions": job.regression_steps,
        "last": job.last.to_json() if job.last else None,
        "history": list(job._history),  # every step's point: verdict, change, shares
    }


def test_a_job_that_only_prints_is_diagnosed_as_its_jsonl(head, tmp_path):
    """Started mid-job (40 steps printed before the exporter looks), the source recovers the
    job's name and whole history, then follows it; every count equals the file's."""
    lines = console_lines(TRACE, "proj-a", "exp-a")
    actor = trainer_class().remote()
    half = len(lines) - 20
    ray.get(actor.say.remote(lines[:half]))
    ray_src, console = sources(head, tmp_path)
    poll_until(ray_src, console, lambda: any(cj.job for cj in console._jobs.values()))
    ray.get(actor.say.remote(lines[half:]))
    expected = comparable(file_job(tmp_path, "proj-a", "exp-a"))

    def done() -> bool:
        jobs = [cj.job for cj in console._jobs.values() if cj.job is not None]
        return bool(jobs) and jobs[0].steps == expected["steps"]

    poll_until(ray_src, console, done)
    ((cj,),) = [[cj for cj in console._jobs.values() if cj.job is not None]]
    assert comparable(cj.job) == expected
    # exported once its stream has been quiet for CAUGHT_UP_QUIET: its backlog is read
    poll_until(ray_src, console, lambda: console.snapshot().parts)
    assert console.snapshot().up
    (summary,) = console.jobs()
    assert summary["project"] == "proj-a" and summary["experiment"] == "exp-a"
    ray.kill(actor)


def test_a_cut_stream_is_read_again_without_counting_a_step_twice(head, tmp_path):
    lines = console_lines(TRACE, "proj-b", "exp-b")
    actor = trainer_class().remote()
    ray.get(actor.say.remote(lines[:30]))
    ray_src, console = sources(head, tmp_path)
    poll_until(ray_src, console, lambda: any(cj.job for cj in console._jobs.values()))
    for cj in console._jobs.values():  # the dashboard restarts: every stream is cut
        for tail in cj.tails.values():
            tail.stream.close()
    ray.get(actor.say.remote(lines[30:]))
    expected = comparable(file_job(tmp_path, "proj-b", "exp-b"))
    jobs = lambda: [cj.job for cj in console._jobs.values() if cj.job is not None]  # noqa: E731
    poll_until(ray_src, console, lambda: jobs()[0].steps >= expected["steps"])
    time.sleep(1.0)
    ray_src.poll_once()
    console.poll_once()
    assert comparable(jobs()[0]) == expected
    errors = Counter(console.snapshot().errors)
    assert sum(n for r, n in errors.items() if r.startswith("stream_")) >= 1
    ray.kill(actor)


def test_a_file_of_the_same_job_wins_and_nothing_is_counted_twice(head, tmp_path):
    names = JobNames()
    root = tmp_path / "root"
    (root / "proj-c").mkdir(parents=True)
    (root / "proj-c" / "exp-c.jsonl").write_bytes(TRACE.read_bytes())
    files = VerlFileSource(TH, [root], names=names)
    files.poll_once()
    actor = trainer_class().remote()
    ray.get(actor.say.remote(console_lines(TRACE, "proj-c", "exp-c")))
    ray_src, console = sources(head, tmp_path, names)
    poll_until(ray_src, console, lambda: any(cj.yielded for cj in console._jobs.values()))
    assert not console.snapshot().parts
    assert all(t.stream is None for cj in console._jobs.values() for t in cj.tails.values())
    ray.kill(actor)


def own_job_trainer(head, name: str):
    """A trainer actor in a Ray job of its own: a driver connects, starts it (detached,
    named) and leaves; this module's driver connects again and holds it by name."""
    ray.shutdown()
    ray.init(address=head.gcs_address, namespace="console-source", log_to_driver=False,
             configure_logging=False)  # fmt: skip
    job_id = ray.get_runtime_context().get_job_id()
    trainer_class().options(name=name, lifetime="detached").remote()
    ray.shutdown()
    ray.init(address=head.gcs_address, namespace="console-source", log_to_driver=False,
             configure_logging=False)  # fmt: skip
    return ray.get_actor(name), job_id


def live_jobs(console) -> dict[tuple[str, str], Any]:
    return {cj.job.labels: cj.job for cj in console._jobs.values() if cj.job is not None}


def test_a_live_job_printing_another_live_jobs_name_is_exported_apart(head, tmp_path):
    """Two Ray jobs print the same project and experiment: the first keeps the name, the
    second is exported as `<experiment>@<its Ray job id>`, each with its own steps, and the
    claim is counted (name_claimed)."""
    lines = console_lines(TRACE, "proj-d", "exp-d")
    first, _ = own_job_trainer(head, "claim-1")
    ray.get(first.say.remote(lines[:20]))
    ray_src, console = sources(head, tmp_path)
    poll_until(ray_src, console, lambda: ("proj-d", "exp-d") in live_jobs(console))
    second, second_job = own_job_trainer(head, "claim-2")
    ray.get(second.say.remote(lines))
    claimed = ("proj-d", f"exp-d@{second_job}")
    poll_until(ray_src, console, lambda: claimed in live_jobs(console)
               and live_jobs(console)[claimed].steps == 46)  # fmt: skip
    jobs = live_jobs(console)
    assert jobs[("proj-d", "exp-d")].steps < 46  # the first job's own steps only
    assert console.snapshot().record_errors["name_claimed"] == 1
    for name in ("claim-1", "claim-2"):  # handles of an earlier connection are void
        ray.kill(ray.get_actor(name))


def test_the_same_name_again_after_its_job_ended_is_a_new_run(head, tmp_path):
    """A job resubmitted under the same name (a new Ray job once the first one's trainer is
    gone): its steps are the same job's next run, not a claimed name."""
    lines = console_lines(TRACE, "proj-e", "exp-e")
    first, _ = own_job_trainer(head, "again-1")
    ray.get(first.say.remote(lines[:30]))
    ray_src, console = sources(head, tmp_path)
    poll_until(ray_src, console, lambda: ("proj-e", "exp-e") in live_jobs(console))
    ray.kill(first)
    poll_until(ray_src, console, lambda: all(cj.ended_at for cj in console._jobs.values()),
               timeout=90)  # fmt: skip
    before = live_jobs(console)[("proj-e", "exp-e")].steps
    second, _ = own_job_trainer(head, "again-2")
    ray.get(second.say.remote(lines))  # prints step 1 again
    poll_until(ray_src, console, lambda: (job := live_jobs(console).get(("proj-e", "exp-e")))
               is not None and job.run == 1 and job.steps == before + 46)  # fmt: skip
    assert set(live_jobs(console)) == {("proj-e", "exp-e")}
    assert console.snapshot().record_errors.get("name_claimed", 0) == 0
    ray.kill(second)


def test_a_flood_from_one_job_never_stops_another(head, tmp_path):
    """One job prints megabytes without a newline, binary and invented step lines; another
    job's steps are all exported meanwhile, and the flood costs at most max_line per line."""
    flood, _ = own_job_trainer(head, "flood")
    junk = ["x" * (3 << 20), "\x00\x01\xfe binary \x1b[31m" * 1000,
            "step:7 - timing_s/step:np.float64(1e308) - " + " - ".join(
                f"k{i}:np.float64({i})" for i in range(10_000))]  # fmt: skip
    ray.get(flood.say.remote(junk * 3))
    quiet, _ = own_job_trainer(head, "quiet")
    ray.get(quiet.say.remote(console_lines(TRACE, "proj-f", "exp-f")))
    ray_src = RaySource(head.dashboard_url, interval=0.5, timeout=10.0)
    console = ConsoleSource(TH, ray_src, head.dashboard_url, interval=0.2, max_line=64 << 10)
    expected = comparable(file_job(tmp_path, "proj-f", "exp-f"))
    # ~10 MB of flood through Ray's agent first: generous on a loaded machine
    # the two jobs' streams are read apart: wait for the flood's long lines to be counted too
    poll_until(ray_src, console, lambda: (job := live_jobs(console).get(("proj-f", "exp-f")))
               is not None and job.steps == expected["steps"]
               and console.snapshot().record_errors.get("too_long", 0) >= 3, timeout=240)  # fmt: skip
    assert comparable(live_jobs(console)[("proj-f", "exp-f")]) == expected
    rejected = console.snapshot().record_errors
    assert rejected["too_long"] >= 3, rejected
    for cj in console._jobs.values():
        for tail in cj.tails.values():
            assert tail.reader.pending_bytes <= 64 << 10
    for name in ("flood", "quiet"):
        ray.kill(ray.get_actor(name))


def test_a_log_truncated_in_place_is_read_anew(head, tmp_path):
    """Ray's stream follows the file at its offset, so a file truncated in place (logrotate's
    copytruncate; Ray appends) would never be read again and the job would look stalled:
    the quiet stream's end is compared with the file's last line, and read anew."""
    lines = console_lines(TRACE, "proj-g", "exp-g")
    actor = trainer_class().remote()
    ray.get(actor.say.remote(lines[:70]))
    ray_src = RaySource(head.dashboard_url, interval=0.5, timeout=10.0)
    console = ConsoleSource(TH, ray_src, head.dashboard_url, interval=0.2, stale_after=1.0)
    poll_until(ray_src, console, lambda: ("proj-g", "exp-g") in live_jobs(console))
    (out,) = [p for p in head.temp_dir.glob("session_latest/logs/worker-*.out")
              if b"'proj-g'" in p.read_bytes()]  # fmt: skip
    before = out.stat().st_size
    out.write_bytes(b"")  # truncated in place
    ray.get(actor.say.remote(lines[70:]))
    assert out.stat().st_size < before  # Ray's stream waits past the new end
    expected = comparable(file_job(tmp_path, "proj-g", "exp-g"))
    poll_until(ray_src, console, lambda: live_jobs(console)[("proj-g", "exp-g")].steps
               == expected["steps"])  # fmt: skip
    assert comparable(live_jobs(console)[("proj-g", "exp-g")]) == expected
    assert console.snapshot().errors["stream_stale"] == 1
    ray.kill(actor)


def test_ended_jobs_are_kept_up_to_a_bound_the_oldest_forgotten_first():
    """Many short jobs a day: ended jobs are kept `job_expiry`, and at most ENDED_KEPT x
    max_streams of them; the oldest ended go first, counted (ended_job_forgotten)."""
    from rlhf_exporter.join.ports import TrainerActor
    from rlhf_exporter.sources.console import ENDED_KEPT, ConsoleJob

    class NoTrainers:  # one live trainer, of Ray job ffffffff (its stream cannot open)
        trainers_seen = True

        def trainer_actors(self):
            return {"a1": TrainerActor("a1", "TaskRunner", "ffffffff", "", None)}

        def submission_fact(self, job_id):
            return None

    console = ConsoleSource(TH, NoTrainers(), "http://127.0.0.1:9", max_streams=2)
    kept = ENDED_KEPT * 2
    for i in range(kept + 3):
        ended = time.time() - 100 + i  # within job_expiry
        cj = ConsoleJob(f"{i:08x}", "", None, ended_at=ended, last_change=ended)
        cj.job = console.new_job("p", f"e{i}")
        console._jobs[cj.job_id] = cj
        console._labels[cj.job.labels] = cj.job_id
    console.poll_once()  # the live job: running, never forgotten
    left = sorted(console._jobs)
    assert len(left) == kept + 1 and "ffffffff" in left
    assert [f"{i:08x}" for i in range(3)] == sorted(
        set(f"{i:08x}" for i in range(kept + 3)) - set(left)
    )
    assert ("p", "e0") not in console._labels and ("p", f"e{kept + 2}") in console._labels
    assert console.snapshot().record_errors["ended_job_forgotten"] == 3


def test_a_fully_async_trainer_printing_two_lines_a_step_is_diagnosed_as_its_jsonl(head, tmp_path):
    """Decision table v5 section 1 through the console route: verl <= 0.7's fully-async
    recipe prints each step in two lines (`timing_s/step` first, `param_sync` after); the
    console source holds each step until it is complete, as the file source does with the
    same records as JSONL."""
    from tests.test_two_record_steps import recipe

    records = recipe(24)
    jsonl = tmp_path / "async.jsonl"
    jsonl.write_text("".join(json.dumps({"step": r.step, "data": r.data}) + "\n" for r in records))

    lines = console_lines(jsonl, "proj-h", "exp-h")
    actor = trainer_class("FullyAsyncTrainer").remote()
    ray.get(actor.say.remote(lines))
    root = tmp_path / "files" / "proj-h"
    root.mkdir(parents=True)
    (root / "exp-h.jsonl").write_bytes(jsonl.read_bytes())
    files = VerlFileSource(TH, [tmp_path / "files"])
    files.poll_once()
    ((_, w),) = files._watched.items()
    expected = comparable(w.job)
    ray_src, console = sources(head, tmp_path)
    poll_until(ray_src, console, lambda: (job := live_jobs(console).get(("proj-h", "exp-h")))
               is not None and job.steps == expected["steps"])  # fmt: skip
    assert comparable(live_jobs(console)[("proj-h", "exp-h")]) == expected
    ray.kill(actor)
