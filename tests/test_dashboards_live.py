"""Every dashboard query returns data from a real Prometheus scraping a real `serve`.

Two simulated verl jobs are replayed step by step into `serve --verl-root`; a real Prometheus
scrapes it every 500 ms with the generated recording and alert rules loaded. The rules and
the dashboards are rendered from one thresholds document whose durations are 100 times
shorter, so the recording rules' names (they carry the window) match on both sides. Then
every panel query, annotation and variable of both dashboards, with the variables set to a
real job, must return at least one series through Prometheus's HTTP API.

GPUs: the machine has none, so the serve process gets the project's scripted NVML stand-in
(tests/support/fake_pynvml.py) at the `pynvml` import boundary, through a `sitecustomize`
module on its PYTHONPATH; the NVML source itself is the real one (`serve --nvml --gpu-roles`).

Ray: the replay runs `serve --no-ray`, so its checks leave out the queries on Ray series
(found by `needs_absent_source` and asserted to be exactly the Ray panels). Those panels are
checked by the last test instead, against a real Ray head with two live actors (its own
fixture: a head costs ~30 s, so only one short job is replayed there).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests
import yaml

from rlhf_exporter.demo.simulator import (
    DEMO_PLAN,
    N_GPUS,
    REGIMES,
    encode,
    records,
    regressed,
    shifted,
)
from rlhf_exporter.diagnosis import Thresholds
from rlhf_exporter.metrics.catalog import ENGINE, RAY, WINDOW_GPU
from rlhf_exporter.render import rules as rules_mod
from rlhf_exporter.render.addresses import FLEET_PATH, JOB_PATH
from rlhf_exporter.render.dashboards import targets
from rlhf_exporter.render.dashboards.queries import gpus_per_job
from rlhf_exporter.render.dashboards.style import verdict_codes
from rlhf_exporter.thresholds_file import default_document
from tests.support import grafana_vars
from tests.support.procs import REPO, wait_until
from tests.support.prometheus import Prometheus
from tests.support.serve import Exporter

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

SCALE = 0.01
SCRAPE = "500ms"
RATE_INTERVAL = "5s"  # Grafana: max(4 x scrape interval, interval + scrape interval), rounded up
PROJECT = "demo"
JOBS = {
    "alpha": DEMO_PLAN,  # rollout, update, sync bound; a workload shift; a regression of update
    "beta": [
        (REGIMES["rollout_long_tail"], 14),
        (shifted(REGIMES["rollout_long_tail"], 1.5), 8),
        (regressed(REGIMES["rollout_long_tail"], "update_actor", 4.0), 8),
    ],
}
STEP_EVERY = 0.3  # seconds between two steps of a job: a few scrapes per step


ENGINE_PANELS = {551: "ABC", 552: "AB", 553: "A", 554: "A", 555: "A", 556: "AB"}
"""The job dashboard's engines row: panel id -> its queries (tests/test_engines_live.py)."""


def scaled_thresholds() -> Thresholds:
    """The default thresholds with every alerts duration SCALE times as long."""
    doc = default_document()
    alerts = {}
    for key, value in doc["alerts"].items():
        if isinstance(value, str) and re.fullmatch(r"\d+(ms|s|m|h|d|w)", value):
            alerts[key] = rules_mod.duration(rules_mod.seconds(value) * SCALE)
    return Thresholds.from_documents(doc, {"alerts": alerts})


FAKE_GPUS = 2
GPU_JOB = "alpha"  # the job the fake GPUs serve (--experiment): the others' GPU panels are empty
SITECUSTOMIZE = f"""\
# Written by tests/test_dashboards_live.py: the serve process's `pynvml` is the fake.
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.support.fake_pynvml import FakeClock, FakeGpu, make_module
_gpus = [FakeGpu(i, util=((0.0, 35.0 + 30.0 * i),), processes=((4242 + i, 6 * 2**30),))
         for i in range({FAKE_GPUS})]
# real NVML stamps samples in epoch microseconds: the GPU-window join matches them to steps
import time
sys.modules["pynvml"] = make_module(_gpus, FakeClock(start=time.time(), real=True))
"""


def absent_source_series(rule_dir: Path) -> set[str]:
    """Series that only the Ray source feeds: their catalog names, and recording rules
    computed from them (read from the rule files). Also GPU time by step window: it needs
    one job per exporter (docs/gpu-windows.md), and this exporter follows several; its
    panels are checked live in tests/test_gpu_windows.py. And engine evidence: the replay's
    steps are far shorter in wall time than their timers say, so no rollout window lies where
    an engine was read; the engines row is checked live in tests/test_engines_live.py."""
    names = {m.name for m in RAY} | {m.name for m in WINDOW_GPU} | {m.name for m in ENGINE}
    for path in rule_dir.glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule and any(n in rule["expr"] for n in names):
                    names.add(rule["record"])
    return names


