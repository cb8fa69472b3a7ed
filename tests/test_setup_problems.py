"""Mistakes named where the user looks (issue 48): a verl root with its `.jsonl` files at the
wrong depth, a missing root, a file in another format, and an exporter whose settings give it
no source that can ever see a job. Each is a `Problem` the source publishes: on `/`, in the
log once (and once when it clears), and in `GET /api/v1/status`; `/readyz` answers 503 for
an exporter that can never see a job, never for one whose source is merely broken.

The detection is tested on the source itself (poll by poll); one real `serve` shows the
endpoints; the chart's head and worker sidecars, started as their rendered pod specs say,
still become ready.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest

from rlhf_exporter import logs
from rlhf_exporter.commands.diagnose import no_record_message
from rlhf_exporter.demo.simulator import REGIMES, write_jsonl
from rlhf_exporter.metrics.snapshot import PATH_SHOWN, Problem, Snapshot
from rlhf_exporter.server import Endpoints
from rlhf_exporter.sources import verl_layout
from rlhf_exporter.sources.verl_files import VerlFileSource
from rlhf_exporter.thresholds_file import load_thresholds
from rlhf_exporter.view.pages import Facts, Links, index_page
from tests.support.procs import REPO, exporter_cmd, free_port
from tests.support.serve import Exporter


@pytest.fixture(scope="module")
def th():
    return load_thresholds()


@pytest.fixture
def log_lines():
    """What the exporter logs, as text lines (the configured text format)."""
    stream = io.StringIO()
    logs.configure("text", "info", stream)
    try:
        yield lambda: stream.getvalue().splitlines()
    finally:
        logging.getLogger().handlers.clear()


def job(path: Path, steps: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(path, [(REGIMES["balanced"], steps)])


def kinds(snap) -> dict[str, Problem]:
    return {p.kind: p for p in snap.problems}


def polls(src: VerlFileSource, n: int = 3):
    for _ in range(n):
        snap = src.poll_once()
    return snap


# -- each mistake, on the source ----------------------------------------------------------


def test_jsonl_files_directly_in_the_root_say_to_point_at_the_directory_above(tmp_path, th):
    project = tmp_path / "logs" / "proj"  # --verl-root given <root>/<project>/
    job(project / "exp1.jsonl")
    job(project / "exp2.jsonl")
    snap = polls(VerlFileSource(th, [project]))
    assert not snap.parts  # no job: the files are one level too shallow
    found = kinds(snap)["files_in_root"]
    assert found.source == "verl"
    assert "2 .jsonl files directly in verl root" in found.message, found
    assert str(project) in found.message
    assert "<experiment>.jsonl" in found.hint
    assert f"point --verl-root at the directory above ({tmp_path / 'logs'})" in found.hint


def test_jsonl_files_two_levels_down_name_the_root_to_point_at(tmp_path, th):
    above = tmp_path / "mnt"  # --verl-root given the directory above verl's root
    job(above / "verl-logs" / "proj" / "exp.jsonl")
    snap = polls(VerlFileSource(th, [above]))
    assert not snap.parts
    found = kinds(snap)["files_too_deep"]
    assert "one level deeper than <root>/<project>/<experiment>.jsonl" in found.message
    assert str(above / "verl-logs" / "proj" / "exp.jsonl") in found.message
    assert found.hint.startswith(f"point --verl-root at {above / 'verl-logs'} ")


def test_a_root_with_a_job_at_the_right_depth_is_no_problem(tmp_path, th):
    root = tmp_path / "logs"
    job(root / "proj" / "exp.jsonl")
    (root / "proj" / "rollout_dumps").mkdir()  # verl's rollout_data_dir: <step>.jsonl files
    (root / "proj" / "rollout_dumps" / "1.jsonl").write_text("{}\n")
    snap = polls(VerlFileSource(th, [root]))
    assert len(snap.parts) == 1 and snap.problems == ()


def test_a_missing_root_is_named_and_clears_once_mounted(tmp_path, th, log_lines):
    root = tmp_path / "logs"
    src = VerlFileSource(th, [root])
    snap = polls(src, 5)
    assert not snap.up
    found = kinds(snap)["root_missing"]
    assert found.message == f"verl root {root} does not exist"
    assert "VERL_FILE_LOGGER_ROOT" in found.hint and "--verl-root" in found.hint
    job(root / "p" / "e.jsonl")
    snap = polls(src, 3)
    assert snap.up and snap.problems == ()
    said = [line for line in log_lines() if "(root_missing)" in line]
    assert len(said) == 2, log_lines()  # once, not once per poll; and once when it clears
    assert " warning " in said[0] and " info " in said[1] and "resolved" in said[1]


def test_a_root_that_is_a_jsonl_file_says_to_give_it_as_verl_file(tmp_path, th):
    path = tmp_path / "run.jsonl"
    job(path)
    found = kinds(polls(VerlFileSource(th, [path])))["root_not_a_directory"]
    assert found.message == f"verl root {path} is a file, not a directory"
    assert "--verl-file" in found.hint


def test_a_file_in_another_format_names_the_logger_setting_that_writes_verls(tmp_path, th):
    path = tmp_path / "logs" / "proj" / "notes.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"level": "info", "msg": "secret-token-123"}\nstep:1 - loss:0.5\n{"a": 1}\n')
    src = VerlFileSource(th, [tmp_path / "logs"])
    found = kinds(polls(src))["not_verl_records"]
    assert "holds no verl record: 3 lines rejected (2 bad_step, 1 invalid_json)" in found.message
    for words in ('trainer.logger includes "file"', "VERL_FILE_LOGGER_ROOT", '{"step": N'):
        assert words in found.hint, found.hint
    assert "secret-token-123" not in found.message + found.hint  # never the file's text
    with path.open("a") as f:  # verl starts writing to it: the problem clears
        f.write(json.dumps({"step": 1, "data": {"timing_s/step": 10.0}}) + "\n")
    assert "not_verl_records" not in kinds(polls(src, 2))


def test_a_problem_is_logged_once_and_its_clearing_once(tmp_path, th, log_lines):
    root = tmp_path / "logs"
    job(root / "p" / "e.jsonl")
    stray = root / "e2.jsonl"
    job(stray)
    src = VerlFileSource(th, [root])
    polls(src, 5)
    stray.unlink()
    polls(src, 5)
    said = [line for line in log_lines() if "(files_in_root)" in line]
    assert len(said) == 2, log_lines()
    assert " warning " in said[0] and "point --verl-root at" in said[0]
    assert " info " in said[1] and "resolved" in said[1]


# -- bad input never crashes it, and costs a bounded look ---------------------------------


def test_hostile_trees_are_named_without_crashing(tmp_path, th):
    root = tmp_path / "logs"
    (root / "a").mkdir(parents=True)
    (root / "a" / "loop").symlink_to(root / "a" / "loop")  # a looping symlink two levels down
    (root / "a" / "up").symlink_to(root)  # a symlink back up: never followed below the root
    (root / "b").mkdir()
    (root / "b" / "locked").mkdir()
    os.chmod(root / "b" / "locked", 0)
    (root / "c" / "run").mkdir(parents=True)
    os.mkfifo(root / "c" / "run" / "x.jsonl")
    try:
        snap = polls(VerlFileSource(th, [root]))
    finally:
        os.chmod(root / "b" / "locked", 0o755)
    assert snap.up
    assert "files_too_deep" not in kinds(snap)  # a FIFO is no log file
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # the root itself a symlink loop: named as not there
    assert kinds(polls(VerlFileSource(th, [loop])))["root_missing"]


def test_the_deep_look_is_bounded_and_not_repeated_every_poll(tmp_path, th, monkeypatch):
    root = tmp_path / "logs"
    for i in range(300):
        (root / f"p{i:03d}" / "sub").mkdir(parents=True)
    job(root / "p299" / "sub" / "late.jsonl")  # beyond a budget of 50 entries
    seen: list[str] = []
    real = os.scandir

    def scandir(path="."):
        seen.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(verl_layout.os, "scandir", scandir)
    assert verl_layout.too_deep(sorted(str(p) for p in root.iterdir()), 50) is None
    assert len(seen) <= 50
    found = verl_layout.too_deep(sorted(str(p) for p in root.iterdir()), 5000)
    assert found == (str(root / "p299"), str(root / "p299" / "sub" / "late.jsonl"))
    monkeypatch.setattr(verl_layout.os, "scandir", real)
    looks: list[int] = []
    real_look = verl_layout.too_deep

    def too_deep(folders, budget):
        looks.append(budget)
        return real_look(folders, budget)

    monkeypatch.setattr(verl_layout, "too_deep", too_deep)
    src = VerlFileSource(th, [root], max_files=5000)
    assert "files_too_deep" in kinds(src.poll_once())
    polls(src, 5)
    assert looks == [5000]  # bounded by max_files, and not again before RELIST_EVERY


def test_a_long_path_is_shown_shortened(tmp_path, th):
    deep = tmp_path
    for i in range(6):
        deep = deep / (f"{i}" * 60)
    root = deep / "proj"
    job(root / "e.jsonl")
    (found,) = polls(VerlFileSource(th, [root])).problems
    assert len(found.message) < 2 * PATH_SHOWN + 200 and "..." in found.message


# -- where the user looks -----------------------------------------------------------------


def test_the_landing_page_shows_each_problem_escaped():
    bad = Problem("verl", "files_in_root", "verl root /x/<script>alert(1)</script>", "h & more")
    snap = Snapshot("verl", True, 0.01, time.time(), problems=(bad,))
    page = index_page([], [snap], Facts("1", "http://h", "verl"), Links.served())
    assert '<li class="problem" data-kind="files_in_root">' in page
    assert "&lt;script&gt;" in page and "<script>" not in page and "h &amp; more" in page
    assert page.index('class="problems"') < page.index("No verl job seen yet")


def test_readyz_names_the_settings_when_no_source_can_ever_see_a_job():
    blind = Problem("exporter", "no_job_source", "no source can see a job", "add --verl-root DIR")
    endpoints = Endpoints([], blind=blind)
    assert endpoints.not_ready() == "no source can see a job: add --verl-root DIR"
    status = endpoints.status()
    assert status["ready"] is False and status["problems"][0]["kind"] == "no_job_source"


def test_diagnose_on_another_format_says_what_it_expects_and_keeps_the_counts(tmp_path):
    text = no_record_message("x.jsonl", {"invalid_json": 1, "bad_step": 2})
    assert "no verl record found: 3 lines rejected (2 bad_step, 1 invalid_json)" in text
    for words in ('trainer.logger includes "file"', "VERL_FILE_LOGGER_ROOT", "step:N - "):
        assert words in text
    path = tmp_path / "app.jsonl"
    path.write_text('{"level": "info"}\n{"a": 1}\nnot json\n')
    out = subprocess.run(
        exporter_cmd("diagnose", str(path)), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1
    assert "3 lines rejected (2 bad_step, 1 invalid_json)" in out.stderr
    assert "VERL_FILE_LOGGER_ROOT" in out.stderr and '"file"' in out.stderr


# -- a real serve ----------------------------------------------------------------------------


def test_serve_that_can_never_see_a_job_is_not_ready_and_says_which_settings(tmp_path):
    args = ("--no-push", "--no-ray", "--no-nvml", "--verl-interval", "0.2")
    with Exporter(tmp_path, *args, defaults=False, ready=False) as exp:
        text = exp.wait_for(lambda: (r := exp.get("/readyz")).status_code == 503 and r.text)
        assert text.startswith("not ready: no source of this exporter can ever see a verl job")
        assert "--verl-root" in text and "--push" in text and "--console" in text
        assert text.count("\n") == 1  # one line
        status = exp.get("/api/v1/status").json()
        assert status["ready"] is False and status["sources"] == []
        assert [p["kind"] for p in status["problems"]] == ["no_job_source"]
        assert "No source here can see a verl job" in exp.get("/").text
    assert exp.output().count("(no_job_source)") == 1


def test_serve_with_a_root_one_level_off_says_so_on_every_surface(tmp_path):
    project = tmp_path / "logs" / "proj"
    job(project / "exp.jsonl")
    with Exporter(tmp_path / "serve", "--verl-root", str(project)) as exp:
        assert exp.get("/readyz").status_code == 200  # a mistake, not unreadiness
        status = exp.wait_for(lambda: (s := exp.get("/api/v1/status").json())["problems"] and s)
        (problem,) = status["problems"]
        assert problem["source"] == "verl" and problem["kind"] == "files_in_root"
        assert set(problem) == {"source", "kind", "message", "hint"}
        (verl,) = [s for s in status["sources"] if s["source"] == "verl"]
        assert verl["up"] is True and verl["last_success"] and verl["state"] == "up"
        assert exp.get("/api/v1/jobs").json() == {"jobs": []}
        page = exp.get("/").text
        assert 'data-kind="files_in_root"' in page and "point --verl-root at" in page
        time.sleep(1.0)  # several polls
    assert exp.output().count("(files_in_root)") == 1


def test_a_gpu_only_exporter_is_ready_without_a_job_source(tmp_path):
    """A GPU worker's sidecar (NVML only, no job source) serves its GPUs: ready."""
    args = ("--no-push", "--no-ray", "--nvml", "--nvml-interval", "0.2")
    with Exporter(tmp_path, *args, defaults=False) as exp:
        assert exp.get("/readyz").status_code == 200
        assert exp.get("/api/v1/status").json()["problems"] == []


