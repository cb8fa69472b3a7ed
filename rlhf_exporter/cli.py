"""The `rlhf-exporter` command: one subcommand per module in `rlhf_exporter.commands`."""

from __future__ import annotations

import argparse
import sys
from importlib import import_module
from pathlib import Path
from types import ModuleType

from . import __version__, commands
from .thresholds_file import ConfigError


def _command_modules(argv: list[str]) -> list[ModuleType]:
    """The modules in rlhf_exporter/commands/: `register(subparsers)` adds a subparser whose
    defaults set `func`; `ORDER` places it in --help.

    When argv names a command, only that module is imported: `diagnose` does not pay for
    the HTTP server's imports.
    """
    chosen = next((a for a in argv if not a.startswith("-")), None)
    here = Path(commands.__file__).parent
    module = chosen.replace("-", "_") if chosen else None  # verl-drift: commands/verl_drift.py
    if module and (here / f"{module}.py").is_file():
        names = [module]
    else:
        names = sorted(p.stem for p in here.glob("*.py") if not p.name.startswith("_"))
    modules = [import_module(f"{commands.__name__}.{name}") for name in names]
    return sorted(modules, key=lambda m: (getattr(m, "ORDER", 50), m.__name__))


DESCRIPTION = """\
Where the throughput of verl RLHF jobs goes, as Prometheus metrics.

Every verl step is a chain of waiting windows: rollout (gen), reward, logprob
(old_log_prob, ref), update (update_actor), sync (update_weights), checkpoint, and other
(driver work and untimed data movement). The verdict of a step is the window the loop waited
on longest; the reason is the evidence that says where to look next.
"""


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlhf-exporter",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _command_modules(sys.argv[1:] if argv is None else argv):
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:  # a settings or thresholds file, a flag, an environment variable
        print(f"rlhf-exporter {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `diagnose ... | head`
        sys.stderr.close()
        return 0
