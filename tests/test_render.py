"""Generated files are current, and the catalog follows Prometheus naming rules."""

from __future__ import annotations

import re
import subprocess
import sys

from exporter.metrics.catalog import CATALOG, COUNTER
from exporter.render import generators, repo_root, stale


def test_every_generated_file_is_current(thresholds):
    """`rlhf-exporter render --check`: committed rules, dashboards, docs, chart copies."""
    bad = {name: stale(repo_root(), gen(thresholds)) for name, gen in generators().items()}
    assert not any(bad.values()), f"stale; run `rlhf-exporter render`: {bad}"


def test_render_check_command_exits_0_and_flags_a_stale_file(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "exporter", "render", "--check"], capture_output=True
    )
    assert ok.returncode == 0, ok.stderr
    stale_root = subprocess.run(
        [sys.executable, "-m", "exporter", "render", "--check", "docs", "--root", str(tmp_path)],
        capture_output=True,
    )
    assert stale_root.returncode == 1 and b"docs/metrics.md" in stale_root.stderr
    unknown = subprocess.run(
        [sys.executable, "-m", "exporter", "render", "nope"], capture_output=True
    )
    assert unknown.returncode == 2


def test_catalog_names_follow_prometheus_conventions():
    units = (
        "_seconds",
        "_bytes",
        "_ratio",
        "_watts",
        "_celsius",
        "_hertz",
        "_tokens",
        "_total",
        "_info",
        "_per_token",
        "_per_second",
        "_per_gpu_second",
    )
    for m in CATALOG:
        assert re.fullmatch(r"rlhf_[a-z0-9_]+", m.name), m.name
        assert (m.type == COUNTER) == m.name.endswith("_total"), m.name
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", label) for label in m.labels), m.name
        assert not {"cluster", "namespace", "pod", "instance", "job"} & set(m.labels), m.name
        assert m.help and m.help.endswith("."), m.name
        if m.name.endswith("_info"):
            assert m.type == "gauge"
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    # unit-less names are counts or identities; everything else names its base unit
    unitless = {n for n in names if not n.endswith(units)}
    assert unitless <= {
        "rlhf_step",
        "rlhf_run",
        "rlhf_bottleneck",
        "rlhf_bottleneck_reason",
        "rlhf_change",
        "rlhf_ray_actors",
        "rlhf_ray_actors_by_class",
        "rlhf_exporter_collector_up",
        "rlhf_job_finished",  # a 0/1 state, like collector_up
        "rlhf_exporter_jobs",
        "rlhf_agent_loop_preempted_max",
    }, unitless
