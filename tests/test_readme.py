"""The README works when followed literally: its code blocks run in order, in a copy of this
checkout, with a fresh virtualenv and nothing of the test environment on PATH.

- A `bash` block's lines are commands (comment-only lines are skipped, as bash does).
- A `console` block's `$ ` lines are commands; the lines under one are its output, and each
  (but `...`) must appear in what the command prints (at COLUMNS=100, as written).
- A `serve` command runs until stopped: it runs with a deadline until its `/metrics` and `/`
  answer (the first, `serve --demo`, until the demo job has steps and only the demo's
  collectors), then is stopped. Each listens on a free port (RLHF_EXPORTER_LISTEN), so a
  running exporter on the default port does not get in the way.
- SKIP: lines that cannot run here, each with its reason; the list is small and each entry
  must match the README (it cannot go stale).

Slow: a fresh virtualenv, the basic install, then `scripts/test.sh`'s test extra (about
900 MB from the package index) and its lint and type checks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.procs import free_port
from tests.support.serve import parse_samples

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SKIP = {
    "bash scripts/test.sh": "the whole suite, this test included (it would run itself)",
    "SKIP_IMAGE=1 bash scripts/test.sh": "the whole suite again, without the image build",
    "sudo bash scripts/build-image.sh": (
        "builds the container image as root (debootstrap + buildah, minutes): scripts/test.sh "
        "runs it before pytest, and tests/test_image.py runs the image it builds"
    ),
    "skopeo copy oci-archive:build/image/rlhf-exporter-0.1.0.oci.tar docker://registry.example.org/ml/rlhf-exporter:0.1.0": (
        "pushes to the user's registry, which does not exist here"
    ),
    "helm install rlhf build/artifacts/rlhf-exporter-0.1.0.tgz -n monitoring -f rlhf-values.yaml": (
        "needs a Kubernetes cluster: tests/test_chart_package.py renders that package with "
        "the README's values file with the real Helm engine instead"
    ),
}
SKIP_COUNT = 6  # the suite (first block, twice in Develop), the image build, its push, helm install
INSTALL_DEADLINE = 900.0  # the first command creates the virtualenv and installs, then serves
SERVE_DEADLINE = 60.0


def blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block, in order."""
    return [
        (m.group(1), m.group(2).splitlines())
        for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, flags=re.M | re.S)
    ]


def commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, expected output lines) in README order; comment-only lines dropped."""
    out: list[tuple[str, list[str]]] = []
    for lang, lines in blocks(text):
        if lang == "bash":
            out += [
                (line, []) for line in lines if line.strip() and not line.lstrip().startswith("#")
            ]
        elif lang == "console":
            for line in lines:
                if line.startswith("$ "):
                    out.append((line[2:], []))
                elif out:
                    out[-1][1].append(line)
    return out


def bare(command: str) -> str:
    """The command without its trailing comment."""
    return command.split("  #")[0].strip()


def copy_checkout(dest: Path) -> Path:
    """The checkout's files as a clone has them (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, (p.decode() for p in listed)):
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def clean_env(home: Path) -> dict[str, str]:
    """A new user's shell: no virtualenv and no checkout on the paths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXPORTER_")}
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
        env.pop(key, None)
    venv_bins = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p not in venv_bins
    )
    env["HOME"] = str(home)
    return env


def serve(command: str, cwd: Path, env: dict[str, str], deadline: float, demo: bool) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = cwd.parent / f"serve-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env={**env, "RLHF_EXPORTER_LISTEN": f"127.0.0.1:{port}"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        end = time.monotonic() + deadline
        while True:
            assert proc.poll() is None, f"{command!r} exited {proc.returncode}:\n{log.read_text()}"
            try:
                metrics = requests.get(url + "/metrics", timeout=5)
                steps = [
                    v
                    for (n, _), v in parse_samples(metrics.text).items()
                    if n == "rlhf_steps_total"
                ]
                if metrics.status_code == 200 and (not demo or any(steps)):
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < end, f"{command!r}: no /metrics in time:\n{log.read_text()}"
            time.sleep(1.0)
        page = requests.get(url + "/", timeout=10)
        assert page.status_code == 200
        if demo:
            up = {
                dict(labels)["collector"]: v
                for (n, labels), v in parse_samples(metrics.text).items()
                if n == "rlhf_exporter_collector_up"
            }
            # no real Ray or NVML; engines and stacks read the demo's simulated vLLMs and Ray
            assert up == {"verl": 1.0, "push": 1.0, "demo": 1.0, "engines": 1.0, "stacks": 1.0}, up
            assert "Demo data" in page.text and 'data-up="0"' not in page.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_readme_commands_parse_and_the_skip_list_matches():
    """Cheap half: the README's commands are found, each skip names real lines, every command
    after the first runs the virtualenv's program by its path."""
    cmds = commands((ROOT / "README.md").read_text())
    assert len(cmds) >= 15
    skipped = [c for c, _ in cmds if bare(c) in SKIP]
    assert len(skipped) == SKIP_COUNT, skipped
    for command, _ in cmds:  # a run of the whole suite would run this test again, and again
        if "scripts/test.sh" in command and bare(command) not in SKIP:
            assert " tests/" in bare(command), f"the whole suite, not skipped: {command}"
    first = cmds[0][0]
    assert first.startswith("python3 -m venv .venv && .venv/bin/pip install -e . && ")
    for command, _ in cmds[1:]:
        words = bare(command).split()
        assert "rlhf-exporter" not in words, f"a bare rlhf-exporter: {command}"


def test_readme_runs_as_written_in_a_fresh_venv(tmp_path):
    text = (ROOT / "README.md").read_text()
    checkout = copy_checkout(tmp_path / "checkout")
    env = clean_env(tmp_path)
    ran = []
    for i, (command, expected) in enumerate(commands(text)):
        if bare(command) in SKIP:
            continue
        if " serve" in bare(command):
            serve(
                command,
                checkout,
                env,
                INSTALL_DEADLINE if i == 0 else SERVE_DEADLINE,
                demo="--demo" in command,
            )
        else:
            r = subprocess.run(
                ["bash", "-c", command],
                cwd=checkout,
                env={**env, "COLUMNS": "100"} if expected else env,
                capture_output=True,
                text=True,
                timeout=INSTALL_DEADLINE,
            )
            assert r.returncode == 0, (
                f"{command!r} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            )
            for line in expected:
                if line.strip() and line.strip() != "...":
                    assert line.rstrip() in r.stdout, f"{command!r}: no line {line!r}"
        ran.append(command)
    assert len(ran) >= 13
    assert (checkout / ".venv" / "bin" / "rlhf-exporter").is_file()
