"""Settings parsing: the layering (defaults < file < environment < flags) is exercised end to
end in test_serve_cli.py; this file pins down how single values are read."""

from __future__ import annotations

import pytest

from rlhf_exporter.settings import env_name, resolve
from rlhf_exporter.thresholds_file import ConfigError

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
    from rlhf_exporter.options import BY_NAME

    assert env_name(BY_NAME["max_line_bytes"]) == MAX_LINE


def test_log_level_is_checked_with_the_other_settings():
    assert resolve(environ={"RLHF_EXPORTER_LOG_LEVEL": " WARNING "}).log_level == "warning"
    with pytest.raises(ConfigError, match="RLHF_EXPORTER_LOG_LEVEL: expected one of debug"):
        resolve(environ={"RLHF_EXPORTER_LOG_LEVEL": "loud"})


@pytest.mark.parametrize("command", ["diagnose", "render", "serve"])
def test_a_config_error_exits_2_naming_the_command(command, tmp_path, capsys):
    """One handler (cli.main) for every command: the message, then exit status 2."""
    from rlhf_exporter import cli

    missing = tmp_path / "absent.yaml"
    flag = "--config" if command == "serve" else "--thresholds"  # one meaning per flag
    assert cli.main([command, flag, str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlhf-exporter {command}: {missing}: cannot read"), err


@pytest.mark.parametrize("command", ["diagnose", "render"])
def test_config_is_a_deprecated_alias_of_thresholds_outside_serve(command, tmp_path, capsys):
    """`--thresholds` names the thresholds file everywhere; `diagnose --config` and `render
    --config` still work for one release, with a warning."""
    from rlhf_exporter import cli

    bad = tmp_path / "bad.yaml"
    bad.write_text("verdict:\n  min_share: lots\n")
    assert cli.main([command, "--config", str(bad)]) == 2  # the file is read: its error
    err = capsys.readouterr().err
    assert f"rlhf-exporter {command}: warning: --config is deprecated" in err
    assert "use --thresholds" in err and "verdict.min_share: expected a number" in err
    assert cli.main([command, "--thresholds", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "warning:" not in err and "verdict.min_share: expected a number" in err


def test_the_example_settings_file_loads_and_names_every_setting():
    """examples/exporter.yaml is what `serve --config` reads: it loads, its active keys take
    effect, and every setting is in it (commented out at its default, or set)."""
    import re
    from pathlib import Path

    from rlhf_exporter.options import OPTIONS

    path = Path(__file__).resolve().parents[1] / "examples" / "exporter.yaml"
    settings = resolve(environ={}, config_path=str(path))
    assert settings.listen == "127.0.0.1:19839" and settings.verl_root == ["/logs"]
    assert settings.job_expiry == 86400.0 and settings.ray_interval == 15.0
    keys = re.findall(r"^(?:# )?([a-z_]+): ", path.read_text(), flags=re.M)
    assert sorted(keys) == sorted(o.name for o in OPTIONS)
    # uncommented, every default is accepted as written
    text = re.sub(r"^# ([a-z_]+: )", r"\1", path.read_text(), flags=re.M)
    whole = path.parent / "exporter.all.yaml"
    try:
        whole.write_text(text)
        every = resolve(environ={}, config_path=str(whole))
    finally:
        whole.unlink()
    assert every.max_line_bytes == 1 << 20 and every.push is True


def test_the_settings_fields_are_the_option_table():
    """One place of truth: the typed `Settings` (what mypy checks every use against) has one
    field per Option, in the table's order, and each option's default is of its field's type
    (so a new Option without its field, or a field whose type lies, fails here)."""
    import dataclasses
    import types
    import typing

    from rlhf_exporter import settings
    from rlhf_exporter.options import OPTIONS

    fields = [f.name for f in dataclasses.fields(settings.Settings)]
    assert fields == [o.name for o in OPTIONS]
    hints = typing.get_type_hints(settings.Settings)

    def fits(value, hint) -> bool:
        if isinstance(hint, types.UnionType):
            return any(fits(value, h) for h in typing.get_args(hint))
        if hint is type(None):
            return value is None
        if typing.get_origin(hint) is list:
            (item,) = typing.get_args(hint)
            return isinstance(value, list) and all(fits(v, item) for v in value)
        if hint is float:
            return type(value) in (int, float)
        return type(value) is hint

    wrong = {o.name: hints[o.name] for o in OPTIONS if not fits(o.default, hints[o.name])}
    assert wrong == {}
    resolved = settings.resolve(None, {})
    wrong = {n: hints[n] for n in fields if not fits(getattr(resolved, n), hints[n])}
    assert wrong == {}
    assert fits(None, hints["gpu_roles"]) and not fits(None, hints["listen"])
