"""Generated files are current, and the catalog follows Prometheus naming rules."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from rlhf_exporter.metrics.catalog import CATALOG, COUNTER
from rlhf_exporter.render import generators, repo_root, stale


def test_every_generated_file_is_current(thresholds):
    """`rlhf-exporter render --check`: committed rules, dashboards, docs, chart copies.

    The one staleness check of the suite: other tests render into a temporary root.
    """
    bad = {name: stale(repo_root(), gen(thresholds)) for name, gen in generators().items()}
    assert not any(bad.values()), f"stale; run `rlhf-exporter render`: {bad}"


def render(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "rlhf_exporter", "render", *args],
        capture_output=True,
        text=True,
        **kw,
    )


def test_render_check_command_exits_0_and_flags_a_stale_file(tmp_path):
    root = str(tmp_path)
    missing = render("--check", "docs", "--root", root)
    assert missing.returncode == 1 and "docs/metrics.md" in missing.stderr
    assert "not a source checkout" in missing.stderr  # an empty folder is named as such
    wrote = render("docs", "--root", root)
    assert wrote.returncode == 0 and "wrote docs/metrics.md" in wrote.stdout
    ok = render("--check", "docs", "--root", root)
    assert ok.returncode == 0 and "up to date" in ok.stdout, ok.stderr
    (tmp_path / "docs" / "metrics.md").write_text("edited by hand\n")
    edited = render("--check", "docs", "--root", root)
    assert edited.returncode == 1 and "docs/metrics.md" in edited.stderr
    assert render("nope").returncode == 2
    bad_config = render("--check", "--thresholds", str(tmp_path / "absent.yaml"))
    assert bad_config.returncode == 2 and "absent.yaml: cannot read" in bad_config.stderr


def test_one_render_into_an_empty_root_is_complete(tmp_path):
    """Every target written into an empty folder gives a tree that --check accepts."""
    wrote = render("--root", str(tmp_path))
    assert wrote.returncode == 0, wrote.stderr
    assert (tmp_path / "helm/rlhf-exporter/files/grafana/rlhf-job.json").is_file()
    ok = render("--check", "--root", str(tmp_path))
    assert ok.returncode == 0, ok.stderr


def test_render_outside_a_checkout_says_so(tmp_path):
    """Installed (site-packages has no pyproject.toml): say so plainly, and neither report
    every file as stale nor write generated files into site-packages."""
    site = tmp_path / "site-packages"
    shutil.copytree(
        repo_root() / "rlhf_exporter",
        site / "rlhf_exporter",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    for args in (["--check"], []):
        out = render(*args, env=env, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "not run from a source checkout" in out.stderr and str(site) in out.stderr
        assert "stale" not in out.stderr and "up to date" not in out.stdout
    assert sorted(p.name for p in site.iterdir()) == ["rlhf_exporter"]  # nothing written
    # --root still works from an installed package
    out = render("docs", "--root", str(tmp_path / "out"), env=env, cwd=tmp_path)
    assert out.returncode == 0 and (tmp_path / "out" / "docs" / "metrics.md").is_file()


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
        if m.name == "process_start_time_seconds":  # the standard process metric, by its name
            continue
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
        "rlhf_job_state",  # one-hot over states, like rlhf_bottleneck
        "rlhf_ray_jobs",  # a count of Jobs API entries, like rlhf_ray_actors
        "rlhf_exporter_jobs",
        "rlhf_agent_loop_preempted_max",
        # GPU health (issue 23): counts of rows and pages, and 0/1 states
        "rlhf_gpu_remapped_rows",
        "rlhf_gpu_retired_pages",
        "rlhf_gpu_row_remap_pending",
        "rlhf_gpu_row_remap_failed",
        "rlhf_gpu_retired_pages_pending",
        "rlhf_gpu_reading_unsupported",
        # engine evidence (issue 29): counts of requests, replicas, preemptions; 0/1 states
        "rlhf_engine_evidence_usable",
        "rlhf_engine_replicas",
        "rlhf_engine_running_requests_peak",
        "rlhf_engine_running_requests_mean",
        "rlhf_engine_waiting_requests_mean",
        "rlhf_engine_window_preemptions",
        "rlhf_engine_preemptions",  # deprecated (issue 38)
        "rlhf_engine_up",
        "rlhf_job_stalled_in",  # processes of a role in a wait (issue 39)
        "rlhf_job_stacks_unread",  # processes whose stack was not read
    }, unitless


def test_render_without_the_dashboards_extra_renders_the_rest_and_says_what_is_missing(tmp_path):
    """After the basic install (no grafana-foundation-sdk), `render` writes the rules, docs
    and chart files, names the dashboards as needing the `dashboards` extra with a hint that
    works in a checkout, and exits 0; `--check`, or `render dashboards`, cannot pass."""
    no_sdk = (
        "import sys; sys.modules['grafana_foundation_sdk'] = None\n"  # the import fails
        "from rlhf_exporter.cli import main; raise SystemExit(main(sys.argv[1:]))"
    )

    def run(*args):
        return subprocess.run(
            [sys.executable, "-c", no_sdk, "render", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    wrote = run("--root", str(tmp_path))
    assert wrote.returncode == 0, wrote.stderr
    assert "wrote docs/metrics.md" in wrote.stdout and "wrote alerts/" in wrote.stdout
    assert not (tmp_path / "grafana").exists()
    hint = "needs the `dashboards` extra"
    assert hint in wrote.stderr and ".venv/bin/pip install -e '.[dashboards]'" in wrote.stderr
    assert "Traceback" not in wrote.stderr
    check = run("--check", "--root", str(tmp_path))
    assert check.returncode == 1 and hint in check.stderr
    named = run("dashboards", "--root", str(tmp_path))
    assert named.returncode == 1 and hint in named.stderr


def test_help_lines_are_short_and_known_error_reasons_exist():
    """Issue 38: every HELP line served is under 200 characters (docs keep the whole help);
    each known error reason served at 0 is one a source really counts."""
    from pathlib import Path

    from rlhf_exporter.job import cleaning
    from rlhf_exporter.metrics.catalog import CATALOG, HELP_MAX, KNOWN_ERRORS
    from rlhf_exporter.sources import (
        console,
        console_reader,
        push,
        ray,
        ray_token,
        verl_files,
        verl_layout,
        verl_reader,
        verl_tail,
    )

    for m in CATALOG:
        assert len(m.summary) < HELP_MAX and m.summary.endswith((".", "…")), m.name
        assert m.help.startswith(m.summary.rstrip(".…")), m.name
    sources = (push, ray, ray_token, verl_files, verl_layout, verl_reader, verl_tail, cleaning,
               console, console_reader)  # fmt: skip
    code = "".join(Path(mod.__file__).read_text() for mod in sources)
    from rlhf_exporter.sources.nvml_readings import error_reason

    # NVML's reasons are its exception names (NVMLError_GpuIsLost -> gpu_is_lost)
    nvml = {error_reason(type(f"NVMLError_{n}", (Exception,), {})()) for n in ("GpuIsLost",)}
    for collector, by_metric in KNOWN_ERRORS.items():
        for metric, reasons in by_metric.items():
            for reason in reasons:
                shown = f'"{reason}"' in code or (reason.startswith("http_") and "http_{" in code)
                known = shown or (collector == "nvml" and reason in nvml)
                assert known, (collector, metric, reason)
