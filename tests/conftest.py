"""Fixtures shared by every test module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlhf_exporter.config import load_thresholds
from tests.support.procs import TRACES


@pytest.fixture(scope="session")
def thresholds():
    return load_thresholds()


VENDORED_TRACES = Path(__file__).parent / "fixtures" / "traces"


@pytest.fixture(scope="session")
def sample_traces():
    """Every sample verl log: ../shared/traces where it exists, else the ones vendored in
    tests/fixtures/traces (a user's clone)."""
    return TRACES if TRACES.is_dir() else VENDORED_TRACES


@pytest.fixture(scope="session")
def shared_traces():
    """../shared/traces (the sample verl logs); skips where a clone has none."""
    if not TRACES.is_dir():
        pytest.skip("../shared/traces is absent (it exists only on the project's own machines)")
    return TRACES


RAY_MISSING = importlib.util.find_spec("ray") is None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `ray` needs a real Ray head: where Ray is not installed it skips, alone,
    so the pure tests of its module still run (no module-level importorskip for Ray)."""
    if RAY_MISSING and item.get_closest_marker("ray"):
        pytest.skip("needs Ray (pip install -e '.[test]')")