def test_the_charts_head_and_worker_sidecars_become_ready(tmp_path_factory, tmp_path):
    """The chart's sidecars as their rendered pod specs start them (no logs volume: the
    head reads jobs through Ray's console source; a worker serves its GPUs): both ready,
    neither named as an exporter that can never see a job."""
    pytest.importorskip("helm_python")
    from tests.support.chart import copy_example, rayjob_of, render
    from tests.support.rendered_pods import pod_env, ray_pod_templates, sidecar, substitute

    example = copy_example(tmp_path_factory)
    values = {"rlhf-exporter": {"sidecar": {"logsVolume": ""}}}
    templates = ray_pod_templates(rayjob_of(render(values, chart=example)))
    assert set(templates) >= {"head"} and len(templates) >= 2
    for name, template in templates.items():
        side = sidecar(template)
        refs = [e["valueFrom"]["secretKeyRef"] for e in side["env"] if "secretKeyRef" in
                e.get("valueFrom", {})]  # fmt: skip
        labels = {**template["metadata"]["labels"], "ray.io/cluster": "grpo"}
        env = pod_env(side, labels, "ray-jobs", {f"{r['name']}/{r['key']}": "t" for r in refs})
        assert "RLHF_EXPORTER_VERL_ROOT" not in env
        closed = f"http://127.0.0.1:{free_port()}"  # no Ray, no head sidecar here
        subs = {k: closed for k in ("RLHF_EXPORTER_RAY_ADDRESS", "RLHF_EXPORTER_GPU_WINDOWS_FROM")
                if k in env}  # fmt: skip
        env = substitute(env, RLHF_EXPORTER_LISTEN=f"127.0.0.1:{free_port()}", **subs)
        env["PYTHONPATH"] = str(REPO)
        with Exporter(tmp_path / name, defaults=False, env=env) as exp:  # /readyz 200
            status = exp.get("/api/v1/status").json()
            assert status["ready"] is True, status
            assert "no_job_source" not in [p["kind"] for p in status["problems"]]
            sources = {s["source"] for s in status["sources"]}
            assert ("console" in sources) if name == "head" else ("nvml" in sources), sources


def test_the_chart_refuses_a_head_sidecar_that_could_never_see_a_job(tmp_path_factory):
    """Console off, no logs volume, push off: the head sidecar's /readyz would answer 503
    for good and keep the head pod out of its Service; the chart says so at render time."""
    helm = pytest.importorskip("helm_python")
    from tests.support.chart import copy_example, render

    example = copy_example(tmp_path_factory)
    off = {"sidecar": {"logsVolume": "", "head": {"console": False}}}
    with pytest.raises(helm.HelmRenderError) as caught:
        render({"rlhf-exporter": off}, chart=example)
    assert "never become ready" in str(caught.value) and "sidecar.head.console" in str(caught.value)
    on = {"sidecar": {"logsVolume": "", "head": {"console": False, "nvml": True}}}
    assert render({"rlhf-exporter": on}, chart=example)  # a GPU head serves its GPUs: ready