def needs_absent_source(expr: str, absent: set[str]) -> bool:
    return any(re.search(rf"\b{re.escape(n)}\b", expr) for n in absent)


def substitute(expr: str, project: str, experiment: str, range_: str) -> str:
    return grafana_vars.substitute(
        expr,
        rate_interval=RATE_INTERVAL,
        interval="1s",
        range_=range_,
        project=project,
        experiment=experiment,
    )


def all_panels(doc: dict) -> list[dict]:
    out = []
    for p in doc["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return [p for p in out if p["type"] != "row"]


def query(prom: Prometheus, expr: str, instant: bool, start: float, end: float) -> list[dict]:
    if instant:
        r = requests.get(
            prom.url + "/api/v1/query", params={"query": expr, "time": end}, timeout=10
        )
    else:
        r = requests.get(
            prom.url + "/api/v1/query_range",
            params={"query": expr, "start": start, "end": end, "step": "1s"},
            timeout=10,
        )
    assert r.ok, f"{r.status_code} {r.text}\n{expr}"
    return r.json()["data"]["result"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(prometheus, rendered dashboards, start time, absent-source series) after a replay."""
    work = tmp_path_factory.mktemp("dash-live")
    th = scaled_thresholds()
    rule_dir = work / "rules"
    rule_dir.mkdir()
    paths = []
    for rel, text in rules_mod.rule_files(th).items():
        path = rule_dir / Path(rel).name
        path.write_text(text)
        paths.append(path)
    dashboards = {rel: json.loads(text) for rel, text in targets(th).items()}

    fake = work / "fake-nvml"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(SITECUSTOMIZE)
    exporter = Exporter(
        work / "serve",
        "--nvml",
        "--gpu-roles",
        "--nvml-interval",
        "0.25",
        # the exporter follows several jobs: its GPUs serve the one configured (issue 23)
        "--project",
        PROJECT,
        "--experiment",
        GPU_JOB,
        env={"PYTHONPATH": str(fake)},
    )
    prom = None
    try:
        prom = Prometheus(
            work / "prom", [f"127.0.0.1:{exporter.port}"], rule_files=paths, scrape_interval=SCRAPE
        )
        start = time.time()
        folder = exporter.verl_root / PROJECT
        folder.mkdir()
        streams = {
            name: [encode(r) for r in records(plan, seed=i)]
            for i, (name, plan) in enumerate(JOBS.items())
        }
        streams["beta"].insert(3, b"{not json\n")  # bad input is counted, never fatal
        files = {name: open(folder / f"{name}.jsonl", "ab") for name in JOBS}
        try:
            for i in range(max(len(s) for s in streams.values())):
                for name, stream in streams.items():
                    if i < len(stream):
                        files[name].write(stream[i])
                        files[name].flush()
                time.sleep(STEP_EVERY)
        finally:
            for f in files.values():
                f.close()
        last = {name: json.loads(stream[-1])["step"] for name, stream in streams.items()}
        for name, step in last.items():
            wait_until(
                lambda name=name, step=step: prom.query(
                    f'rlhf_step{{project="{PROJECT}",experiment="{name}"}} == {step}'
                ),
                30,
                0.25,
                what=f"Prometheus to see step {step} of {name}",
            )
        recorded = rules_mod.Context(th).verdicts
        wait_until(
            lambda: all(prom.query(f'{recorded}{{experiment="{name}"}}') for name in JOBS),
            30,
            0.25,
            what="the recording rules to be evaluated",
        )
        # the job dashboard's alert annotations: the replayed regression pages (its `for:`
        # scaled to seconds) by the time the rules caught up, or soon after on a busy machine.
        # Waited for as the annotation reads it, a range query at 1 s steps: an alert that
        # fired for one evaluation only (then a staleness marker) can fall between two steps
        firing = f'ALERTS{{alertstate="firing",project="{PROJECT}",experiment="{GPU_JOB}"}}'
        wait_until(
            lambda: query(prom, firing, False, start, time.time()),
            60,
            0.5,
            what=f"an alert of {GPU_JOB} to fire, as the job dashboard's annotations read it",
        )
        yield prom, dashboards, start, absent_source_series(rule_dir), exporter
    finally:
        if prom is not None:
            prom.terminate()
        exporter.terminate()


def _targets(doc: dict):
    for p in all_panels(doc):
        for t in p["targets"]:
            yield f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"], bool(t.get("instant"))
    for a in doc["annotations"]["list"]:
        yield f"annotation {a['name']!r}", a["expr"], False


@pytest.mark.parametrize("rel", [JOB_PATH, FLEET_PATH])
@pytest.mark.parametrize("experiment", list(JOBS))
def test_every_query_returns_series_for_a_real_job(live, rel, experiment):
    prom, dashboards, start, absent, _ = live
    end = time.time()
    range_ = f"{int(end - start) + 1}s"
    empty, skipped, checked, not_its_gpus = [], [], 0, []
    for where, expr, instant in _targets(dashboards[rel]):
        if needs_absent_source(expr, absent) or "remote_write_lag" in expr:
            # remote-write lag needs a Prometheus that remote-writes: test_fleet_outage_live
            skipped.append(where)
            continue
        result = query(prom, substitute(expr, PROJECT, experiment, range_), instant, start, end)
        if (
            experiment != GPU_JOB
            and re.search(r"rlhf_gpu_", expr)
            and "and on (cluster, job, instance)" not in expr  # the job's exporters, not its GPUs
        ):
            # the GPUs serve GPU_JOB only: another job's GPU panels must be empty
            not_its_gpus.append((where, result))
            continue
        checked += 1
        if not result:
            empty.append(f"{where}:\n{substitute(expr, PROJECT, experiment, range_)}")
    assert not empty, "queries without data:\n" + "\n\n".join(empty)
    assert all(not result for _, result in not_its_gpus), not_its_gpus
    assert experiment == GPU_JOB or len(not_its_gpus) >= (3 if rel == JOB_PATH else 1)
    assert checked >= (40 if rel == JOB_PATH else 20)
    # only the Ray panels (and GPU time by step window) are left out
    left_out = {(int(w.split()[1]), w.rsplit(" ", 1)[1]) for w in skipped}
    want = {(604, "A"), (604, "B"), (654, "A"), (701, "A"), (702, "A"), (702, "B")}
    want |= {(p, r) for p, refs in ENGINE_PANELS.items() for r in refs}
    assert left_out == (want if rel == JOB_PATH else {(303, "A"), (501, "A")}), skipped


@pytest.mark.parametrize("rel", [JOB_PATH, FLEET_PATH])
def test_variables_list_the_real_jobs(live, rel):
    prom, dashboards, *_ = live
    for v in dashboards[rel]["templating"]["list"]:
        if v["type"] != "query":
            continue
        selector, label = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"]).groups()
        expr = substitute(f"group by ({label}) ({selector})", ".+", ".+", "1m")
        values = {s["metric"].get(label, "") for s in prom.query(expr)}
        if label == "project":
            assert values == {PROJECT}
        elif label == "experiment":
            assert values == set(JOBS)
        else:  # no cluster/namespace target labels here: the filters must let everything through
            assert values == {""}


def test_verdict_timeline_shows_the_exporters_verdict(live):
    """The coded verdict query decodes to the verdict the exporter itself serves."""
    prom, dashboards, _start, _, exporter = live
    panel = next(p for p in all_panels(dashboards[JOB_PATH]) if p["id"] == 101)
    codes = verdict_codes()
    names = {c: v for v, c in codes.items()}
    for experiment in JOBS:
        served = exporter.series("rlhf_bottleneck", project=PROJECT, experiment=experiment)
        (hot,) = [dict(labels)["verdict"] for labels, value in served.items() if value == 1]
        expr = substitute(panel["targets"][0]["expr"], PROJECT, experiment, "1m")
        (series,) = prom.query(expr)
        assert names[int(float(series["value"][1]))] == hot
        # and the reason row decodes to a mapping of the panel
        reason_expr = substitute(panel["targets"][1]["expr"], PROJECT, experiment, "1m")
        (reason,) = prom.query(reason_expr)
        mappings = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
        assert str(int(float(reason["value"][1]))) in mappings


def test_jobs_per_verdict_counts_every_job_once_under_its_served_verdict(live):
    """The fleet's jobs per verdict (a count of the hot-verdict record) agrees with the
    verdicts the exporter serves: every job once, each under its last step's verdict."""
    prom, dashboards, _start, _, exporter = live
    panel = next(p for p in all_panels(dashboards[FLEET_PATH]) if p["title"] == "Jobs per verdict")
    want: dict[str, int] = {}
    for experiment in JOBS:
        served = exporter.series("rlhf_bottleneck", project=PROJECT, experiment=experiment)
        (hot,) = [dict(labels)["verdict"] for labels, value in served.items() if value == 1]
        want[hot] = want.get(hot, 0) + 1
    expr = substitute(panel["targets"][0]["expr"], PROJECT, ".+", "1m")

    def counted() -> dict[str, int]:
        return {s["metric"]["verdict"]: int(float(s["value"][1])) for s in prom.query(expr)}

    # the record is evaluated every (scaled) fleet interval: wait for the one after the last step
    wait_until(lambda: counted() == want, 30, 0.25, what=f"jobs per verdict {want}")
    assert sum(counted().values()) == len(JOBS)


def test_gpu_count_of_a_job_is_verls_own(live):
    """GPU-hours per group weigh each job by its GPU count, recovered from perf/throughput."""
    prom, *_ = live
    for series in prom.query(substitute(gpus_per_job(), PROJECT, ".+", "1m")):
        assert float(series["value"][1]) == N_GPUS, series


def test_gpu_panels_show_the_fake_gpus(live):
    """The NVML panels see the exporter's GPUs, busy at the scripted ratios."""
    prom, dashboards, _start, _, _ = live
    busy = next(p for p in all_panels(dashboards[JOB_PATH]) if p["title"] == "GPU busy ratio")
    series = prom.query(substitute(busy["targets"][0]["expr"], PROJECT, "alpha", "1m"))
    ratios = sorted(float(s["value"][1]) for s in series)
    assert len(ratios) == FAKE_GPUS
    assert ratios == pytest.approx([0.35 + 0.30 * i for i in range(FAKE_GPUS)], abs=0.05)


def test_change_annotations_mark_the_replayed_shift_and_regression(live):
    prom, dashboards, start, _, _ = live
    end = time.time()
    for a in dashboards[JOB_PATH]["annotations"]["list"]:
        expr = substitute(a["expr"], PROJECT, "alpha", "1m")
        assert query(prom, expr, False, start, end), f"no {a['name']} marked: {expr}"


def test_fleet_table_has_a_row_per_job(live):
    prom, dashboards, _start, absent, _ = live
    table = next(p for p in all_panels(dashboards[FLEET_PATH]) if p["type"] == "table")
    for t in table["targets"]:
        if needs_absent_source(t["expr"], absent):
            continue
        rows = prom.query(substitute(t["expr"], ".+", ".+", "1m"))
        # a GPU column has a cell for the jobs GPUs serve only (the others' stay empty)
        want = {GPU_JOB} if "rlhf_gpu_" in t["expr"] else set(JOBS)
        assert {r["metric"]["experiment"] for r in rows} == want, t["expr"]
        assert all(set(r["metric"]) == {"project", "experiment"} for r in rows), (t["expr"], rows)


# ------------------------------------------------------------------------------------------
# The Ray panels, against a real Ray head (its own module-scoped head: heavier, so separate)

RAY_PANELS = {701, 702}


@pytest.fixture(scope="module")
def ray_live(tmp_path_factory):
    """A real Ray head with two named actors, `serve --ray` watching it and one short verl
    job, scraped by a real Prometheus."""
    ray = pytest.importorskip("ray")
    from tests.support.ray_head import RayHead

    work = tmp_path_factory.mktemp("dash-ray")
    head = RayHead()
    exporter = prom = None
    try:
        ray.init(
            address=head.gcs_address,
            namespace="rlhf-dashboards-test",
            log_to_driver=False,
            configure_logging=False,
        )

        class TaskRunner:  # verl's driver actor
            def pid(self):
                return 0

        cls = ray.remote(num_cpus=0)(TaskRunner)
        actors = [cls.remote() for _ in range(2)]
        ray.get([a.pid.remote() for a in actors], timeout=120)
        exporter = Exporter(
            work / "serve", "--ray", "--ray-address", head.dashboard_url, "--ray-interval", "0.5"
        )
        prom = Prometheus(work / "prom", [f"127.0.0.1:{exporter.port}"], scrape_interval=SCRAPE)
        folder = exporter.verl_root / PROJECT
        folder.mkdir()
        (folder / "gamma.jsonl").write_bytes(
            b"".join(encode(r) for r in records(DEMO_PLAN[:1], seed=3))
        )
        wait_until(
            lambda: (
                prom.query('rlhf_step{experiment="gamma"}')
                and prom.query('count_over_time(rlhf_ray_actors{state="ALIVE"}[1m]) > 2')
            ),
            60,
            0.25,
            what="Prometheus to scrape the job and the Ray actors",
        )
        yield prom, json.loads(targets(scaled_thresholds())[JOB_PATH])
    finally:
        if prom is not None:
            prom.terminate()
        if exporter is not None:
            exporter.terminate()
        if ray.is_initialized():
            ray.shutdown()
        head.stop()


@pytest.mark.ray
def test_ray_panels_return_series_from_a_real_ray_head(ray_live):
    prom, job = ray_live
    end = time.time()
    checked = 0
    for p in all_panels(job):
        if p["id"] not in RAY_PANELS:
            continue
        for t in p["targets"]:
            expr = substitute(t["expr"], PROJECT, "gamma", "1m")
            assert query(prom, expr, False, end - 30, end), (
                f"panel {p['id']} {t['refId']}: no data\n{expr}"
            )
            checked += 1
    assert checked == 3
    actors = prom.query(
        substitute(
            next(p for p in all_panels(job) if p["id"] == 701)["targets"][0]["expr"],
            PROJECT,
            "gamma",
            "1m",
        )
    )
    alive = sum(float(s["value"][1]) for s in actors if s["metric"]["state"] == "ALIVE")
    assert alive == 2, actors  # the two actors the fixture started


# ------------------------------------------------------------------------------------------
# A fleet bigger than a panel: every time series draws at most MAX_SERIES series (issue 24)

FLEET_JOBS = 30  # more jobs than any panel may draw
HISTORY_HOURS = 2


@pytest.fixture(scope="module")
def fleet_prom(tmp_path_factory):
    """A real Prometheus over FLEET_JOBS jobs' real exporter series (the sample traces) and
    their recording rules, backfilled with promtool (tests/support/fleet_history.py)."""
    from tests.support import fleet_history

    work = tmp_path_factory.mktemp("fleet-history")
    data = work / "prom" / "data"
    end = int(time.time()) // fleet_history.BLOCK * fleet_history.BLOCK
    fleet_history.build(work, data, FLEET_JOBS, HISTORY_HOURS, end)
    prom = Prometheus(work / "prom", [], extra_args=["--storage.tsdb.retention.time=30d"])
    try:
        yield prom, end - fleet_history.SCRAPE
    finally:
        prom.terminate()


def drawn_series(prom: Prometheus, expr: str, start: float, end: float, step: int) -> set[str]:
    r = requests.get(
        prom.url + "/api/v1/query_range",
        params={"query": expr, "start": start, "end": end, "step": step},
        timeout=60,
    )
    assert r.ok, f"{r.status_code} {r.text}\n{expr}"
    return {json.dumps(s["metric"], sort_keys=True) for s in r.json()["data"]["result"]}


@pytest.mark.parametrize("range_h", [1, 2])
def test_no_time_series_panel_draws_more_than_20_series(fleet_prom, range_h):
    """Every time series and state timeline of both dashboards, over the whole history, with
    the fleet's variables at All (the job dashboard on one job): at most MAX_SERIES distinct
    series, though the per-job panels' own expressions return every job."""
    from rlhf_exporter.render.dashboards.queries import MAX_SERIES

    prom, end = fleet_prom
    start = end - range_h * 3600
    docs = {rel: json.loads((REPO / rel).read_text()) for rel in (JOB_PATH, FLEET_PATH)}
    counted, unlimited = 0, {}
    for rel, doc in docs.items():
        job = rel == JOB_PATH
        for p in all_panels(doc):
            if p["type"] not in ("timeseries", "state-timeline"):
                continue
            drawn: set[str] = set()
            for t in p["targets"]:
                expr = grafana_vars.substitute(
                    t["expr"],
                    rate_interval="1m",
                    interval="30s",
                    range_=f"{range_h}h",
                    project="team0" if job else ".+",
                    experiment="exp0000" if job else ".+",
                )
                drawn |= {t["refId"] + s for s in drawn_series(prom, expr, start, end, 30)}
                if "\nand on (" in expr and not job:  # what the panel would draw unlimited
                    inner = expr.split("\nand on (")[0]
                    unlimited[p["title"]] = len(drawn_series(prom, inner, start, end, 30))
            assert len(drawn) <= MAX_SERIES, (rel, p["title"], len(drawn))
            counted += 1
    assert counted >= 35
    # the limits bite: the per-job panels' own expressions return every job
    for title in ("Verdict per job", "Tokens per second ÷ baseline", "Stall budget used"):
        assert unlimited[title] >= FLEET_JOBS - 5, (title, unlimited[title])
