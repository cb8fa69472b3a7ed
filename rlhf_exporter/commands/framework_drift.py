"""`rlhf-exporter framework-drift`: the timing keys a release of OpenRLHF, AReaL, NeMo-RL, slime
or ROLL writes that its mapping does not know."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..drift.frameworks import RULES, Key, check, read_keys

ORDER = 41

EPILOG = """\
examples:
  pip download --no-deps openrlhf==0.11.2 -d /tmp/w
  rlhf-exporter framework-drift --framework openrlhf /tmp/w/openrlhf-0.11.2-*.whl
  rlhf-exporter framework-drift --framework slime ~/src/slime          # a checkout

Each key is listed with what the mapping makes of it and where the release writes it
(file:line). A key the mapping does not know still counts: as an unnamed timer, in `other`
and clipped to the time the step left untimed (docs/decision-table.md). Exit status: 0 when
every key is known, 1 when one is not, 2 on bad input.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "framework-drift",
        help="list the timing keys a framework release writes that its mapping does not know",
        description="Read a release of a framework beyond verl (a directory, wheel or sdist) "
        "without importing it, and report every timing key it writes that the exporter's "
        "mapping of that framework does not know (docs/frameworks.md).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--framework", required=True, choices=sorted(RULES), help="which framework")
    p.add_argument(
        "path", type=Path, metavar="PATH", help="the release: directory, .whl or .tar.gz"
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument("--unknown-only", action="store_true", help="list only the unknown keys")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    name = "rlhf-exporter framework-drift"
    if not args.path.exists():
        print(f"{name}: {args.path}: no such file or directory", file=sys.stderr)
        return 2
    try:
        keys, files = read_keys(args.framework, args.path)
    except (OSError, ValueError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    if not files:
        print(f"{name}: {args.path}: no {args.framework} source found", file=sys.stderr)
        return 2
    found = check(args.framework, keys)
    unknown = [k for k in found if not k.known]
    shown = unknown if args.unknown_only else found
    if args.format == "json":
        rows = [{"key": k.key, "known": k.known, "note": k.note, "where": k.where} for k in shown]
        doc = {"framework": args.framework, "path": str(args.path), "files": files}
        json.dump({**doc, "unknown": len(unknown), "keys": rows}, sys.stdout, indent=1)
        print()
    else:
        print(render(args.framework, args.path, files, shown, unknown))
    return 1 if unknown else 0


def render(framework: str, path: Path, files: int, shown: list[Key], unknown: list[Key]) -> str:
    out = [f"{path}: {framework}, {files} Python files read", "", "timing keys:"]
    for k in shown:
        more = f"; +{len(k.where) - 1} more" if len(k.where) > 1 else ""
        mark = "ok     " if k.known else "UNKNOWN"
        out.append(f"  {mark} {k.key}: {k.note}  [{k.where[0]}{more}]")
    names = ", ".join(k.key for k in unknown)
    out += [
        "",
        f"{len(unknown)} unknown" + (f": {names}" if unknown else " (the mapping knows them all)"),
    ]
    return "\n".join(out)
