"""The cost of truncation detection (issue 12): polls with vs. without the rewrite check.

    .venv/bin/python bench/truncation.py [--files 500] [--polls 20]

`--files` verl files each get one new record before every poll; the verl source polls them
all. The check fingerprints each file's first line (blake2b of up to 64 KiB, read with
pread) and compares the 64 bytes before the read offset, on every poll that finds a file
changed. Measured twice in one process: with the check, and with it replaced by a no-op.
Prints the poll time per changed file and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rlhf_exporter.demo.simulator import REGIMES, encode, records  # noqa: E402
from rlhf_exporter.sources import verl_files, verl_tail  # noqa: E402
from rlhf_exporter.thresholds_file import load_thresholds  # noqa: E402


def run(root: Path, lines: list[bytes], files: int, polls: int) -> list[float]:
    src = verl_files.VerlFileSource(load_thresholds(None), roots=[root])
    paths = []
    for i in range(files):
        d = root / f"p{i}"
        d.mkdir()
        paths.append(d / "e.jsonl")
        paths[-1].write_bytes(lines[0])
    src.poll()
    out = []
    for k in range(1, polls + 1):
        for p in paths:
            with open(p, "ab") as f:
                f.write(lines[k % len(lines)])
        t0 = time.perf_counter()
        src.poll()
        out.append((time.perf_counter() - t0) / files)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--polls", type=int, default=20)
    args = ap.parse_args()
    lines = [encode(r) for r in records([(REGIMES["sync_bound"], 40)], seed=2)]
    with tempfile.TemporaryDirectory() as a:
        checked = run(Path(a), lines, args.files, args.polls)
    real = verl_tail._rewritten
    verl_tail._rewritten = lambda fd, w: False
    try:
        with tempfile.TemporaryDirectory() as b:
            unchecked = run(Path(b), lines, args.files, args.polls)
    finally:
        verl_tail._rewritten = real
    c, u = statistics.median(checked) * 1e6, statistics.median(unchecked) * 1e6
    print(f"{args.files} files, one record appended to each before each of {args.polls} polls")
    print(
        f"poll time per changed file: with check {c:.1f} us, without {u:.1f} us, ratio {c / u:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
