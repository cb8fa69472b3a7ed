"""Fixtures shared by every test module."""

from __future__ import annotations

import pytest

from exporter.config import load_thresholds
from tests.support.procs import TRACES


@pytest.fixture(scope="session")
def thresholds():
    return load_thresholds()


@pytest.fixture(scope="session")
def shared_traces():
    """../shared/traces (the sample verl logs); skips where a clone has none."""
    if not TRACES.is_dir():
        pytest.skip("../shared/traces is absent (it exists only on the project's own machines)")
    return TRACES
