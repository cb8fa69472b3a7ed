"""Fixtures shared by every test module, the test tiers' markers and hypothesis's profiles."""

from __future__ import annotations

import importlib.util
import os
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from rlhf_exporter.thresholds_file import load_thresholds

# Ray 2.60 turns token authentication on by itself when ~/.ray/auth_token exists and
# RAY_AUTH_MODE is unset: every Ray a test starts (heads, drivers, `ray job submit`, verl)
# runs without it, whatever the machine's home holds. The test that means auth
# (tests/test_ray_auth.py) starts its head with RAY_AUTH_MODE=token and a token of its own.
os.environ["RAY_AUTH_MODE"] = "disabled"

# ---- Hypothesis profiles ------------------------------------------------------------------
# HYPOTHESIS_PROFILE picks one (`bash scripts/test.sh --fast` sets `dev`). Unset, hypothesis
# chooses as it always has: its `default` profile, or its `ci` one where CI is set (.ci/run):
# the numbers every test states (`@settings(max_examples=N)`) or 100 examples. `dev` runs at
# most DEV_EXAMPLES examples per property test, explicit `max_examples` included (capped at
# collection, below): a quick smoke of each property, not its proof.
DEV_EXAMPLES = 10
settings.register_profile("dev", settings.get_profile("default"), max_examples=DEV_EXAMPLES)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE")
if PROFILE:
    settings.load_profile(PROFILE)


@pytest.fixture(scope="session")
def thresholds():
    return load_thresholds()


TRACES = Path(__file__).parent / "fixtures" / "traces"


@pytest.fixture(scope="session")
def sample_traces():
    """Every sample verl log, vendored in tests/fixtures/traces (as written by verl's own
    FileLogger, each with its `.expected.jsonl`): every clone runs the same tests."""
    return TRACES


