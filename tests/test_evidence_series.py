"""Evidence series from verl keys the decision table does not read (issue 25): the aborted
share beside long-tail, fully-async's per-sample processing time, and the dynamic resource
utilization beside the GPU join's busy shares. Key names as verl 0.9.1 writes them:
`trainer/ppo/metric_utils.py:581-586` (response_length_non_aborted/*, response/aborted_ratio),
`experimental/fully_async_policy/detach_utils.py:134-149` (fully_async/processing_time/*),
`detach_utils.py:365, 411` and `fully_async_rollouter.py:625` (dynamic_resource/*)."""

from __future__ import annotations

from rlhf_exporter.diagnosis import BatchDiagnoser, Record
from rlhf_exporter.job.state import Job
from rlhf_exporter.metrics.catalog import BY_NAME
from rlhf_exporter.thresholds_file import load_thresholds
from tests.support.families import render_samples

TH = load_thresholds()
NEW = (
    "rlhf_response_aborted_ratio",
    "rlhf_response_length_non_aborted_tokens",
    "rlhf_fully_async_processing_seconds",
    "rlhf_dynamic_resource_utilization_ratio",
)
STEP = {
    "timing_s/step": 10.0,
    "timing_s/gen": 8.0,
    "timing_s/update_actor": 1.0,
    "response_length/mean": 300.0,
    "response_length/max": 1000.0,
    "response_length_non_aborted/mean": 600.0,
    "response_length_non_aborted/max": 1000.0,
    "response_length_non_aborted/min": 20.0,
    "response_length_non_aborted/clip_ratio": 0.1,  # not a stat the series keeps
    "response/aborted_ratio": 0.5,
    "fully_async/processing_time/avg": 40.0,
    "fully_async/processing_time/max": 190.0,
    "fully_async/processing_time/min": 3.0,
    "fully_async/processing_time/tp50": 35.0,
    "fully_async/processing_time/tp95": 120.0,
    "fully_async/processing_time/tp99": 170.0,
    "dynamic_resource/rollout_resource_utilization": 0.8,
    "dynamic_resource/train_resource_utilization": 0.55,
    "dynamic_resource/resource_utilization": 0.7,  # a combination: not exported
    "timing_s/timing_s/param_sync": 0.5,
}


def values(job: Job) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(s.name, s.labels[2:]): s.value for s in job.samples() if s.name in NEW}


def test_new_evidence_series_come_from_verls_keys_with_bounded_labels():
    job = Job("p", "e", TH)
    job.feed([Record(1, STEP)])
    got = values(job)
    assert got == {
        ("rlhf_response_aborted_ratio", ()): 0.5,
        ("rlhf_response_length_non_aborted_tokens", ("mean",)): 600.0,
        ("rlhf_response_length_non_aborted_tokens", ("max",)): 1000.0,
        ("rlhf_response_length_non_aborted_tokens", ("min",)): 20.0,
        ("rlhf_fully_async_processing_seconds", ("avg",)): 40.0,
        ("rlhf_fully_async_processing_seconds", ("max",)): 190.0,
        ("rlhf_fully_async_processing_seconds", ("min",)): 3.0,
        ("rlhf_fully_async_processing_seconds", ("tp50",)): 35.0,
        ("rlhf_fully_async_processing_seconds", ("tp95",)): 120.0,
        ("rlhf_fully_async_processing_seconds", ("tp99",)): 170.0,
        ("rlhf_dynamic_resource_utilization_ratio", ("rollout",)): 0.8,
        ("rlhf_dynamic_resource_utilization_ratio", ("train",)): 0.55,
    }
    for name in NEW:  # every series is in the catalog, with the labels used here
        assert name in BY_NAME
    assert BY_NAME["rlhf_fully_async_processing_seconds"].labels[-1] == "stat"
    assert BY_NAME["rlhf_dynamic_resource_utilization_ratio"].labels[-1] == "side"
    families = {f.name for f in render_samples(job.samples())}  # valid Prometheus families
    assert {n.removesuffix("_total") for n in NEW} <= families


def test_the_gate_keeps_them_bounded_and_drops_what_verl_never_writes():
    job = Job("p", "e", TH)
    hostile = {
        **{f"fully_async/processing_time/p{i}": 1.0 for i in range(200)},  # invented stats
        **{f"response_length_non_aborted/x{i}": 1.0 for i in range(200)},
        "response/aborted_ratio": 7.0,  # not a share
        "dynamic_resource/train_resource_utilization": -0.5,  # negative: missing
        "dynamic_resource/rollout_resource_utilization": float("nan"),
        "timing_s/step": 10.0,
    }
    job.feed([Record(1, hostile)])
    assert values(job) == {}  # no invented label value, no value out of range
    # a later record's usable values replace a step's (the last step is what the gauge shows)
    job.feed([Record(2, {"timing_s/step": 10.0, "response/aborted_ratio": 0.25})])
    assert values(job) == {("rlhf_response_aborted_ratio", ()): 0.25}


def test_they_never_change_the_verdict():
    """The decision table's long-tail fallback reads response_length/* only: the non-aborted
    statistics and the aborted share are evidence beside it (decision table §3)."""
    plain = {
        k: v for k, v in STEP.items() if not k.startswith(("response_length_non", "response/"))
    }
    with_new = [d.to_json() for d in BatchDiagnoser(TH).diagnose([Record(1, STEP)])]
    without = [d.to_json() for d in BatchDiagnoser(TH).diagnose([Record(1, plain)])]
    assert with_new == without
    assert with_new[0]["reason"] == "long_tail"  # 1000 >= 3 x 300, whatever was aborted
