"""`rlhf-exporter render`: regenerate (or --check) the files built from one source of truth."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..render import MissingExtra, generators, is_checkout, repo_root, stale, write
from ..thresholds_file import load_thresholds
from . import add_thresholds_argument, thresholds_path

ORDER = 30


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    names = list(generators())
    p = subparsers.add_parser(
        "render",
        help="regenerate rules, dashboards, docs and chart files from their sources",
        description="Regenerate the files that are built from one source of truth: the alert "
        "rules from the thresholds file, the dashboards from their Python "
        "definitions, docs/metrics.md from the metric catalog, and the chart's copies. "
        "With --check, change nothing and exit 1 when a committed file is stale.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help=f"what to render: {', '.join(names)} (default: all)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if any file differs from what would be generated",
    )
    p.add_argument(
        "--root", type=Path, default=None, help="checkout to write into (default: this source tree)"
    )
    add_thresholds_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    available = generators()
    unknown = [t for t in args.targets if t not in available]
    if unknown:
        print(
            f"rlhf-exporter render: unknown target {', '.join(unknown)}; "
            f"choose from {', '.join(available)}",
            file=sys.stderr,
        )
        return 2
    thresholds = load_thresholds(thresholds_path(args))  # a ConfigError exits 2 (cli.main)
    root = args.root or repo_root()
    if args.root is None and not is_checkout(root):
        print(outside_checkout(root, args.check), file=sys.stderr)
        return 2
    # generated one target at a time, in ORDER: the chart copies what rules and dashboards
    # have just written. A target that needs a missing extra is skipped and named: after the
    # basic install `render` still writes the rules, docs and chart files.
    missing: list[MissingExtra] = []

    def files() -> Iterable[Mapping[str, str]]:
        for name in args.targets or available:
            try:
                yield available[name](thresholds)
            except MissingExtra as exc:
                missing.append(exc)

    if args.check:
        status = check(root, files(), explicit_root=args.root is not None, missing=missing)
    else:
        status = write_all(root, files())
    for exc in missing:
        print(f"rlhf-exporter render: {exc}", file=sys.stderr)
    if missing and (args.check or args.targets):
        # a check that could not compare a target does not pass, nor does a target asked
        # for by name that could not be rendered
        return max(status, 1)
    return status


def outside_checkout(root: Path, checking: bool) -> str:
    """Installed from a wheel, the package's parent (site-packages) is no checkout: say so,
    rather than call every file stale or write alerts/ and grafana/ into site-packages."""
    if checking:
        what = "compares the generated files committed in a checkout"
    else:
        what = "writes into a checkout"
    return (
        f"rlhf-exporter render: not run from a source checkout: this package is installed in "
        f"{root}, which is not one. render {what}: run it from a clone "
        "(python -m rlhf_exporter render), or pass --root DIR."
    )


def check(
    root: Path,
    files: Iterable[Mapping[str, str]],
    explicit_root: bool,
    missing: Sequence[MissingExtra] = (),
) -> int:
    """Compare the generated files; "up to date" only when every target was compared (one
    whose extra is missing was not: `missing` fills while `files` is consumed)."""
    bad = [rel for target in files for rel in stale(root, target)]
    if not bad and not missing:
        print("all generated files are up to date")
        return 0
    if not bad:
        names = ", ".join(exc.target for exc in missing)
        print(f"NOT checked: {names} (a missing extra, below); the other generated files match")
        return 1
    if explicit_root and not is_checkout(root):
        print(f"rlhf-exporter render: note: {root} is not a source checkout", file=sys.stderr)
    print("stale (run `rlhf-exporter render`):\n  " + "\n  ".join(bad), file=sys.stderr)
    return 1


def write_all(root: Path, files: Iterable[Mapping[str, str]]) -> int:
    for target in files:
        for rel in write(root, target):
            print(f"wrote {rel}")
    return 0
