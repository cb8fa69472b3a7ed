"""Where it hangs on `/`, the job view and `GET /api/v1/jobs/<p>/<e>/stacks` (issue 39)."""

from __future__ import annotations

import time

from rlhf_exporter.diagnosis import stacks
from rlhf_exporter.diagnosis.stacks import ProcessStack, StackRound
from rlhf_exporter.server import Endpoints
from rlhf_exporter.view.pages import Facts, Links, index_page, job_page

RUNBOOKS = "https://example.invalid/docs/runbooks.md"
HOSTILE = "<script>alert(1)</script>"


def a_round(why: str = "") -> StackRound:
    procs = (
        ProcessStack("rollout", f"vLLMHttpServer {HOSTILE}", 7, "n1",
                     stacks.Wait("lock", "generate (x.py:1)"), text=f"Process 7: {HOSTILE}"),
        ProcessStack("driver", "TaskRunner t", 8, "n1", None, "no_permission",
                     "Error: Permission denied (os error 13)"),
    )  # fmt: skip
    seen = [stacks.Seen(p.role, p.label, p.wait, p.error) for p in procs]
    return StackRound(
        "p", "e", time.time(), 700.0, time.time() - 700, procs, stacks.fold(seen), why
    )


def job(found: StackRound | None) -> dict:
    out = {"project": "p", "experiment": "e", "step": 3, "last_step_time": time.time() - 700,
           "state": "running"}  # fmt: skip
    return {**out, "stacks": found} if found else out


FACTS = Facts("t", "http://127.0.0.1:9", "verl", stall_factor=3.0, stall_min=600.0)


def test_the_pages_say_where_it_hangs_escaped():
    found = a_round()
    index = index_page([job(found)], [], FACTS, Links(RUNBOOKS))
    assert "where it hangs: rollout: lock (generate (x.py:1))" in index
    view = job_page(job(found), [], FACTS, Links(RUNBOOKS))
    assert "Where it hangs" in view and f"{RUNBOOKS}#where-it-hangs" in view
    assert HOSTILE not in view and "&lt;script&gt;" in view
    assert "unread: no_permission" in view and "Permission denied" in view
    assert "Where it hangs" not in job_page(job(None), [], FACTS, Links(RUNBOOKS))


def test_the_why_is_said_once():
    found = a_round(why="py-spy may not read the process: Error: Permission denied (os error 13)")
    view = job_page(job(found), [], FACTS, Links(RUNBOOKS))
    assert view.count("Permission denied") == 1


def test_the_api():
    found = a_round()
    jobs = [job(None) | {"experiment": "quiet"}, job(None)]
    ep = Endpoints(snapshot_fns=[], jobs_fns=[lambda: jobs],
                   stacks_of=lambda p, e: found if e == "e" else None)  # fmt: skip
    status, body = ep.stacks_json("/api/v1/jobs/p/e/stacks")
    assert status == 200 and body["round"]["answer"].startswith("rollout: lock")
    assert body["round"]["processes"][1]["error"] == "no_permission"
    status, body = ep.stacks_json("/api/v1/jobs/p/quiet/stacks")
    assert status == 200 and body["round"] is None and "not stalled" in body["note"]
    assert ep.stacks_json("/api/v1/jobs/p/nope/stacks")[0] == 404
    assert ep.stacks_json("/api/v1/jobs/p/e/other")[0] == 404
    assert ep.stacks_json("/api/v1/jobs/p%2Fx/e/stacks")[0] == 404
    off = Endpoints(snapshot_fns=[], jobs_fns=[lambda: jobs])
    assert "stacks are off" in off.stacks_json("/api/v1/jobs/p/e/stacks")[1]["note"]
