"""RLHFJobStalled says where the job hangs, and fires all the same without stacks (issue 39).

The committed rule files, evaluated by promtool: a stalled job whose exporter took its stacks
(`rlhf_job_stalled_in{role, where}`) gets an annotation naming each role's wait; one whose
stacks could not be read (`rlhf_job_stacks_unread{reason}`) says why; one with neither still
pages, on the same minute, saying there are no stacks yet.
"""

from __future__ import annotations

import yaml

from tests.test_rules import RULE_FILES, alert, case, run_promtool_tests, series

STALL = [  # steps every minute for 30 m, then none: past max(3 x 60 s, 10m) after 40m
    series("rlhf_last_step_timestamp_seconds", "0+60x30 1800x60"),
    series("rlhf_baseline_step_duration_seconds", "60x90"),
    *[
        series("rlhf_job_state", "1x90" if s == "running" else "0x90", state=s)
        for s in ("running", "finished", "failed", "unknown")
    ],
]
STACKS = [  # the exporter's stack round from 41m on
    series("rlhf_job_stalled_in", "_x40 1x50", role="rollout", where="lock"),
    series("rlhf_job_stalled_in", "_x40 1x50", role="driver", where="ray_get"),
    series("rlhf_job_stalled_in", "_x40 2x50", role="trainer", where="no_task"),
]
UNREAD = [series("rlhf_job_stacks_unread", "_x40 7x50", reason="profiling_disabled")]


def only_where(tmp_path) -> list:
    """The committed rule files, RLHFJobStalled keeping only its where_it_hangs annotation
    (promtool compares every annotation; the description embeds the same template)."""
    out = []
    for path in RULE_FILES:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == "RLHFJobStalled":
                    ann = rule["annotations"]
                    assert ann["description"].endswith(
                        "Where it hangs: " + ann["where_it_hangs"] + "."
                    )
                    rule["annotations"] = {"where_it_hangs": ann["where_it_hangs"]}
        copy = tmp_path / path.name
        copy.write_text(yaml.safe_dump(doc))
        out.append(copy)
    return out


def stalled_case(at: str, inputs: list[dict], want: str | None) -> dict:
    """RLHFJobStalled at `at` with its where_it_hangs annotation `want` (None: not firing);
    promtool compares the annotations it is given, the others are not checked."""
    fired = {**alert("RLHFJobStalled", "critical", "job")}
    if want is not None:
        fired["exp_annotations"] = {"where_it_hangs": want}
    expected = [fired] if want is not None else []
    return {"interval": "1m", "input_series": inputs,
            "alert_rule_test": [case(at, "RLHFJobStalled", *expected)]}  # fmt: skip


def test_the_stall_page_names_each_role_and_its_wait(tmp_path):
    named = "driver: 1 in ray_get; rollout: 1 in lock; trainer: 2 in no_task"
    run_promtool_tests(tmp_path, only_where(tmp_path), [stalled_case("50m", STALL + STACKS, named)])


def test_without_stacks_the_page_fires_on_the_same_minute_and_says_why(tmp_path):
    unread = "no stacks (profiling_disabled): see the job view"
    none = (
        "no stacks yet (taken through Ray's dashboard once the job passes its stall limit: "
        "see the job view)"
    )
    tests = [
        stalled_case("50m", STALL + UNREAD, unread),
        stalled_case("50m", STALL, none),
        # on time with stacks, with unread stacks and with none: past the stall limit at
        # 41m, plus stall_for (2m): firing at 43m (the record's group evaluated first:
        # tests/support/promtool.eval_order; a Prometheus may take one evaluation more),
        # at 42m in no case
        stalled_case("43m", STALL + STACKS, "driver: 1 in ray_get; rollout: 1 in lock; "
                     "trainer: 2 in no_task"),
        stalled_case("43m", STALL + UNREAD, unread),
        stalled_case("43m", STALL, none),
        stalled_case("42m", STALL + STACKS, None),
        stalled_case("42m", STALL, None),
    ]  # fmt: skip
    run_promtool_tests(tmp_path, only_where(tmp_path), tests)