RAY_MISSING = importlib.util.find_spec("ray") is None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `ray` needs a real Ray head: where Ray is not installed it skips, alone,
    so the pure tests of its module still run (no module-level importorskip for Ray)."""
    if RAY_MISSING and item.get_closest_marker("ray"):
        pytest.skip("needs Ray (pip install -e '.[test]')")


# ---- Test tiers: a test is marked by what it starts ---------------------------------------
# At collection each test's code is read (its function, its fixtures' functions, and the
# functions and classes of tests/ these name, transitively) for the tests/support helpers
# that start something (imports inside a function included), and marked by what that is; a
# test that reaches one in a way this reading cannot see (through a helper's return value)
# carries the marker explicitly, and so does what is slow in process (EXPLICIT below).
# `heavy` is added to every test with a marker of HEAVY: `pytest -m "not heavy"` is the fast
# tier (scripts/test.sh --fast). Every marker is listed in pyproject.toml (--strict-markers).

# A tests/support class or function -> the marker of what using it starts. `module.attr`
# uses count as well (`browser.dump_dom(...)`, `rendered_pods.render(...)`).
STARTERS: dict[tuple[str, str], str] = {
    ("tests.support.serve", "Exporter"): "exporter",  # `rlhf-exporter serve`, a process
    ("tests.support.procs", "exporter_cmd"): "exporter",  # the CLI in a child process
    ("tests.support.ray_head", "RayHead"): "ray",  # `ray start --head`
    ("tests.support.ray_head", "connected_head"): "ray",
    ("tests.support.prometheus", "Prometheus"): "prometheus",
    ("tests.support.prometheus", "Alertmanager"): "prometheus",
    ("tests.support.prometheus", "binary"): "prometheus",  # promtool, amtool, victoria-metrics
    ("tests.support.promtool", "run_rule_tests"): "prometheus",
    ("tests.support.simday", "Day"): "prometheus",  # `promtool test rules` on a simulated day
    ("tests.support.fleet_history", "build"): "prometheus",  # promtool's backfill
    ("tests.support.chart", "render"): "helm",  # the real Helm engine (helm-python-sdk)
    ("tests.support.chart", "copy_example"): "helm",
    ("tests.support.rendered_pods", "render"): "helm",
    ("tests.support.browser", "dump_dom"): "browser",  # headless Chromium
    ("tests.support.browser", "screenshot"): "browser",
}
# Modules whose every use starts something: a child process, the Helm engine (in process,
# a Go library), the container image.
WHOLE_MODULES = {
    "subprocess": "subprocess",
    "helm_python": "helm",
    "tests.support.container": "image",
}
# Markers that keep a test out of the fast tier (`slow`: explicit, for what is slow in
# process; `real_verl`: explicit, tests/test_real_verl.py).
HEAVY = (
    "slow",
    "real_verl",
    "exporter",
    "ray",
    "prometheus",
    "helm",
    "browser",
    "image",
    "subprocess",
)
# Tests slow in process, starting nothing the reading above sees: `file::test` under tests/
# (every parameter of it) -> its time on 2 cores in the whole suite's run (or under the fast
# tier's coverage, which slows pure Python down). Marked `slow`.
EXPLICIT: dict[str, str] = {
    # simulated engines and served engine pages, polled in real time
    "test_engine_join.py::test_rollout_bound_steps_get_the_engines_reason": "6 x 12-15 s",
    "test_engine_join.py::test_a_healthy_rollout_keeps_the_logs_reason_with_evidence": "15 s",
    "test_engine_join.py::test_the_landing_page_and_job_view_show_the_evidence_beside_the_reason": (
        "14 s"
    ),
    "test_engine_scenarios.py::test_scenario_gives_the_contracts_reason_and_the_truth": "8 x 5.5 s",
    "test_engine_scenarios.py::test_sglang_without_a_token_counter_integrates_gen_throughput": (
        "5 s"
    ),
    "test_engine_sim_fidelity.py::test_the_simulated_engine_gives_the_real_pages_evidence": (
        "10 x 2.7 s"
    ),
    "test_engine_sim_fidelity.py::test_the_simulated_engine_writes_what_the_real_one_does": (
        "10 x 1 s"
    ),
    "test_engine_pages.py::test_the_engines_own_pages_give_the_scripted_reason_and_truth": (
        "10 x 2.6 s"
    ),
    "test_engine_real_vllm.py::test_a_real_vllm_servers_reads_give_its_tokens": "5.5 s",
    # pure Python, long
    "test_verl_drift.py::test_json_output_lists_every_finding": "all of verl's source: 4.5 s, 7 s",
    "test_gpu_windows.py::test_fully_async_shifted_records_busy_share_within_5pp": "3 s, 11 s",
    "test_gpu_windows.py::test_placing_r_where_the_gpus_idled_shrinks_the_window_edge_error": (
        "1 s, 2.4 s"
    ),
    "test_gpu_windows.py::test_a_long_fully_async_run_is_placed_in_bounded_pieces": "0.6 s, 2 s",
    "test_exposition_direct.py::test_cached_bodies_equal_uncached_ones_for_random_step_orders": (
        "2 x 6 examples: 2.6 s, 5 s"
    ),
    "test_exposition.py::test_many_threads_inventing_versions_keep_the_cache_bounded": (
        "threads racing: 1 s, 2.8 s"
    ),
    "test_stacks_source.py::test_hostile_answers_never_break_a_round": (
        "a stacks round per example: 30 s at 60 examples, 3.6 s at 10"
    ),
}


def _followed(value: object, names: tuple[str, ...]) -> tuple[set[str], list[object]]:
    """What `value` (a global named by the code being read, whose other names are `names`)
    starts, and the code of tests/ behind it to read in turn."""
    if isinstance(value, types.ModuleType):
        module = value.__name__
        if module in WHOLE_MODULES:
            return {WHOLE_MODULES[module]}, []
        if not module.startswith("tests."):
            return set(), []
        found: set[str] = set()
        follow: list[object] = []
        for attr in (n for n in names if n in vars(value)):  # `module.attr`
            marks, more = _followed(vars(value)[attr], ())
            found |= marks
            follow += more
        return found, follow
    module = getattr(value, "__module__", None)
    if not isinstance(module, str):
        return set(), []
    starter = STARTERS.get((module, getattr(value, "__qualname__", "")))
    if starter:
        return {starter}, []
    if module in WHOLE_MODULES:
        return {WHOLE_MODULES[module]}, []
    if module.startswith("tests.") and isinstance(value, (types.FunctionType, type)):
        return set(), [value]
    return set(), []


def _code(obj: object) -> Iterator[tuple[types.CodeType, dict[str, object]]]:
    """The code objects of a function (its nested functions, lambdas and comprehensions
    included) or of a class's methods, each with the globals its names resolve in."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if f is not None:
                yield from _code(f)
    elif isinstance(obj, type):
        for base in obj.__bases__:
            if base.__module__.startswith("tests."):
                yield from _code(base)
        for member in vars(obj).values():
            yield from _code(member)
    elif isinstance(obj, types.FunctionType):
        codes = [obj.__code__]
        while codes:
            code = codes.pop()
            yield code, obj.__globals__
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def starts(item: pytest.Function) -> set[str]:
    """The markers of what a test starts, read from its code and its fixtures' code."""
    found: set[str] = set()
    todo: list[object] = [item.function]
    for defs in item._fixtureinfo.name2fixturedefs.values():
        todo.extend(d.func for d in defs)
    seen: set[int] = set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for code, globs in _code(obj):
            for name in code.co_names:
                if name in globs:
                    value = globs[name]
                elif name in WHOLE_MODULES:  # `import subprocess` inside a function
                    found.add(WHOLE_MODULES[name])
                    continue
                elif name.startswith("tests.support."):  # `from tests.support.x import y` there
                    value = importlib.import_module(name)
                else:
                    continue
                marks, more = _followed(value, code.co_names)
                found |= marks
                todo.extend(more)
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        for marker in sorted(starts(item)):
            item.add_marker(marker)
        if item.nodeid.split("[", 1)[0].removeprefix("tests/") in EXPLICIT:
            item.add_marker("slow")
        if any(item.get_closest_marker(m) for m in HEAVY):
            item.add_marker("heavy")
        if PROFILE == "dev":
            _cap_examples(item.function)


def _cap_examples(function: object) -> None:
    """Under the `dev` profile, a property test's explicit `@settings(max_examples=N)` is
    capped at DEV_EXAMPLES too (a profile alone changes only the defaults). Hypothesis reads
    the settings a test runs with from this attribute of its wrapper."""
    given = getattr(function, "_hypothesis_internal_use_settings", None)
    if isinstance(given, settings) and given.max_examples > DEV_EXAMPLES:
        function._hypothesis_internal_use_settings = settings(  # type: ignore[attr-defined]
            given, max_examples=DEV_EXAMPLES
        )
