"""`rlhf_job_framework_info`: the framework each exported job's records were read from, out
of the jobs' summaries (their `framework` key, set by the source that read them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..metrics.snapshot import Sample

INFO = "rlhf_job_framework_info"


def framework_samples(summaries: Iterable[Mapping[str, Any]]) -> tuple[Sample, ...]:
    """One sample a job whose framework is known."""
    return tuple(
        Sample(INFO, (s["project"], s["experiment"], s["framework"]), 1.0)
        for s in summaries
        if isinstance(s.get("framework"), str) and "project" in s and "experiment" in s
    )
