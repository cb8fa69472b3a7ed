"""Ray token authentication (Ray 2.52+): the exporter sends the cluster's token as Ray expects
(`Authorization: Bearer`), from a file (a mounted Secret, re-read when it changes), a variable
or Ray's own variables; a 401 or 403 names the setting to fix. One real head runs with
`RAY_AUTH_MODE=token` and a token of its own, read without, with a wrong and with the right
token."""

from __future__ import annotations

import logging

import pytest

from rlhf_exporter.settings import resolve
from rlhf_exporter.sources.base import Context, SourceError
from rlhf_exporter.sources.ray import RaySource
from rlhf_exporter.sources.ray_token import RayToken
from rlhf_exporter.thresholds_file import ConfigError, load_thresholds

TOKEN = "c0ffee" * 8


def test_the_token_comes_from_the_settings_first_then_rays_own_variables(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")  # a Secret file's newline is stripped
    ray_env = {"RAY_AUTH_TOKEN": "from-ray-env", "RAY_AUTH_TOKEN_PATH": str(f)}
    assert RayToken.resolve(None, None, {}) is None
    assert RayToken.resolve("v", str(f), ray_env).get() == TOKEN  # the file wins
    assert RayToken.resolve("v", None, ray_env).get() == "v"
    chosen = RayToken.resolve(None, None, ray_env)
    assert chosen is not None and chosen.where == "$RAY_AUTH_TOKEN_PATH" and chosen.get() == TOKEN
    chosen = RayToken.resolve(None, None, {"RAY_AUTH_TOKEN": "from-ray-env"})
    assert chosen is not None and chosen.header() == {"Authorization": "Bearer from-ray-env"}


def test_a_rotated_token_file_is_read_again_and_a_broken_one_is_a_clear_error(tmp_path):
    f = tmp_path / "token"
    f.write_text("first")
    token = RayToken(path=str(f))
    assert token.get() == "first"
    f.write_text("second-token")
    assert token.get() == "second-token"
    f.write_text("has a space")
    with pytest.raises(SourceError) as err:
        token.get()
    assert err.value.reason == "token_file" and "space" in str(err.value)
    assert "has a space" not in str(err.value)  # the token is never shown
    f.unlink()
    with pytest.raises(SourceError, match="No such file"):
        token.get()


def test_the_settings_take_a_token_file_and_a_token_variable(tmp_path):
    s = resolve(None, {"RLHF_EXPORTER_RAY_TOKEN_FILE": "/var/run/secrets/ray/token"})
    assert s.ray_token_file == "/var/run/secrets/ray/token" and s.ray_token is None
    s = resolve(None, {"RLHF_EXPORTER_RAY_TOKEN": f" {TOKEN}\n"})
    assert s.ray_token == TOKEN
    with pytest.raises(ConfigError, match="ray_token holds a space") as err:
        resolve(None, {"RLHF_EXPORTER_RAY_TOKEN": "two words"})
    assert "two words" not in str(err.value)
    src = RaySource.from_settings(s, Context(load_thresholds()))
    assert src is not None and src.token is not None and src.token.get() == TOKEN
    assert "token from ray_token" in src.describe()
    src.close()


# -- a real Ray head with token authentication on ---------------------------------------------
pytest.importorskip("ray")
from tests.support.ray_head import RayHead  # noqa: E402
from tests.support.serve import Exporter  # noqa: E402


@pytest.fixture(scope="module")
def auth_head():
    head = RayHead("auth", token=TOKEN)
    yield head
    head.stop(grace=2)


def _poll(head: RayHead, caplog, token: RayToken | None):
    src = RaySource(head.dashboard_url, interval=60, timeout=5, token=token)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        snap = src.poll_once()
    src.close()
    return snap, " ".join(r.getMessage() for r in caplog.records)


@pytest.mark.ray
def test_an_auth_enabled_ray_head_is_read_with_its_token_only(auth_head, tmp_path, caplog):
    snap, said = _poll(auth_head, caplog, None)
    assert not snap.up and {k: n for k, n in snap.errors.items() if n} == {"http_401": 1}
    assert "token authentication on" in said and "RLHF_EXPORTER_RAY_TOKEN_FILE" in said

    snap, said = _poll(auth_head, caplog, RayToken(value="not-the-token"))
    assert not snap.up and {k: n for k, n in snap.errors.items() if n} == {"http_403": 1}
    assert "refused the token from ray_token" in said and "not-the-token" not in said

    secret = tmp_path / "auth_token"
    secret.write_text(TOKEN + "\n")
    snap, _ = _poll(auth_head, caplog, RayToken(path=str(secret)))
    assert snap.up, snap.errors
    names = {s.name for s in snap.samples}
    assert "rlhf_ray_cluster_info" in names and "rlhf_ray_actors" in names


@pytest.mark.ray
def test_serve_reads_an_auth_enabled_head_with_the_token_file_setting(auth_head, tmp_path):
    secret = tmp_path / "auth_token"
    secret.write_text(TOKEN + "\n")
    env = {"RLHF_EXPORTER_RAY_TOKEN_FILE": str(secret)}
    args = ("--ray", "--ray-address", auth_head.dashboard_url, "--ray-interval", "0.5")
    with Exporter(tmp_path / "serve", *args, env=env) as exp:
        exp.wait_for(lambda: exp.value("rlhf_ray_cluster_info") is not None, 60, "Ray read")
        assert exp.value("rlhf_exporter_collector_up", collector="ray") == 1
    with Exporter(tmp_path / "anon", *args) as exp:  # no token: down, the 401 counted
        exp.wait_for(
            lambda: exp.value(
                "rlhf_exporter_collector_errors_total", collector="ray", reason="http_401"
            ),
            60,
            "the 401 counted",
        )
        assert exp.value("rlhf_exporter_collector_up", collector="ray") == 0
        assert "RLHF_EXPORTER_RAY_TOKEN_FILE" in exp.output()
