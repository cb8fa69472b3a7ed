"""Fixtures shared by every test module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlhf_exporter.config import load_thresholds
from tests.support.procs import TRACES

# Ray 2.60 turns token authentication on by itself when ~/.ray/auth_token exists and
# RAY_AUTH_MODE is unset: every Ray a test starts (heads, drivers, `ray job submit`, verl)
# runs without it, whatever the machine's home holds. The test that means auth
# (tests/test_ray_auth.py) starts its head with RAY_AUTH_MODE=token and a token of its own.
os.environ["RAY_AUTH_MODE"] = "disabled"


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
