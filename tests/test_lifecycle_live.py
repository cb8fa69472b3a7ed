"""Two jobs fail at the same moment: two incidents, each with a summary (issue 22).

All on 127.0.0.1: two verl jobs, each on its own Ray cluster (Ray's state and Jobs APIs
served over HTTP by tests/support/ray_state.py, in the shape a real Ray 2.60 head gives:
tests/test_job_state.py) with its own real `serve` sidecar -> Prometheus (the repository's
rules, time-scaled) -> Alertmanager with the example configuration, whose PagerDuty receiver
posts its Events API v2 payload here. Both submissions fail and a worker of each dies at
once: PagerDuty gets two triggers with two dedup keys (two incidents), each with its job's
summary; no actor-death page comes beside them, and no stall page after.
"""

from __future__ import annotations

import threading
import time

import pytest

from rlhf_exporter.demo import simulator as sim
from rlhf_exporter.render import rules
from tests.support.procs import wait_until
from tests.support.prometheus import Alertmanager, Prometheus, binary
from tests.support.ray_state import RayStateApi
from tests.support.serve import Exporter
from tests.test_alerts_live import Receiver, alertmanager_config

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

SCALE = 0.005  # as test_alerts_live: 10m -> 3 s, 5m -> 1.5 s


class Stepper:
    """Writes one verl step every 0.2 s to <root>/<project>/<experiment>.jsonl."""

    def __init__(self, root, project: str, experiment: str):
        (root / project).mkdir(parents=True, exist_ok=True)
        self.path = root / project / f"{experiment}.jsonl"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        import random

        rng, step = random.Random(3), 0
        regime = sim.REGIMES["rollout_long_tail"]
        with open(self.path, "wb", buffering=0) as f:
            while not self.stop.is_set():
                step += 1
                f.write(sim.encode({"step": step, "data": sim.step_data(regime, step, rng)}))
                self.stop.wait(0.2)


def pager_config(receiver_url: str) -> dict:
    """The example configuration, fast, every receiver posting here; the pager keeps its
    PagerDuty config (its summary template) and posts its Events API payload here."""
    cfg = alertmanager_config(receiver_url)
    import yaml

    from rlhf_exporter.render import repo_root

    example = yaml.safe_load((repo_root() / "alerts" / "alertmanager.example.yaml").read_text())
    pager = next(r for r in example["receivers"] if r["name"] == "pager")
    pager["pagerduty_configs"][0]["url"] = f"{receiver_url}/pager"
    cfg["receivers"] = [pager if r["name"] == "pager" else r for r in cfg["receivers"]]
    return cfg


def test_two_jobs_failing_at_once_are_two_incidents_with_summaries(tmp_path, thresholds):
    for name in ("prometheus", "prometheus-alertmanager"):
        binary(name)
    rule_dir = tmp_path / "rules"
    rule_dir.mkdir()
    rule_files = []
    for rel, text in rules.rule_files(thresholds, scale=SCALE).items():
        path = rule_dir / rel.split("/")[-1]
        path.write_text(text)
        rule_files.append(path)
    receiver = Receiver()
    procs, steppers, apis = [], [], []
    try:
        exporters = []
        for name in ("a", "b"):
            api = RayStateApi().__enter__()
            apis.append(api)
            api.submit(f"raysubmit_{name}", "live", name, job_id="02000000")
            api.alive(f"{name}-driver", "TaskRunner", pid=100, job_id="02000000")
            api.alive(f"{name}-worker", "WorkerDict", pid=101, job_id="02000000")
            exp = Exporter(
                tmp_path / name, "--ray", "--ray-address", api.url, "--ray-interval", "0.2"
            )
            procs.append(exp)
            exporters.append(exp)
            steppers.append(Stepper(exp.verl_root, "live", name))
        am = Alertmanager(tmp_path / "am", pager_config(receiver.url))
        procs.append(am)
        prom = Prometheus(
            tmp_path / "prom",
            [f"127.0.0.1:{e.port}" for e in exporters],
            rule_files,
            scrape_interval="1s",
            alertmanagers=[am.address],
        )
        procs.append(prom)

        def explain() -> str:
            return (
                f"\nreceived: {receiver.notifications}\nprometheus alerts: "
                f"{[(a['labels']['alertname'], a['state']) for a in prom.alerts()]}"
            )

        running = 'project_experiment_state:rlhf_job_state:max{state="running"}'
        wait_until(lambda: len(prom.query(running)) == 2, 30, 0.2, what="two running jobs")
        # both fail at once: the Jobs API says FAILED, and a worker of each died
        for name, api, stepper in zip("ab", apis, steppers):
            stepper.stop.set()
            api.kill(f"{name}-worker", "WORKER_DIED")
            api.end(f"raysubmit_{name}", "FAILED")

        def pages():
            return [p for r, p in receiver.notifications if r == "pager"]

        try:
            wait_until(
                lambda: len({p["dedup_key"] for p in pages()}) >= 2, 40, 0.2, what="two incidents"
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}{explain()}") from None
        time.sleep(6)  # a stall limit (3 s) and its for: (0.6 s) later: still only these two
        triggers = [p for p in pages() if p["event_action"] == "trigger"]
        assert len({p["dedup_key"] for p in triggers}) == 2, explain()
        summaries = sorted(p["payload"]["summary"] for p in triggers)
        assert summaries == ["live/a failed", "live/b failed"], explain()
        assert all(p["payload"]["summary"].strip() for p in pages())
        fired = {a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"}
        assert "RLHFJobFailed" in fired
        assert not fired & {"RLHFJobStalled", "RLHFRayActorsDied", "RLHFJobUnwatched"}, fired
    finally:
        for s in steppers:
            s.stop.set()
        for p in reversed(procs):
            p.terminate()
        for api in apis:
            api.__exit__(None, None, None)
        receiver.close()
