"""Structured logs for `serve`: `text` (default, one readable line) or `json` (one object a line).

Fields passed with `extra={...}` (collector, reason, path, project, experiment, ...) become
`key=value` pairs in text and keys in JSON, so a log pipeline can filter on them.

A text line is one line whatever a message holds: a control character (a newline in a
directory name, a pushed label) is written as an escape (`\n`, `\x1b`), and a field value
with a space, a quote, `=` or a control character is quoted, so no input forges a line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
# LogRecord's own attributes: everything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


_ESCAPES = {i: f"\\x{i:02x}" for i in (*range(32), 127)} | {10: "\\n", 13: "\\r", 9: "\\t"}


def _one_line(text: str) -> str:
    """The text with every control character escaped (a log line stays one line)."""
    if text.isprintable():
        return text
    return "".join(
        _ESCAPES.get(ord(c), c)
        if not c.isprintable() and ord(c) < 0xA0
        else (c if c.isprintable() else f"\\u{ord(c):04x}")
        for c in text
    )


def _timestamp(record: logging.LogRecord) -> str:
    t = time.gmtime(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname.lower(), _one_line(record.getMessage())]
        for key, value in _fields(record).items():
            text = str(value)
            plain = text and text.isprintable() and not any(c in text for c in ' "=')
            parts.append(f"{key}={text if plain else json.dumps(text)}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            obj[key] = value if isinstance(value, (int, float, bool, type(None))) else str(value)
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


def configure(fmt: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
    """Send the package's logs (and warnings from libraries) to `stream` (stderr)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if level.lower() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("rlhf_exporter").setLevel(level.upper())
