"""End to end, all on 127.0.0.1: verl log -> `serve` -> Prometheus (time-scaled rules) ->
Alertmanager (the example config, receivers pointed at this test) -> a webhook receiver here.

The feed writes rollout-bound steps until the reference window holds them (no bound alert may
arrive: a steady bottleneck is not news), then sync-bound steps until the sync-bound alert
arrives naming both verdicts (the bottleneck moved), then stops: the job stalls and the
stalled page arrives. The rules run `SCALE` times their real durations (a 30m
window is 9s); every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from rlhf_exporter.demo import simulator as sim
from rlhf_exporter.render import repo_root, rules
from tests.support.procs import wait_until
from tests.support.prometheus import Alertmanager, Prometheus, binary
from tests.support.serve import Exporter

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]

SCALE = 0.005  # 30m -> 9s, 15m -> 4.5s, 10m -> 3s
STEP_INTERVAL = 0.2  # seconds between the simulated job's steps
PROJECT, EXPERIMENT = "live", "ppo"
BOUND = set(rules.BOUND_ALERTS.values())


class Receiver:
    """A webhook receiver: keeps every notification Alertmanager posts, in arrival order."""

    def __init__(self):
        self.notifications: list[tuple[str, dict]] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    outer.notifications.append((self.path.strip("/"), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def events(self) -> list[tuple[int, str, str, str, dict]]:
        """(notification index, receiver, alertname, status, alert) for every alert posted."""
        out = []
        for i, (receiver, payload) in enumerate(list(self.notifications)):
            for a in payload["alerts"]:
                out.append((i, receiver, a["labels"]["alertname"], a["status"], a))
        return out

    def first(self, alertname: str, status: str) -> tuple[int, str, str, str, dict] | None:
        return next((e for e in self.events() if e[2] == alertname and e[3] == status), None)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def alertmanager_config(receiver_url: str) -> dict:
    """The example config with every receiver posting here, short group timers, and no
    working-hours restriction (the test must not depend on the wall clock)."""
    cfg = yaml.safe_load((repo_root() / "alerts" / "alertmanager.example.yaml").read_text())
    cfg["receivers"] = [
        {
            "name": r["name"],
            "webhook_configs": [{"url": f"{receiver_url}/{r['name']}", "send_resolved": True}],
        }
        for r in cfg["receivers"]
    ]

    def fast(route: dict) -> None:
        route.update(group_wait="200ms", group_interval="1s", repeat_interval="1h")
        route.pop("active_time_intervals", None)
        for child in route.get("routes", []):
            fast(child)

    fast(cfg["route"])
    cfg.pop("time_intervals", None)
    return cfg


class Feed:
    """Writes simulated verl steps to <root>/<project>/<experiment>.jsonl from a thread."""

    def __init__(self, root: Path):
        (root / PROJECT).mkdir(parents=True, exist_ok=True)
        self.path = root / PROJECT / f"{EXPERIMENT}.jsonl"
        self.regime = sim.REGIMES["rollout_long_tail"]
        self.stop = threading.Event()
        self.steps = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = random.Random(6)
        with open(self.path, "wb", buffering=0) as f:
            while not self.stop.is_set():
                self.steps += 1
                f.write(
                    sim.encode(
                        {"step": self.steps, "data": sim.step_data(self.regime, self.steps, rng)}
                    )
                )
                self.stop.wait(STEP_INTERVAL)


def test_alerts_arrive_at_a_receiver(tmp_path, thresholds):
    for name in ("prometheus", "prometheus-alertmanager"):
        binary(name)
    deadline = time.monotonic() + 55  # the whole test, start-up included, stays under a minute

    def left(cap: float) -> float:
        return max(1.0, min(cap, deadline - time.monotonic()))

    rule_dir = tmp_path / "rules"
    rule_dir.mkdir()
    rule_files = []
    for rel, text in rules.rule_files(thresholds, scale=SCALE).items():
        path = rule_dir / Path(rel).name
        path.write_text(text)
        rule_files.append(path)

    receiver = Receiver()
    feed = Feed(tmp_path / "exporter" / "verl")
    procs = []
    try:
        exporter = Exporter(tmp_path / "exporter")
        procs.append(exporter)
        assert exporter.verl_root == feed.path.parent.parent
        am = Alertmanager(tmp_path / "am", alertmanager_config(receiver.url))
        procs.append(am)
        prom = Prometheus(
            tmp_path / "prom",
            [f"127.0.0.1:{exporter.port}"],
            rule_files,
            scrape_interval="1s",
            alertmanagers=[am.address],
        )
        procs.append(prom)

        def explain() -> str:
            events = [(e[1], e[2], e[3]) for e in receiver.events()]
            return (
                f"\nsteps written: {feed.steps}\nreceived: {events}\nprometheus alerts: "
                f"{[(a['labels']['alertname'], a['state']) for a in prom.alerts()]}\n"
                f"--- exporter ---\n{exporter.output()[-2000:]}\n--- prometheus ---\n"
                f"{prom.output()[-2000:]}\n--- alertmanager ---\n{am.output()[-2000:]}"
            )

        def wait(fn, cap: float, what: str):
            try:
                return wait_until(fn, left(cap), 0.2, what=what)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}{explain()}") from None

        # 1. Steadily rollout-bound steps: the steady state notifies nothing. Wait until the
        #    reference window (read `offset <window>`) says rollout-bound.
        ctx = rules.Context(thresholds, SCALE)
        feed.thread.start()
        wait(
            lambda: prom.query(
                f'{ctx.verdicts_ref}{{verdict="rollout"}} offset {ctx.window} >= 0.7'
            ),
            25,
            "a rollout-bound reference window",
        )
        assert not [e for e in receiver.events() if e[2] in BOUND], explain()

        # 2. Sync-bound steps: the bottleneck moved, and the sync-bound alert names both.
        feed.regime = sim.REGIMES["sync_bound"]
        sync = wait(
            lambda: receiver.first("RLHFJobSyncBound", "firing"), 30, "the sync-bound alert"
        )
        alert = sync[4]
        assert sync[1] == "team-chat"
        assert alert["labels"]["project"] == PROJECT and alert["labels"]["experiment"] == EXPERIMENT
        assert alert["labels"]["severity"] == "info"
        assert (
            alert["annotations"]["summary"]
            == f"{PROJECT}/{EXPERIMENT} is sync-bound, was rollout-bound"
        )
        assert alert["annotations"]["reason"] == "weight_sync"
        assert "Moved: it is sync-bound, was rollout-bound" in alert["annotations"]["description"]
        assert alert["annotations"]["runbook_url"].endswith("#rlhfjobsyncbound")

        # 3. Stop the feed: the job stalls, and the page arrives.
        feed.stop.set()
        feed.thread.join(5)
        stalled = wait(lambda: receiver.first("RLHFJobStalled", "firing"), 20, "the stalled alert")
        assert stalled[1] == "pager"
        assert stalled[4]["labels"]["severity"] == "critical"
        assert stalled[4]["labels"]["project"] == PROJECT

        seen_bound = {e[2] for e in receiver.events() if e[2] in BOUND}
        assert seen_bound == {"RLHFJobSyncBound"}, explain()
        assert time.monotonic() < deadline
    finally:
        feed.stop.set()
        for p in reversed(procs):
            p.terminate()
        receiver.close()
