"""The series table (rlhf_exporter/job/series.py): which verl key feeds which metric, with
its edges: a key under a known prefix with an unknown name feeds nothing, shares over 1 are
dropped, both agent-loop spellings count, the newest memory spelling wins."""

from __future__ import annotations

import pytest

from rlhf_exporter.job.limits import KEY_LABEL_CHARS
from rlhf_exporter.job.record_keys import GIB
from rlhf_exporter.job.series import EXTRA_SERIES, extra_values, verl_metric_names


@pytest.mark.parametrize(
    ("data", "want"),
    [
        ({"perf/throughput": 512}, {("rlhf_throughput_tokens_per_gpu_second", ()): 512.0}),
        ({"perf/mfu/actor": 0.4}, {("rlhf_mfu_ratio", ("actor",)): 0.4}),
        ({"perf/mfu/": 0.4}, {}),
        ({"perf/mfu/" + "s" * (KEY_LABEL_CHARS + 1): 0.4}, {}),
        (
            {"fully_async/rollouter/idle_ratio": 0.5},
            {("rlhf_fully_async_idle_ratio", ("rollouter",)): 0.5},
        ),
        ({"fully_async/idle_ratio": 0.5}, {}),
        ({"fully_async/processing_time/x/idle_ratio": 0.5}, {}),
        (
            {"fully_async/processing_time/tp99": 7},
            {("rlhf_fully_async_processing_seconds", ("tp99",)): 7.0},
        ),
        ({"response_length/median": 9}, {}),
        ({"response/aborted_ratio": 1.5}, {}),
        ({"response/aborted_ratio": 0.25}, {("rlhf_response_aborted_ratio", ()): 0.25}),
        ({"dynamic_resource/train_resource_utilization": 2.0}, {}),
        (
            {"timing_s/agent_loop/tool_calls/max": 3, "agent_loop/slowest/response_length": 10},
            {
                ("rlhf_agent_loop_seconds", ("tool_calls", "max")): 3.0,
                ("rlhf_agent_loop_slowest_response_length_tokens", ()): 10.0,
            },
        ),
        ({"agent_loop/tool_calls/max/x": 3, "agent_loop/num_preempted/min": 1}, {}),
        (
            {"perf/max_memory_allocated_gb": 1, "actor/perf/max_memory_allocated_gb": 2},
            {("rlhf_memory_max_allocated_bytes", ()): 2 * GIB},
        ),
        ({"perf/throughput": float("nan"), "perf/mfu/ref": True}, {}),
    ],
)
def test_each_key_feeds_its_series_and_nothing_else(data, want):
    assert extra_values(data) == want


def test_the_table_names_only_catalog_series_of_a_job():
    metrics = {extra.metric for extra in EXTRA_SERIES.values()}
    assert metrics <= verl_metric_names()
    assert len(EXTRA_SERIES) > 30  # every fixed key, each agent-loop key under both spellings
