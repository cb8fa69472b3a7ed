"""Issue 38, metric names: an audit of the catalog (rlhf_exporter/metrics/catalog.py), the one
place the names live. Every label name has one documented meaning; no two families share a
name in any exposition format, or say the same under two names; a deprecated family names
its replacement and has a migration note; the change kind `steady` replaced `none`, with the
deprecated `legacy_change_none` serving one value or the other, never both. (HELP lengths and
the error reasons' existence in the sources' code: tests/test_render.py.)"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from rlhf_exporter.auth import AuthGuard
from rlhf_exporter.diagnosis import CHANGES, GROUPS, Record
from rlhf_exporter.diagnosis.gpujoin import GPU_ROLES
from rlhf_exporter.job.limits import Limits
from rlhf_exporter.job.state import Job
from rlhf_exporter.lifecycle import STATES
from rlhf_exporter.metrics.catalog import (
    CATALOG,
    COUNTER,
    KNOWN_ERRORS,
    LABELS,
    LEGACY_STEADY,
)
from rlhf_exporter.metrics.families import health_samples
from rlhf_exporter.metrics.snapshot import Snapshot
from rlhf_exporter.render.docs import HEADER, metrics_markdown
from rlhf_exporter.thresholds_file import load_thresholds

ROOT = Path(__file__).resolve().parent.parent
DEPRECATED = re.compile(r"Deprecated, removed in the next release: use (\w+)")


def deprecated(m) -> str | None:
    """The replacement a deprecated family names, or None for a live one."""
    hit = DEPRECATED.match(m.help)
    return hit.group(1) if hit else None


def test_every_label_name_has_one_documented_meaning() -> None:
    used = {label for m in CATALOG for label in m.labels}
    assert used - LABELS.keys() == set(), "a label name without a meaning in catalog.LABELS"
    assert LABELS.keys() - used == set(), "a meaning for a label name no family has"
    meanings = Counter(LABELS.values())
    assert [m for m, n in meanings.items() if n > 1] == [], "one meaning under two names"
    page = metrics_markdown()
    for name, meaning in LABELS.items():
        assert f"| `{name}` | {meaning} |" in page  # docs/metrics.md, "Label names"


# vocabularies the code defines: a label's documented meaning lists its values, and no two
# label names carry the same vocabulary (the same meaning under two names)
VOCABULARIES = {
    "group": GROUPS,
    "kind": CHANGES,
    "gpu_role": GPU_ROLES,
    "state": STATES,  # a job's; a Ray actor's are Ray's own
}


@pytest.mark.parametrize("label", VOCABULARIES)
def test_a_labels_meaning_names_the_values_the_code_gives_it(label: str) -> None:
    for value in VOCABULARIES[label]:
        assert re.search(rf"\b{value}\b", LABELS[label]), (label, value)


def test_no_two_label_names_carry_one_vocabulary() -> None:
    seen = Counter(frozenset(v) for v in VOCABULARIES.values())
    assert max(seen.values()) == 1


def exposition_names(m) -> set[str]:
    """The family name in the text format and in OpenMetrics (a counter's is without
    `_total` there), and the names a counter family reserves in OpenMetrics."""
    if m.type == COUNTER:
        base = m.name.removesuffix("_total")
        return {base, m.name, base + "_created"}
    return {m.name}


def test_no_two_families_share_a_name_in_any_exposition_format() -> None:
    """Before issue 38 the gauge rlhf_engine_preemptions and the counter
    rlhf_engine_preemptions_total were one OpenMetrics family twice, a page a strict parser
    rejects. A clash is allowed only while a deprecated family is kept for a release."""
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    owner: dict[str, str] = {}
    for m in CATALOG:
        for name in exposition_names(m):
            other = owner.setdefault(name, m.name)
            if other != m.name:
                pair = {other: BY[other], m.name: m}
                assert any(deprecated(x) for x in pair.values()), (other, m.name, name)


BY = {m.name: m for m in CATALOG}


def test_the_openmetrics_clash_was_real_and_is_gone_without_the_deprecated_gauge() -> None:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    def page(*names: str) -> str:
        class Families:
            def collect(self):
                for name in names:
                    m = BY[name]
                    cls = CounterMetricFamily if m.type == COUNTER else GaugeMetricFamily
                    fam = cls(name.removesuffix("_total"), m.summary, labels=m.labels)
                    fam.add_metric(["p", "e"], 1.0)
                    yield fam

        return generate_latest(Families()).decode()

    counter = "rlhf_engine_preemptions_total"
    with pytest.raises(ValueError):  # the deprecated gauge, as it was the only one
        list(text_string_to_metric_families(page("rlhf_engine_preemptions", counter)))
    got = list(text_string_to_metric_families(page("rlhf_engine_window_preemptions", counter)))
    assert [f.name for f in got] == ["rlhf_engine_window_preemptions", "rlhf_engine_preemptions"]


def test_a_deprecated_family_names_its_live_replacement_and_has_a_migration_note() -> None:
    old = {m.name: deprecated(m) for m in CATALOG if deprecated(m)}
    assert old.keys() >= {"rlhf_job_finished", "rlhf_engine_preemptions"}
    for name, new in old.items():
        assert new in BY and not deprecated(BY[new]), (name, new)
        assert BY[new].labels == BY[name].labels or name == "rlhf_job_finished", name
        assert f"`{name}`" in HEADER and new in HEADER, name  # docs/metrics.md's notes


def test_no_two_live_families_say_the_same() -> None:
    helps = Counter(m.help for m in CATALOG if not deprecated(m))
    assert [h for h, n in helps.items() if n > 1] == []


def test_every_error_counters_known_reasons_are_served_at_zero() -> None:
    """The exporter's error counters exist at 0 from the start for their known reasons, so
    that increase() sees the first error (a series born at 1 shows no increase)."""
    error_counters = {
        m.name
        for m in CATALOG
        if m.type == COUNTER and "reason" in m.labels and re.search(r"errors|failures", m.name)
    }
    covered: set[str] = set()
    for collector, by_metric in KNOWN_ERRORS.items():
        served = {(s.name, s.labels[-1]): s.value for s in health_samples(Snapshot(collector))}
        for metric, reasons in by_metric.items():
            covered.add(metric)
            if metric.startswith("rlhf_exporter_"):  # the exporter's own: health_samples
                assert all(served[metric, r] == 0.0 for r in reasons), (collector, metric)
    # per GPU (tests/test_nvml_source.py, test_nvml_health.py poll the fake NVML)
    from rlhf_exporter.sources.nvml_readings import Gpu

    assert Gpu(0).errors == dict.fromkeys(KNOWN_ERRORS["nvml"]["rlhf_gpu_errors_total"], 0)
    guard = AuthGuard("s3cret-token", "push")
    assert {s.labels: s.value for s in guard.samples()} == {
        ("push", "unauthorized"): 0.0,
        ("push", "auth_throttled"): 0.0,
    }
    covered.add("rlhf_exporter_auth_failures_total")
    # the Ray actors' failures have no fixed reasons; their alert counts a new series from 0
    # itself (render/rules/operations.py `_counter_increase`)
    covered.add("rlhf_ray_actor_failures_total")
    assert error_counters <= covered, error_counters - covered


# -- the change kind: `steady`, and the deprecated legacy value -----------------------------
@pytest.fixture(scope="module")
def trace() -> list[Record]:
    path = ROOT / "tests/fixtures/traces/regression_update_v1.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Record(r["step"], r["data"]) for r in rows]


def change_series(job: Job) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for s in job.samples():
        if s.name in ("rlhf_change", "rlhf_change_steps_total"):
            out.setdefault(s.name, {})[s.labels[-1]] = s.value
    return out


@pytest.mark.parametrize("legacy", [False, True])
def test_a_steady_step_is_one_value_whichever_the_setting(trace, legacy: bool) -> None:
    th = load_thresholds(None)
    job = Job("p", "e", th, Limits(legacy_change_none=legacy))
    job.feed(trace)
    got = change_series(job)
    steady = LEGACY_STEADY if legacy else "steady"
    kinds = {steady, "workload_shift", "regression"}
    assert set(got["rlhf_change"]) == kinds and set(got["rlhf_change_steps_total"]) == kinds
    assert sum(got["rlhf_change"].values()) == 1.0  # one-hot: never both values
    totals = got["rlhf_change_steps_total"]
    assert sum(totals.values()) == job.steps - 1 or sum(totals.values()) == job.steps
    assert totals[steady] > 0 and totals["regression"] > 0
    # the same counts under either name
    other = Job("p", "e", th, Limits(legacy_change_none=not legacy))
    other.feed(trace)
    theirs = change_series(other)["rlhf_change_steps_total"]
    assert sorted(theirs.values()) == sorted(totals.values())


def shipped_queries() -> list[str]:
    files = sorted((ROOT / "alerts").glob("*.yaml")) + sorted((ROOT / "grafana").glob("*.json"))
    return [p.read_text() for p in files]


def test_the_shipped_rules_and_dashboards_read_either_value() -> None:
    """No negative matcher on `kind` (with the legacy value served, `kind!="steady"` would
    count every steady step as news) and no old value left."""
    text = "\n".join(shipped_queries())
    assert "kind" in text
    assert not re.search(r"kind\s*!=", text)
    assert not re.search(r'kind\s*=~?\s*\\?"none', text)
    assert 'kind=~\\"workload_shift|regression\\"' in text or (
        'kind=~"workload_shift|regression"' in text
    )
