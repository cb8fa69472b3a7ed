"""The verl record keys a job reads beyond the decision table's timers: each spelled once,
for cleaning (what it lets through), the series table (what it exports) and `verl-drift`
(what it checks against a verl tree)."""

from __future__ import annotations

from ..diagnosis.timeline import FULLY_ASYNC_PREFIX
from ..diagnosis.values import AGENT_LOOP, TIMER_PREFIX

THROUGHPUT_KEY = "perf/throughput"
MFU_PREFIX = "perf/mfu/"
MFU_STAGES = frozenset({"actor", "actor_infer", "critic", "ref"})  # verl's perf/mfu/<stage>
RESPONSE_PREFIX = "response_length/"
NON_ABORTED_PREFIX = "response_length_non_aborted/"
RESPONSE_STATS = ("mean", "max", "min")
ABORTED_KEY = "response/aborted_ratio"
IDLE_SUFFIX = "/idle_ratio"
PROCESSING_PREFIX = "fully_async/processing_time/"
PROCESSING_STATS = frozenset({"avg", "max", "min", "tp50", "tp95", "tp99"})
RESOURCE_KEYS = {  # verl key -> `side` label (fully-async dynamic resources, verl 0.9.1)
    "dynamic_resource/rollout_resource_utilization": "rollout",
    "dynamic_resource/train_resource_utilization": "train",
}
AGENT_PARTS = ("generate_sequences", "tool_calls", "compute_score")
AGENT_STATS = ("min", "max", "mean")
MEMORY_KEYS = {  # metric -> verl keys, newest spelling first (before 0.8: no actor/ prefix)
    "rlhf_memory_max_allocated_bytes": (
        "actor/perf/max_memory_allocated_gb",
        "perf/max_memory_allocated_gb",
    ),
    "rlhf_memory_max_reserved_bytes": (
        "actor/perf/max_memory_reserved_gb",
        "perf/max_memory_reserved_gb",
    ),
}
GIB = float(1 << 30)  # verl's *_memory_*_gb are torch bytes / 2**30
# timers that run between two steps' records, outside timing_s/step (verl-stream.md: testing
# always; save_checkpoint in 0.6.x and the separated trainers; counted in any version)
BETWEEN_STEPS = (TIMER_PREFIX + "testing", TIMER_PREFIX + "save_checkpoint")
FINISHED_KEY = "rlhf_job_finished"  # a record key a job may log at its end (value 1)
# keys the exporter reads: kept first when a step has more keys than Limits.step_keys
USED_PREFIXES = (TIMER_PREFIX, "perf/", RESPONSE_PREFIX, "actor/perf/", FULLY_ASYNC_PREFIX,
                 AGENT_LOOP, "response/", NON_ABORTED_PREFIX, "dynamic_resource/",
                 "training/global_step")  # fmt: skip
