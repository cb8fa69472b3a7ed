"""`rlhf-exporter verl-drift`: what a verl release, a fork or a log has that the project does
not know (timers, MFU stages, the file logger, rollout server names, the keys it reads)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from ..diagnosis import Record, Thresholds
from ..drift.check import Finding, check_records, check_tree, failed
from ..drift.source import installed_verl, read_tree
from ..thresholds_file import load_thresholds
from . import thresholds_path

ORDER = 40

EPILOG = """\
examples:
  rlhf-exporter verl-drift                        # the verl installed beside the exporter
  rlhf-exporter verl-drift verl-0.10.0-py3-none-any.whl
  rlhf-exporter verl-drift ~/src/verl             # a checkout or a fork (recipe/ included)
  rlhf-exporter verl-drift $VERL_FILE_LOGGER_ROOT/my_project/my_experiment.jsonl

Each timer is listed with the group the decision table gives it, where verl calls it
(file:line) and whether that call sits inside the `step` timer ("via f": in a function that
`step` calls). A timer the table does not name still counts, in `other` and clipped to the
time the step left untimed; name it in a --thresholds file (`groups:`) to count it where it
belongs. Exit status: 0 when everything is known, 1 when something is not, 2 on bad input.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "verl-drift",
        help="list what a verl tree or log has that the exporter does not know",
        description="Read a verl source tree (the installed verl, a wheel, an sdist or a "
        "directory) without importing it, or a verl `file` logger log (.jsonl), and report "
        "every timer, perf/mfu stage, file-logger variable or record format and rollout "
        "server name that the decision table, the metric catalog or Ray discovery does not "
        "know.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "path",
        nargs="?",
        type=Path,
        metavar="PATH",
        help="a verl directory, wheel (.whl), sdist (.tar.gz) or log (.jsonl); "
        "default: the installed verl",
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument(
        "--unknown-only", action="store_true", help="list only what the project does not know"
    )
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="thresholds YAML whose timer map (groups, ignored_timers, ...) counts as known",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    th = load_thresholds(thresholds_path(args))
    path = args.path or installed_verl()
    if path is None:
        print("rlhf-exporter verl-drift: no verl is installed here; give a PATH", file=sys.stderr)
        return 2
    if not path.exists():
        print(f"rlhf-exporter verl-drift: {path}: no such file or directory", file=sys.stderr)
        return 2
    try:
        if path.is_file() and path.name.endswith((".jsonl", ".json", ".log")):
            findings, header = _log(path, th)
        else:
            tree = read_tree(path)
            findings = check_tree(tree, th)
            header = f"{path}: {tree.files} Python files read"
            if tree.skipped:
                header += f", {tree.skipped} skipped (unparsable or over the size bound)"
    except (OSError, ValueError) as exc:
        print(f"rlhf-exporter verl-drift: {exc}", file=sys.stderr)
        return 2
    bad = failed(findings)
    if args.format == "json":
        shown = [f for f in findings if not f.known] if args.unknown_only else findings
        json.dump(
            {"path": str(path), "unknown": len(bad), "findings": [f.to_json() for f in shown]},
            sys.stdout,
            indent=1,
        )
        print()
    else:
        print(render(header, findings, args.unknown_only))
    return 1 if bad else 0


def _log(path: Path, th: Thresholds) -> tuple[list[Finding], str]:
    from ..sources.verl_reader import RecordReader

    reader = RecordReader()
    count = 0

    def records() -> Iterator[Record]:  # streamed: a log of any size in bounded memory
        nonlocal count
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                for record in reader.feed(chunk):
                    count += 1
                    yield record
        reader.finish()

    findings = check_records(records(), th)
    header = f"{path}: {count} records read"
    rejected = sum(reader.rejected.values())
    if rejected:
        header += f", {rejected} lines rejected (not verl's {{step, data}} records)"
    return findings, header


KINDS = {
    "timer": "timers (timing_s/<name>)",
    "mfu_stage": "MFU stages",
    "logger_env": "file logger path variables",
    "logger_record": "file logger record format",
    "server_name": "rollout server actor names",
    "read_key": "keys the exporter reads that this tree never writes (informative)",
}


def render(header: str, findings: list[Finding], unknown_only: bool = False) -> str:
    out = [header]
    for kind, title in KINDS.items():
        rows = [f for f in findings if f.kind == kind and (not unknown_only or not f.known)]
        if not rows:
            continue
        out += ["", f"{title}:"]
        for f in rows:
            mark = "ok     " if f.known else ("UNKNOWN" if f.fatal else "absent ")
            where = ""
            if f.where:
                where = (
                    f"  [{f.where[0]}"
                    + (f"; +{len(f.where) - 1} more" if len(f.where) > 1 else "")
                    + "]"
                )
            out.append(f"  {mark} {f.name}: {f.note}{where}")
    bad = failed(findings)
    out += [
        "",
        f"{len(bad)} unknown"
        + (": " + ", ".join(sorted({f.name for f in bad})) if bad else "")
        + ("" if bad else " (everything it has is known)"),
    ]
    return "\n".join(out)
