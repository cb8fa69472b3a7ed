"""One module per subcommand (see rlhf_exporter/cli.py)."""

from __future__ import annotations

import argparse
import sys


def add_thresholds_argument(p: argparse.ArgumentParser) -> None:
    """`--thresholds FILE`, the thresholds file, as in `serve`; `--config` is its deprecated
    spelling here for one release (`serve --config` is the settings file)."""
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="thresholds YAML overriding any subset of the defaults "
        "(see `rlhf-exporter diagnose --print-thresholds`)",
    )
    p.add_argument(
        "--config",
        dest="deprecated_config",
        metavar="FILE",
        help="deprecated: use --thresholds (this spelling goes in the next release)",
    )


def thresholds_path(args: argparse.Namespace) -> str | None:
    """The thresholds file named by --thresholds, or by the deprecated --config (warned)."""
    old = getattr(args, "deprecated_config", None)
    if old is not None:
        print(
            f"rlhf-exporter {args.command}: warning: --config is deprecated for the thresholds "
            "file; use --thresholds (in the next release --config goes, as `serve --config` "
            "is the settings file)",
            file=sys.stderr,
        )
    return getattr(args, "thresholds", None) or old
