"""The dashboard queries that changed since a commit, timed side by side (issue 37).

    .venv/bin/python bench/dashboard_ab.py --workdir DIR [--rev a057f8c~1] [--rounds 5]

DIR is a TSDB kept by `bench/dashboard_cost.py --workdir DIR` (1,000 jobs, `--hours` of
history, the recording rules backfilled, the current ones included: dashboard_cost.py
backfills the records a kept TSDB lacks). Every query of `grafana/*.json` whose expression
differs from the one at `--rev` runs in both versions, old and new in turn (old new old new
...), over 6 h and 24 h as Grafana runs it (the step, `$__range`, the variables: the same
code as dashboard_cost.py). Printed: the median and min wall ms of each, the samples read
(`totalQueryableSamples`) and the new/old ratio. A shared machine moves both sides alike:
read the ratio. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from dashboard_cost import SCRAPE, panel_queries, run_query, start_prometheus  # noqa: E402


def old_queries(rev: str, name: str) -> dict[tuple[str, str], dict]:
    text = subprocess.run(
        ["git", "show", f"{rev}:grafana/{name}"], cwd=REPO, capture_output=True, check=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(text)
        return {(q["panel"], q["ref"]): q for q in panel_queries(path)}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--rev", default="a057f8c~1", help="the commit the old queries come from")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    info = json.loads((args.workdir / "history.json").read_text())
    end = info["end"] - SCRAPE
    pairs = []
    for path in sorted((REPO / "grafana").glob("*.json")):
        old = old_queries(args.rev, path.name)
        for q in panel_queries(path):
            before = old.get((q["panel"], q["ref"]))
            if before is not None and before["expr"] != q["expr"]:
                pairs.append((before, q))
    print(f"{len(pairs)} changed queries; {info['jobs']} jobs, history ends {info['end']}")
    print("| panel | range | old ms (median, min) | new ms (median, min) | old samples | "
          "new samples | new/old |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    prom = start_prometheus(args.workdir / "prom")
    try:
        for old, new in pairs:
            for range_s in (21600, 86400):
                times: dict[str, list[float]] = {"old": [], "new": []}
                samples = {}
                for q in (old, new):  # warm: a running Prometheus has its blocks cached
                    run_query(prom.url, q, range_s, end)
                for _ in range(args.rounds):
                    for side, q in (("old", old), ("new", new)):
                        r = run_query(prom.url, q, range_s, end)
                        times[side].append(r["wall"] * 1000)
                        samples[side] = r.get("samples", 0)
                mo, mn = statistics.median(times["old"]), statistics.median(times["new"])
                print(
                    f"| {new['panel'][:48]} | {range_s // 3600} h | {mo:.0f}, "
                    f"{min(times['old']):.0f} | {mn:.0f}, {min(times['new']):.0f} | "
                    f"{samples['old']:,} | {samples['new']:,} | {mn / mo:.2f} |",
                    flush=True,
                )
    finally:
        prom.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
