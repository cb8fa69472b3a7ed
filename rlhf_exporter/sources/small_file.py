"""Small files that anyone beside a job may write, read so that none can hang or flood a source.

Target lists (sources/engine_targets.py) and the marker files beside a verl log
(`<experiment>.total_steps`, sources/verl_files.py) are opened non-blocking (a FIFO never
blocks the poll), must be regular files (a symlink to /dev/zero or a FIFO is refused, whatever
`st_size` says), and are read to a cap.
"""

from __future__ import annotations

import os
import stat

NOT_REGULAR = "not_regular"
TOO_LARGE = "too_large"
UNREADABLE = "unreadable"


class SmallFileError(Exception):
    """A file that is there but cannot be read as a small regular file (`reason`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def read_small(path: str, cap: int) -> bytes:
    """At most `cap` bytes of a regular file. FileNotFoundError when it is not there;
    SmallFileError (not_regular, too_large, unreadable) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError:
        raise SmallFileError(UNREADABLE) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SmallFileError(NOT_REGULAR)
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 16, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise SmallFileError(TOO_LARGE)
        return b"".join(chunks)
    except OSError:
        raise SmallFileError(UNREADABLE) from None
    finally:
        os.close(fd)
