"""The console reader's speed per MB (issue 47) vs the JSONL RecordReader's.

    .venv/bin/python bench/console_reader.py [--mb 200] [--repeat 3] [--before COMMIT]

A sidecar that starts in the middle of a job reads the trainer's whole stdout (or a driver
log) again, so the reader's MB/s is its catch-up time. Synthetic, built in memory:

- console: a job driver's log of `--mb` MB: Ray-prefixed vLLM-request-log-like lines (~150
  bytes, ANSI-coloured as Ray writes them), a verl step line (`step:N - key:np.float64(...)`,
  60 keys) every 2,000 lines, after a pprint'ed config dump;
- jsonl: `--mb` MB of the file logger's records of the same kind (60 keys), one a line.

Each is fed in 1 MiB chunks (as `diagnose` reads) to a fresh reader, best of `--repeat`;
printed: MB/s of both and the ratio (console / jsonl). `--before COMMIT` also times
sources/console_reader.py as it was at COMMIT (`git show`), on the same console log. A
figure, not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlhf_exporter.sources.console_reader import ConsoleReader
from rlhf_exporter.sources.verl_reader import RecordReader

CHUNK = 1 << 20
KEYS = [f"timing_s/{k}" for k in ("gen", "old_log_prob", "ref", "adv", "update_actor", "step")]
KEYS += [f"metric/group_{i // 6}/k{i}" for i in range(54)]


def _values(rnd: random.Random) -> dict[str, float]:
    return {k: rnd.random() * 100 for k in KEYS}


def console_log(mb: int) -> tuple[bytes, int]:
    rnd = random.Random(1)
    prefix = "\x1b[36m(TaskRunner pid=4242)\x1b[0m "
    vllm = "\x1b[36m(AsyncvLLMServer pid=777, ip=10.0.0.3)\x1b[0m "
    lines = [prefix + "{'trainer': {'experiment_name': 'bench',", prefix + " 'project_name': 'b'}}"]
    chatter = [
        vllm + f"INFO 12-05 09:00:{i % 60:02d} [logger.py:41] Received request chatcmpl-{i:08x}: "
        "prompt: 'What is 2+2?', params: SamplingParams(n=1, temperature=1.0), lora: None"
        for i in range(2000)
    ]
    block = "\n".join(chatter)
    out, size, step = [], 0, 0
    while size < mb << 20:
        step += 1
        fields = " - ".join(f"{k}:np.float64({v!r})" for k, v in _values(rnd).items())
        piece = block + "\n" + prefix + f"step:{step} - {fields}"
        out.append(piece)
        size += len(piece) + 1
    return ("\n".join(lines + out) + "\n").encode(), step


def jsonl_log(mb: int) -> tuple[bytes, int]:
    rnd = random.Random(1)
    out, size, step = [], 0, 0
    while size < mb << 20:
        step += 1
        line = json.dumps({"step": step, "data": _values(rnd)})
        out.append(line)
        size += len(line) + 1
    return ("\n".join(out) + "\n").encode(), step


def timed(make: Any, data: bytes, repeat: int) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(repeat):
        reader = make()
        t = time.perf_counter()
        n = sum(1 for i in range(0, len(data), CHUNK) for _ in reader.feed(data[i : i + CHUNK]))
        best = min(best, time.perf_counter() - t)
    return best, n


def reader_at(commit: str) -> Any:
    source = subprocess.run(
        ["git", "show", f"{commit}:rlhf_exporter/sources/console_reader.py"],
        capture_output=True, check=True, text=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "console_reader_before.py"
    path.write_text(source.replace("from ..diagnosis", "from rlhf_exporter.diagnosis").replace(
        "from .roles", "from rlhf_exporter.sources.roles"))  # fmt: skip
    spec = importlib.util.spec_from_file_location("console_reader_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ConsoleReader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", metavar="COMMIT")
    args = ap.parse_args()
    console, steps = console_log(args.mb)
    jsonl, records = jsonl_log(args.mb)
    mb_c, mb_j = len(console) / (1 << 20), len(jsonl) / (1 << 20)
    t_c, n_c = timed(ConsoleReader, console, args.repeat)
    assert n_c == steps, (n_c, steps)
    t_j, n_j = timed(RecordReader, jsonl, args.repeat)
    assert n_j == records
    print(f"console: {mb_c:.0f} MB, {steps} steps: {t_c:.2f} s, {mb_c / t_c:.0f} MB/s")
    print(f"jsonl:   {mb_j:.0f} MB, {records} records: {t_j:.2f} s, {mb_j / t_j:.0f} MB/s")
    print(f"ratio (console MB/s / jsonl MB/s): {(mb_c / t_c) / (mb_j / t_j):.1f}x")
    if args.before:
        t_b, n_b = timed(reader_at(args.before), console, args.repeat)
        print(f"console reader at {args.before}: {t_b:.2f} s, {mb_c / t_b:.0f} MB/s "
              f"({n_b} steps); now {t_b / t_c:.1f}x faster")  # fmt: skip


if __name__ == "__main__":
    main()
