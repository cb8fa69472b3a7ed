"""Issue 32: real verl 0.9.1 jobs on CPU, watched by the sidecar as the chart runs it.

verl's own `python -m verl.trainer.main_ppo` (GRPO on a random 0.35M-parameter Qwen2, FSDP2,
vLLM-CPU rollout through verl's async server, verl's weight sync) is submitted with
`ray job submit` to one real Ray head (tests/real_verl/harness.py); `rlhf-exporter serve` runs
with the head pod sidecar's rendered environment, reading verl's `file` logger root and the
Ray dashboard; a real Prometheus scrapes it and evaluates the shipped rules, time-scaled
(SCALE). Three jobs, one after another on the one head:

- `legacy` (`trainer.use_v1=False`) and `v1` (the default V1 trainer, TransferQueue): normal
  ends. Every logged step is diagnosed by serve as `diagnose` diagnoses the file afterwards;
  no `timing_s/` key is unknown to the project; the job's actors have roles by their real
  classes; the rollout server is found by the shipped discovery and its own /metrics agree
  with what it did; the state reads `finished` and nothing pages.
- `hang`: the trainer's process (verl's colocated WorkerDict) is SIGSTOPped after the first
  step: RLHFJobStalled pages and stays firing while it is stopped, and the sidecar's stack
  round (issue 39; the head has RAY_DASHBOARD_ENABLE_PROFILING=1 and .venv-verl's py-spy)
  names the stopped trainer and what the others wait on, on the stacks API, on `/` and in
  the page's annotation; then it is SIGKILLed (a crash): the state reads `failed` and
  RLHFJobFailed pages exactly once.

Each run's real log, Ray answers and vLLM pages are written under the test's tmp dir and,
with REAL_VERL_WRITE_FIXTURES=1, into tests/fixtures/real_verl/ (replayed by
tests/test_real_verl_fixtures.py without verl). Skipped, saying why, under SKIP_REAL_VERL=1
or without .venv-verl (scripts/real-verl-env.sh).
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from rlhf_exporter.diagnosis import BatchDiagnoser
from rlhf_exporter.diagnosis.change import CONTRACT_NONE, STEADY
from rlhf_exporter.diagnosis.engines import ENGINE_REASONS
from rlhf_exporter.diagnosis.thresholds import seconds
from rlhf_exporter.diagnosis.windows import timer_name
from rlhf_exporter.job.cleaning import known_timers
from rlhf_exporter.render import rules as rules_mod
from rlhf_exporter.sources.roles import RoleMap
from rlhf_exporter.sources.verl_reader import RecordReader
from rlhf_exporter.thresholds_file import load_thresholds
from tests.real_verl import harness
from tests.support.procs import exporter_cmd
from tests.support.prometheus import Prometheus

_WHY = harness.unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.prometheus,
    pytest.mark.real_verl,
    *([pytest.mark.skip(reason=_WHY)] if _WHY else []),
]
SCALE = 1 / 20  # stall_min 10m -> 30 s, stall_for 2m -> 6 s, the failed page's for: 1m -> 3 s
JOB_TIMEOUT = 1500.0  # seconds for one job on a busy 2-core machine (alone: ~150 s)
# Ray's own actors, not the job's: the Jobs API's supervisor of each submission
NOT_THE_JOBS = {"JobSupervisor"}
WRITE_FIXTURES = os.environ.get("REAL_VERL_WRITE_FIXTURES") == "1"


class AlertLog:
    """Every poll of Prometheus's firing alerts (twice a second, in a thread): (t, labels)."""

    def __init__(self, prom: Prometheus):
        self.prom = prom
        self.polls: list[tuple[float, list[dict]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                firing = [a["labels"] for a in self.prom.alerts() if a["state"] == "firing"]
            except (requests.RequestException, KeyError, ValueError):
                continue
            self.polls.append((time.time(), firing))

    def firing(self, alertname: str, experiment: str, since: float = 0.0) -> bool:
        for t, alerts in reversed(self.polls):
            if t >= since:
                return any(
                    a.get("alertname") == alertname and a.get("experiment") == experiment
                    for a in alerts
                )
        return False

    def episodes(self, experiment: str, since: float = 0.0) -> Counter[str]:
        """alertname -> how many times it started firing for the job (a page each)."""
        out: Counter[str] = Counter()
        before: set[str] = set()
        for t, alerts in self.polls:
            if t < since:
                continue
            now = {a["alertname"] for a in alerts if a.get("experiment") == experiment}
            out.update(now - before)
            before = now
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """One Ray head, the head sidecar as the chart renders it, Prometheus with the shipped
    rules (time-scaled); all stopped at the end, also on failure."""
    tmp = tmp_path_factory.mktemp("real-verl")
    th = load_thresholds()
    cluster = side = cside = prom = alerts = None
    try:
        cluster = harness.Cluster(tmp)
        # the sidecar's stall limit (its job view, the stacks of issue 39) time-scaled as
        # the rules are: stall_min 10m -> 30 s
        scaled = tmp / "thresholds.yaml"
        stall_min = th.alerts.get("stall_min", "10m")
        scaled.write_text(f"alerts:\n  stall_min: {seconds(stall_min) * SCALE:g}s\n")
        side = harness.head_sidecar(tmp, cluster, {"RLHF_EXPORTER_THRESHOLDS": str(scaled)})
        # issue 47: the same sidecar with no verl file (no logs mount): it reads each job
        # from what its trainer actor prints, streamed from Ray by actor id (the console
        # source); Prometheus scrapes only the first (one page per job). Its engine source
        # is off: a rollout step's reason is then the records' alone, as diagnose reads
        # them (the engine evidence that refines it is the same on either route)
        cside = harness.head_sidecar(
            tmp,
            cluster,
            {"RLHF_EXPORTER_THRESHOLDS": str(scaled), "RLHF_EXPORTER_ENGINES": "false"},
            files=False,
            name="sidecar-console",
        )
        rule_dir = tmp / "rules"
        rule_dir.mkdir()
        files = []
        for rel, text in rules_mod.rule_files(th, SCALE).items():
            (rule_dir / Path(rel).name).write_text(text)
            files.append(rule_dir / Path(rel).name)
        prom = Prometheus(tmp / "prom", [side.url.removeprefix("http://")], files, "1s")
        alerts = AlertLog(prom)
        yield SimpleNamespace(
            cluster=cluster, side=side, cside=cside, prom=prom, alerts=alerts, tmp=tmp, th=th
        )
    finally:
        for part in (alerts, prom, side, cside, cluster):
            if part is not None:
                part.stop() if hasattr(part, "stop") else part.terminate()


def _records(path: Path) -> list:
    return list(RecordReader().feed(path.read_bytes())) if path.exists() else []


def _actor_rows(rec: harness.Recorder) -> dict[str, dict]:
    """Every actor the recorder saw ALIVE, by actor id (the fields the exporter reads)."""
    out: dict[str, dict] = {}
    for snap in rec.ray_answers:
        rows = snap.get("/api/v0/actors?state=ALIVE&detail=1")
        if isinstance(rows, list):
            for row in rows:
                out[row["actor_id"]] = {
                    k: row.get(k) for k in ("actor_id", "class_name", "name", "job_id", "state")
                }
    return out


def key_inventory(records: list) -> dict[str, list[str]]:
    """Every key the real records hold, by what the project makes of it: `timers` (windows
    it knows), `agent_loop` (per-sample statistics), `unknown_timers` (the canary), `other`
    (metrics it passes by: losses, lengths, perf/*)."""
    known = known_timers(load_thresholds())
    out: dict[str, set[str]] = {
        "timers": set(),
        "agent_loop": set(),
        "unknown_timers": set(),
        "other": set(),
    }
    for key in {k for r in records for k in r.data}:
        name = timer_name(key)
        if name is not None:
            out["timers" if name in known else "unknown_timers"].add(key)
        elif key.startswith("timing_s/"):
            out["agent_loop"].add(key)
        else:
            out["other"].add(key)
    return {k: sorted(v) for k, v in out.items()}


def _save(run: SimpleNamespace, out: Path) -> None:
    """The run's evidence, as the fast suite replays it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{run.job.experiment}.jsonl").write_bytes(run.log.read_bytes())
    harness.write_json(out / "ray_actors.json", sorted(run.actors.values(), key=str))
    jobs = [s["/api/jobs/"] for s in run.rec.ray_answers if isinstance(s.get("/api/jobs/"), list)]
    mine = [j for j in (jobs[-1] if jobs else []) if j.get("submission_id") == run.sid]
    harness.write_json(out / "ray_jobs.json", mine)
    for i, page in enumerate(run.rec.pages):
        (out / f"vllm_metrics_{i}.txt").write_text(page)
    with open(out / "vllm_series.jsonl", "w") as f:
        for s in run.rec.engine_lines:
            f.write(json.dumps(s) + "\n")
    harness.write_json(out / "expected.json", run.expected)
    harness.write_json(out / "keys.json", key_inventory(run.records))
    harness.write_json(
        out / "measured.json",
        {"seconds": round(run.t_end - run.t0, 1), "peak_pss_mib": round(run.rec.peak_pss_mib)},
    )
    # issue 47: what verl printed, as Ray keeps it: the driver's log (the entrypoint's output
    # with the actors' lines Ray forwards to it) and the trainer actor's own stdout file
    # (what the console source streams by actor id); the real bytes, nothing stripped
    (out / "driver.log").write_bytes(run.driver_bytes)
    (out / "trainer.out").write_bytes(run.trainer_bytes)


def run_job(stack, job: harness.Job, during=None, end=("SUCCEEDED",)) -> SimpleNamespace:
    """Submit `job`, record it, call `during(run)` while it runs, wait for its end."""
    cluster, side = stack.cluster, stack.side
    rec = harness.Recorder(cluster, stack.tmp / job.experiment / "rec").start()
    t0 = time.time()
    sid = cluster.submit(job)
    run = SimpleNamespace(job=job, sid=sid, rec=rec, t0=t0, log=cluster.log_file(job))
    try:
        if during is not None:
            during(run)
        run.status = cluster.wait(sid, end, JOB_TIMEOUT)
        run.t_end = time.time()
        state = "finished" if run.status == "SUCCEEDED" else "failed"
        lab = {"project": harness.PROJECT, "experiment": job.experiment}
        side.wait_for(
            lambda: side.value("rlhf_job_state", state=state, **lab) == 1.0,
            90,
            f"{job.experiment} reads {state}",
        )
        run.samples = side.samples()
        _read_console_sidecar(stack, run, state)
    finally:
        rec.stop()
        run.driver_log = cluster.logs(sid)
        (stack.tmp / job.experiment / "driver.log").write_text(run.driver_log)
    run.driver_bytes = cluster.driver_log(sid)
    run.trainer_path, run.trainer_bytes = cluster.trainer_out(cluster.job(sid).get("job_id"))
    run.records = _records(run.log)
    run.actors = _actor_rows(rec)
    run.diagnoses = list(BatchDiagnoser(stack.th).diagnose(run.records))
    run.expected = {
        "submission": run.status,
        "steps": len(run.records),
        "verdicts": dict(Counter(d.verdict for d in run.diagnoses)),
        "reasons": dict(Counter(f"{d.verdict}/{d.reason}" for d in run.diagnoses if d.reason)),
        "roles": {
            a["class_name"]: RoleMap.default().role(a["class_name"], a["name"] or "")
            for a in run.actors.values()
        },
        "versions": harness.env_summary(),
        # what the sidecar said (engine evidence may refine a rollout step's reason)
        "sidecar_reasons": {
            f"{dict(k)['verdict']}/{dict(k)['reason']}": v
            for (n, k), v in run.samples.items()
            if n == "rlhf_bottleneck_reason_steps_total"
            and dict(k).get("experiment") == job.experiment
            and v
        },
    }
    _save(run, stack.tmp / job.experiment / "fixture")
    if WRITE_FIXTURES:
        _save(run, harness.FIXTURES / job.experiment)
    return run


def _read_console_sidecar(stack, run, state: str) -> None:
    """Issue 47: wait until the sidecar with no verl file shows every step the file logged
    and the job's end, then keep what it exports (`/metrics`, `/api/v1/jobs`, the job's page);
    a failure is kept on `run.console_error` (the console tests report it; the file
    sidecar's tests do not depend on it)."""
    cside, exp = stack.cside, run.job.experiment
    lab = {"project": harness.PROJECT, "experiment": exp}
    n = len(_records(run.log))
    run.console_error = None
    try:
        cside.wait_for(
            lambda: (
                cside.value("rlhf_steps_total", **lab) == n
                and cside.value("rlhf_job_state", state=state, **lab) == 1.0
            ),
            120,
            f"the console sidecar shows {exp}'s {n} steps and reads {state}",
        )
    except Exception as exc:  # reported by the console tests
        run.console_error = f"{type(exc).__name__}: {exc}"
    run.console_samples = cside.samples()
    run.console_jobs = requests.get(cside.url + "/api/v1/jobs", timeout=10).json()["jobs"]
    page = requests.get(f"{cside.url}/jobs/{harness.PROJECT}/{exp}", timeout=10)
    run.console_page = page.text if page.ok else ""
    out = stack.tmp / exp / "console"
    harness.write_json(out / "jobs.json", run.console_jobs)
    (out / "page.html").write_text(run.console_page)
    (out / "sidecar.log").write_text(cside.output())


def _stall_annotation(prom: Prometheus, experiment: str) -> str | None:
    """The firing RLHFJobStalled's `where_it_hangs` annotation (None: not firing)."""
    for a in prom.alerts():
        lab, firing = a["labels"], a["state"] == "firing"
        if firing and (lab.get("alertname"), lab.get("experiment")) == (
            "RLHFJobStalled",
            experiment,
        ):
            return a["annotations"].get("where_it_hangs", "")
    return None


def _where_it_hangs(stack, run) -> None:
    """Issue 39: what the sidecar says of the stopped job once it pages: its stack round
    (`GET /api/v1/jobs/<p>/hang/stacks`), the `/` page and the page's annotation, kept on
    `run` and written under the test's tmp dir (hang/stacks.json)."""
    side, url = stack.side, f"{stack.side.url}/api/v1/jobs/{harness.PROJECT}/hang/stacks"

    def taken():
        r = requests.get(url, timeout=10)
        return r.json()["round"] if r.ok else None

    # the stall check runs every stacks_interval (15 s) once past the stall limit
    run.stacks = side.wait_for(taken, 120, "a stack round of the stalled job")
    run.front = requests.get(side.url + "/", timeout=10).text
    # Prometheus may fire from an evaluation before the round ("no stacks yet ...")
    run.annotation = side.wait_for(
        lambda: (a := _stall_annotation(stack.prom, "hang")) and not a.startswith("no stacks yet")
        and a,
        120,
        "the page's where_it_hangs names the round",
    )  # fmt: skip
    # Ray's unfinished tasks of the job as the stacks source reads them (the evidence of
    # what the TaskRunner's ray.get awaits)
    params = [("filter_keys", "state"), ("filter_predicates", "!="), ("filter_values", "FINISHED"),
              ("filter_keys", "state"), ("filter_predicates", "!="), ("filter_values", "FAILED"),
              ("detail", "1"), ("limit", "2000")]  # fmt: skip
    r = requests.get(f"{stack.cluster.url}/api/v0/tasks", params=params, timeout=30)
    tasks = r.json()["data"]["result"]["result"] if r.ok else r.text
    keep = ("name", "state", "worker_pid", "task_id", "parent_task_id", "job_id")
    run.tasks = [{k: t.get(k) for k in keep} for t in tasks] if isinstance(tasks, list) else tasks
    harness.write_json(
        stack.tmp / "hang" / "stacks.json",
        {"round": run.stacks, "annotation": run.annotation, "stopped_pid": run.stopped_pid,
         "tasks": run.tasks},
    )  # fmt: skip


def _value(run, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    found = [v for (n, lab), v in run.samples.items() if n == name and want <= lab]
    return sum(found) if found else None


@pytest.fixture(scope="module")
def legacy(stack):
    return run_job(stack, harness.Job("legacy", use_v1=False, steps=3))


@pytest.fixture(scope="module")
def v1(stack):
    return run_job(stack, harness.Job("v1", use_v1=True, steps=3))


@pytest.fixture(scope="module")
def hang(stack):
    """The trainer's process stopped after step 1 (a hang), later killed (a crash)."""
    alerts = stack.alerts

    def during(run):
        wait = time.monotonic() + JOB_TIMEOUT
        while not _records(run.log) and time.monotonic() < wait:
            time.sleep(0.5)
        pid = run.stopped_pid = stack.cluster.pid_of("WorkerDict")
        harness.signal_pid(pid, signal.SIGSTOP)
        run.stopped_at, run.steps_at_stop = time.time(), len(_records(run.log))
        try:
            stack.side.wait_for(
                lambda: alerts.firing("RLHFJobStalled", "hang"), 240, "RLHFJobStalled pages"
            )
            run.stalled_at = time.time()
            # a step the stopped trainer had already done its part of may still be logged
            # just after the stop: what must not advance is the log once the job pages
            run.steps_at_page = len(_records(run.log))
            _where_it_hangs(stack, run)  # issue 39: the stacks of the stopped job
            time.sleep(20)  # nothing resolves it while the process is stopped
            run.still_stalled = alerts.firing("RLHFJobStalled", "hang", since=time.time() - 1)
            run.steps_while_stopped = len(_records(run.log)) - run.steps_at_page
        finally:
            harness.signal_pid(pid, signal.SIGKILL)  # the crash (a stopped process dies too)
        run.killed_at = time.time()

    job = harness.Job("hang", use_v1=False, steps=400, overrides=("trainer.total_epochs=100",))
    run = run_job(stack, job, during=during, end=("FAILED",))
    stack.side.wait_for(lambda: alerts.firing("RLHFJobFailed", "hang"), 120, "RLHFJobFailed pages")
    time.sleep(10)  # a second page would show here
    run.pages = alerts.episodes("hang", since=run.t0)
    return run


# -- the normal ends ----------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["legacy", "v1"])
def test_every_step_diagnosed_as_diagnose_does(which, request):
    run = request.getfixturevalue(which)
    assert run.status == "SUCCEEDED"
    assert len(run.records) == 3, run.driver_log[-3000:]
    lab = {"project": harness.PROJECT, "experiment": which}
    assert _value(run, "rlhf_steps_total", **lab) == len(run.records)
    assert _value(run, "rlhf_step", **lab) == run.records[-1].step
    verdicts = Counter(d.verdict for d in run.diagnoses)
    for verdict in set(verdicts) | {"rollout", "balanced", "other"}:
        got = _value(run, "rlhf_bottleneck_steps_total", verdict=verdict, **lab) or 0.0
        assert got == verdicts[verdict], (verdict, got, verdicts)
    # reasons: diagnose's, except where the sidecar's engine evidence refined a `rollout`
    # step's reason (docs/engines.md): diagnose never sees engines
    reasons = Counter((d.verdict, d.reason) for d in run.diagnoses if d.reason)
    served = {
        (dict(key)["verdict"], dict(key)["reason"]): v
        for (n, key), v in run.samples.items()
        if n == "rlhf_bottleneck_reason_steps_total" and set(lab.items()) <= key and v
    }
    for verdict in {v for v, _ in reasons} | {v for v, _ in served}:
        mine = {r: c for (v, r), c in served.items() if v == verdict}
        theirs = {r: c for (v, r), c in reasons.items() if v == verdict}
        assert sum(mine.values()) == sum(theirs.values()), (verdict, mine, theirs)
        for r, c in mine.items():
            refined = verdict == "rollout" and r in ENGINE_REASONS
            assert c <= theirs.get(r, 0) or refined, (verdict, mine, theirs)
    last = run.diagnoses[-1]
    assert _value(run, "rlhf_bottleneck", verdict=last.verdict, **lab) == 1.0


@pytest.mark.parametrize("which", ["legacy", "v1"])
def test_no_timing_key_is_unknown(which, request, thresholds):
    """The canary for the next verl release: a `timing_s/` window the project does not know
    fails here (every key of the records is listed in the failure)."""
    run = request.getfixturevalue(which)
    known = known_timers(thresholds)
    keys = {k for r in run.records for k in r.data}
    unknown = sorted(k for k in keys if (name := timer_name(k)) is not None and name not in known)
    assert not unknown, f"unknown timers {unknown}; every key: {sorted(keys)}"


@pytest.mark.parametrize("which", ["legacy", "v1"])
def test_actors_by_role_with_real_classes(which, request):
    run = request.getfixturevalue(which)
    roles = RoleMap.default()
    by_class = {
        a["class_name"]: roles.role(a["class_name"], a["name"] or "") for a in run.actors.values()
    }
    short = {c.rsplit(".", 1)[-1]: r for c, r in by_class.items()}
    expected = {
        "WorkerDict": "trainer",
        "vLLMHttpServer": "rollout",
        "RewardLoopWorker": "reward",
        "GlobalRequestLoadBalancer": "rollout",
    }
    if which == "legacy":
        expected |= {"TaskRunner": "driver", "AgentLoopWorker": "agent_loop"}
    else:
        expected |= {
            "TaskRunnerV1": "driver",
            "AgentLoopWorkerTQ": "agent_loop",
            "TransferQueueController": "driver",
            "SimpleStorageUnit": "driver",
        }
    assert {c: short.get(c) for c in expected} == expected, short
    other = {c for c, r in short.items() if r == "other"} - NOT_THE_JOBS
    assert not other, f"actors of the job in `other`: {other}"


@pytest.mark.parametrize("which", ["legacy", "v1"])
def test_finished_and_nothing_pages(which, request, stack):
    run = request.getfixturevalue(which)
    lab = {"project": harness.PROJECT, "experiment": which}
    assert _value(run, "rlhf_job_state", state="finished", **lab) == 1.0
    time.sleep(5)  # the rules evaluate the finished state
    assert not stack.alerts.episodes(which, since=run.t0), stack.alerts.episodes(which)


# Both jobs strict (issue 32): the engines are read fast from the moment Ray lists the rollout
# server (before the first record), and a window placed with more error than half its length
# (V1's first step: its untimed warm-up) is not measured.
@pytest.mark.parametrize("which", ["legacy", "v1"])
def test_engine_found_by_discovery_and_its_metrics_agree(which, request):
    run = request.getfixturevalue(which)
    assert run.rec.pages, "the rollout server's /metrics was never read"
    lab = {"project": harness.PROJECT, "experiment": which}
    seen_running = max(
        (float(ln.rsplit(" ", 1)[1]) for s in run.rec.engine_lines for ln in s["lines"]
         if ln.startswith("vllm:num_requests_running")),
        default=0.0,
    )  # fmt: skip
    # vLLM-CPU's gauges are live: read every 0.1 s, requests ran (at most n x batch)
    assert 0 < seen_running <= harness.Job.MAX_SEQS
    # the sidecar found the server itself (Ray actor name, /proc port) and read it
    windows = _value(run, "rlhf_engine_windows_total", **lab)
    assert windows, sorted(n for n, _ in run.samples if n.startswith("rlhf_engine"))
    tokens = _value(run, "rlhf_engine_replica_generated_tokens", **lab)
    assert tokens is not None and 0 < tokens <= 4 * harness.Job.N * harness.Job.RESPONSE
    usable = _value(run, "rlhf_engine_windows_total", usable="true", **lab) or 0.0
    if usable:  # a usable window saw the requests it generated
        peak = _value(run, "rlhf_engine_running_requests_peak", **lab) or 0.0
        assert 0 < peak <= harness.Job.MAX_SEQS


# -- the console route (issue 47): the same jobs, read with no verl file ---------------------------

_VERDICT_RECT = re.compile(
    r'<rect class="verdict" data-verdict="([^"]+)"[^>]*><title>step (\d+): ([^<]*)</title>'
)
_MARKER = re.compile(r'<text class="marker" data-step="(\d+)" data-change="([^"]+)"')


def _page_steps(page: str) -> dict[int, tuple[str, str | None, str]]:
    """step -> (verdict, reason, change) as the job's page draws its step strip (a step
    without a change marker is `steady`)."""
    out: dict[int, tuple[str, str | None, str]] = {}
    marks = {int(s): c for s, c in _MARKER.findall(page)}
    for verdict, step, title in _VERDICT_RECT.findall(page):
        head, _, reason = html.unescape(title).partition(": ")
        assert head == verdict, title
        got = (verdict, reason or None, marks.get(int(step), "steady"))
        assert out.setdefault(int(step), got) == got, (step, got, out[int(step)])
    return out


def contract_to_series(change: str) -> str:
    return STEADY if change == CONTRACT_NONE else change


def _diagnose_rows(path: Path) -> list[dict]:
    """`rlhf-exporter diagnose --format jsonl` of the file logger's JSONL."""
    out = subprocess.run(
        [*exporter_cmd("diagnose", "--format", "jsonl", str(path))],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    steps = [r for r in rows if "type" not in r]  # the steps (not the episodes)
    for r in steps:  # the contract's `none` is `steady` in the series and on the pages
        r["change"] = contract_to_series(r["change"])
    return steps


@pytest.mark.parametrize("which", ["legacy", "v1", "hang"])
def test_console_sidecar_reads_every_step_as_diagnose_does(which, request):
    """Issue 47: the head sidecar with no verl root and no file (only the Ray address)
    finds the job's trainer actor through Ray, streams its stdout by actor id and shows
    every step the file logged, labelled with the project and experiment verl printed,
    each classified exactly as `diagnose` classifies the JSONL: verdict, reason and change,
    step by step (the job's page), and counted (`/metrics`, `/api/v1/jobs`)."""
    run = request.getfixturevalue(which)
    assert run.console_error is None, run.console_error
    rows = _diagnose_rows(run.log)
    assert rows and len(rows) == len(run.records)
    lab = {"project": harness.PROJECT, "experiment": which}
    cs = SimpleNamespace(samples=run.console_samples)
    assert _value(cs, "rlhf_steps_total", **lab) == len(rows)
    assert _value(cs, "rlhf_step", **lab) == rows[-1]["step"]
    state = "finished" if run.status == "SUCCEEDED" else "failed"
    assert _value(cs, "rlhf_job_state", state=state, **lab) == 1.0
    verdicts = Counter(r["verdict"] for r in rows)
    for verdict in set(verdicts) | {"rollout", "balanced", "other"}:
        got = _value(cs, "rlhf_bottleneck_steps_total", verdict=verdict, **lab) or 0.0
        assert got == verdicts[verdict], (verdict, got, verdicts)
    changes = Counter(r["change"] for r in rows)
    for kind in set(changes) | {"steady", "workload_shift", "regression"}:
        got = _value(cs, "rlhf_change_steps_total", kind=kind, **lab) or 0.0
        assert got == changes[kind], (kind, got, changes)
    assert _value(cs, "rlhf_bottleneck", verdict=rows[-1]["verdict"], **lab) == 1.0
    # the job's summary: the labels verl printed, its last step as diagnose read it
    (job,) = [j for j in run.console_jobs if j["experiment"] == which]
    assert job["project"] == harness.PROJECT and job["source"].startswith("console"), job
    last = rows[-1]
    assert (job["step"], job["steps"], job["verdict"], job["change"]) == (
        last["step"], len(rows), last["verdict"], last["change"]
    ), job  # fmt: skip
    # step by step, as the job's page draws it: verdict, reason and change, exactly
    drawn = _page_steps(run.console_page)
    assert sorted(drawn) == [r["step"] for r in rows], (sorted(drawn), rows)
    for r in rows:
        assert drawn[r["step"]] == (r["verdict"], r["reason"], r["change"]), (r, drawn[r["step"]])


def test_console_captures_kept(legacy, v1):
    """What the console route reads is kept with each run: the driver's log and the trainer
    actor's own stdout, both holding the printed steps."""
    for run in (legacy, v1):
        assert run.trainer_path is not None, "no worker-*.out with :actor_name:TaskRunner"
        for data in (run.driver_bytes, run.trainer_bytes):
            assert data.count(b"step:") >= len(run.records), data[-2000:]


# -- a hang, then a crash -----------------------------------------------------------------------


def test_hang_pages_stalled_and_nothing_resolves_it(hang):
    assert hang.steps_at_stop >= 1
    assert hang.steps_while_stopped == 0
    assert hang.still_stalled
    assert hang.pages["RLHFJobStalled"] == 1


def test_hang_stacks_name_the_stopped_trainer_and_what_the_others_wait_on(hang):
    """Issue 39 on the real job: once it stalls, the sidecar's stack round (Ray's dashboard
    with profiling on, py-spy 0.4.3 from the lock on the head's PATH) names the stopped
    trainer first (py-spy cannot suspend a stopped process: Ray's 500 says so), the
    TaskRunner in ray.get on the trainer's WorkerDict task (one sent to the stopped worker,
    never RUNNING), the entrypoint's driver in ray.get on TaskRunner.run, and the vLLM server
    idle (its engine core waiting for requests): on the API, on `/` and on the page."""
    found = hang.stacks
    assert found is not None and found["why"] == "", found
    roles = {r["role"]: r for r in found["roles"]}
    assert found["answer"].startswith("trainer: stopped (state T (stopped)"), found["answer"]
    (stopped,) = [p for p in found["processes"] if p["role"] == "trainer"]
    assert (stopped["pid"], stopped["where"]) == (hang.stopped_pid, "stopped"), stopped
    assert "Failed to suspend process" in stopped["stack"]
    driver = {g["processes"][0].split(" ")[0]: g for g in roles["driver"]["groups"]}
    assert driver["TaskRunner"]["where"] == "ray_get"
    assert " on WorkerDict." in driver["TaskRunner"]["detail"], (driver, hang.tasks)
    assert driver["driver"]["detail"].endswith(" on TaskRunner.run"), driver
    server = [g for g in roles["rollout"]["groups"] if g["processes"][0].startswith("vLLM")]
    unread = [(p.get("label"), p.get("error"), p.get("message")) for p in found["processes"]
              if p["role"] == "rollout" and p.get("error")]  # fmt: skip
    assert server, (roles["rollout"], unread)  # py-spy's words when it was refused
    if roles["rollout"]["where"] == "engine_step":
        # the stop landed inside a call the trainer's step had made to the engine (its weight
        # sync or wake-up): the engine core's collective_rpc waits on the stopped worker for
        # good; anything else in a step (a model forward) is no state a stopped trainer leaves
        assert server[0]["detail"].startswith("EngineCore.collective_rpc "), roles["rollout"]
    else:
        assert roles["rollout"]["where"] == "no_task", roles["rollout"]
        assert server[0]["detail"].startswith("engine idle, waiting for work: ")
    assert "where it hangs: trainer: stopped" in hang.front
    assert "trainer: 1 in stopped" in hang.annotation, hang.annotation
    assert "driver: 2 in ray_get" in hang.annotation, hang.annotation


def test_crash_reads_failed_and_pages_once(hang):
    assert hang.status == "FAILED"
    lab = {"project": harness.PROJECT, "experiment": "hang"}
    assert _value(hang, "rlhf_job_state", state="failed", **lab) == 1.0
    assert hang.pages["RLHFJobFailed"] == 1, hang.pages
