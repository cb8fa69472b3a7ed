"""Fixtures shared by every test module."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from rlhf_exporter.config import load_thresholds

# Ray 2.60 turns token authentication on by itself when ~/.ray/auth_token exists and
# RAY_AUTH_MODE is unset: every Ray a test starts (heads, drivers, `ray job submit`, verl)
# runs without it, whatever the machine's home holds. The test that means auth
# (tests/test_ray_auth.py) starts its head with RAY_AUTH_MODE=token and a token of its own.
os.environ["RAY_AUTH_MODE"] = "disabled"


@pytest.fixture(scope="session")
def thresholds():
    return load_thresholds()


TRACES = Path(__file__).parent / "fixtures" / "traces"


@pytest.fixture(scope="session")
def sample_traces():
    """Every sample verl log, vendored in tests/fixtures/traces (as written by verl's own
    FileLogger, each with its `.expected.jsonl`): every clone runs the same tests."""
    return TRACES


RAY_MISSING = importlib.util.find_spec("ray") is None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `ray` needs a real Ray head: where Ray is not installed it skips, alone,
    so the pure tests of its module still run (no module-level importorskip for Ray)."""
    if RAY_MISSING and item.get_closest_marker("ray"):
        pytest.skip("needs Ray (pip install -e '.[test]')")
