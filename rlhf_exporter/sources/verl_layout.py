"""What the `verl` source says when its settings cannot show a job: a root one
level off, a root that is missing, a file in another format. Each is a `Problem`: a short,
fixed statement and the setting to change, never text read from a file (paths are the
operator's own settings and what is under them, shortened by `short_path`).

verl's file logger writes `$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`, so:

- `.jsonl` files directly in the root (`--verl-root` given `<root>/<project>/`): nobody reads
  them; point `--verl-root` at the directory above.
- `.jsonl` files two levels down (`ROOT/a/b/c.jsonl`: `--verl-root` given the directory
  above verl's root): point it at `ROOT/a`. Looked for only while the root shows no job, at
  most every `RELIST_EVERY` seconds, through at most `max_files` directory entries in all
  (`too_deep`), never following a symlink below the root's own folders.
- A watched file none of whose lines is a verl record (`not_verl`): what verl's format is,
  and the logger setting that writes it.

The functions here are pure (besides `too_deep`'s bounded listing), so each mistake is
tested without a server.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..metrics.snapshot import short_path
from .verl_reader import BAD_DATA, BAD_STEP, INVALID_JSON, NOT_OBJECT, NOT_UTF8

SUFFIX = ".jsonl"
# collector_errors reasons (and problem kinds): a configured root is not there
ROOT_MISSING = "root_missing"
ROOT_NOT_A_DIRECTORY = "root_not_a_directory"
ROOT_PERMISSION_DENIED = "root_permission_denied"
# problem kinds
FILES_IN_ROOT = "files_in_root"
FILES_TOO_DEEP = "files_too_deep"
NOT_VERL_RECORDS = "not_verl_records"
# the line rejections that say a line is not a verl record (not a too long or unfinished one)
FORMAT_REASONS = (NOT_UTF8, INVALID_JSON, NOT_OBJECT, BAD_STEP, BAD_DATA)

LAYOUT = "<root>/<project>/<experiment>.jsonl"
FILE_LOGGER = (
    'one {"step": N, "data": {...}} a line, written by verl\'s file logger when '
    'trainer.logger includes "file" (e.g. trainer.logger=\'["console","file"]\'), to '
    "$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl (or the one file "
    "$VERL_FILE_LOGGER_PATH names)"
)

Text = tuple[str, str]  # (message, hint)


def shown(path: str | Path) -> str:
    return short_path(str(path))


def root_text(root: str | Path, reason: str, uid: int | None = None) -> Text:
    """A configured `--verl-root` that cannot be listed."""
    where = shown(root)
    if reason == ROOT_NOT_A_DIRECTORY:
        if str(root).endswith(SUFFIX):
            return (
                f"verl root {where} is a file, not a directory",
                "--verl-root takes a directory, verl's VERL_FILE_LOGGER_ROOT (verl writes "
                f"{LAYOUT}); to read this one file give --verl-file with --project and "
                "--experiment",
            )
        return (
            f"verl root {where} is not a directory",
            "point --verl-root at verl's VERL_FILE_LOGGER_ROOT, the directory verl writes "
            "<project>/<experiment>.jsonl under",
        )
    if reason == ROOT_PERMISSION_DENIED:
        who = f"uid {uid}" if uid is not None else "its user"
        return (
            f"verl root {where} cannot be listed (permission denied)",
            f"let the exporter ({who}) read and enter it; jobs there are found once it can",
        )
    return (
        f"verl root {where} does not exist",
        "mount the volume that holds verl's VERL_FILE_LOGGER_ROOT there, or point "
        "--verl-root at that directory; jobs there are found once it exists",
    )


def files_in_root_text(root: str | Path, count: int, example: str) -> Text:
    """`.jsonl` files directly in the root: verl puts them one level down."""
    files = "a .jsonl file" if count == 1 else f"{count} .jsonl files"
    above = Path(root).parent
    return (
        f"{files} directly in verl root {shown(root)} (e.g. {shown(example)}) "
        f"{'is' if count == 1 else 'are'} not read: verl writes {LAYOUT}",
        f"these look like <experiment>.jsonl files: point --verl-root at the directory "
        f"above ({shown(above)}), or give one file with --verl-file",
    )


def too_deep_text(root: str | Path, folder: str, example: str) -> Text:
    """`.jsonl` files two levels down, and no job at the right depth."""
    return (
        f"no job under verl root {shown(root)}, but {shown(example)} is one level deeper "
        f"than {LAYOUT}",
        f"point --verl-root at {shown(folder)} (the directory that holds the <project> folders)",
    )


def not_verl(path: str | Path, records: int, rejected: Mapping[str, int]) -> Text | None:
    """A watched file that has given no verl record and whose lines were rejected as not
    verl's format; None while it is not such a file (it has a record, or no complete line)."""
    counts = {r: rejected.get(r, 0) for r in FORMAT_REASONS if rejected.get(r, 0)}
    if records or not counts:
        return None
    n = sum(counts.values())
    detail = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (
        f"{shown(path)} holds no verl record: {n} line{'s' if n != 1 else ''} rejected ({detail})",
        f"verl's records are JSONL, {FILE_LOGGER}. A saved console or driver log is read "
        "by `rlhf-exporter diagnose FILE`, and a job on Ray by the console source (--ray "
        "--console)",
    )


def too_deep(folders: Iterable[str], budget: int) -> tuple[str, str] | None:
    """The first of `folders` (the root's folders) with a subfolder that holds a `.jsonl`
    file: (that folder, the file's path), or None. Looks at `budget` directories and
    directory entries at most (each listing and each entry count one); never follows a
    symlink below `folders`; an unreadable folder is skipped."""
    left = [budget]

    def listing(path: str) -> Iterable[os.DirEntry[str]]:
        left[0] -= 1
        if left[0] < 0:
            return
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    left[0] -= 1
                    if left[0] < 0:
                        return
                    yield entry
        except OSError:
            return

    for folder in folders:
        subs = [e.path for e in listing(folder) if _is_dir(e)]
        for sub in subs:
            for entry in listing(sub):
                if entry.name.endswith(SUFFIX) and _is_file(entry):
                    return folder, entry.path
        if left[0] < 0:
            return None
    return None


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False
