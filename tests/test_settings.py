"""Settings parsing: the layering (defaults < file < environment < flags) is exercised end to
end in test_serve_cli.py; this file pins down how single values are read."""

from __future__ import annotations

import pytest

from exporter.config import ConfigError
from exporter.settings import env_name, resolve

MAX_LINE = "RLHF_EXPORTER_MAX_LINE_BYTES"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        (" 512K ", 512 << 10),
        ("1MiB", 1 << 20),
        ("1.5M", 3 << 19),
        ("2G", 2 << 30),
        ("1GiB", 1 << 30),
    ],
)
def test_sizes(text, size):
    assert resolve(environ={MAX_LINE: text}).max_line_bytes == size


@pytest.mark.parametrize("text", ["0", "0K", "-1M", "-5", "0.0001K", "nanK", "infM", "1T", "", "K"])
def test_sizes_below_one_byte_or_unreadable_are_rejected(text):
    with pytest.raises(ConfigError) as err:
        resolve(environ={MAX_LINE: text})
    message = str(err.value)
    assert message.startswith(MAX_LINE + ":"), message  # names where the value came from
    assert "at least 1 byte" in message and repr(text) in message


def test_env_name_is_the_documented_one():
    from exporter.settings import BY_NAME

    assert env_name(BY_NAME["max_line_bytes"]) == MAX_LINE
