"""What a verl job prints for a JSONL trace: its console form, rendered with verl's own code.

verl's `console` logger prints `concat_dict_to_str(data, step)`
(verl/utils/logger/aggregate_logger.py). That module imports torch at its top, which the
test environment does not have, so the function is NOT imported: its source is read from
the installed verl with `ast` and only that one function is executed (`verl_concat`); nothing
of it is copied here.

How a JSONL record is turned back into the values a real job held when it logged them (the
rendering rule; the file logger wrote them with orjson, OPT_SERIALIZE_NUMPY):
- an int (not a bool) -> a numpy int64 scalar (`np.int64(5)`): verl's metrics are numpy
  reductions or Python ints; the reader must give the same int either way;
- a float -> a numpy float64 scalar (`np.float64(0.1)`);
- null, or a bare NaN/Infinity token (verl <= 0.7's json) -> `np.float64(nan)`: orjson writes
  NaN and the infinities as null, so a JSONL null is read back as a NaN the job held (a
  None the job held would not be printed at all; both are missing to the decision table);
- a bool stays a bool (a Number: printed `True`); a string, list or object is passed as is
  (not a Number: verl does not print it).
Without numpy (the test environment) the numpy scalars are stand-ins whose repr is numpy 2's
(`np.float64(<float repr>)`, `np.int64(<int>)`); `test_stand_ins_print_as_numpy` checks
them against numpy where it is installed.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import numbers
import pprint
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def verl_concat() -> Callable[[dict[str, Any], int], str]:
    """verl's own `concat_dict_to_str`, executed from its source alone (see the docstring)."""
    spec = importlib.util.find_spec("verl")  # found, not imported (verl imports numpy, torch)
    assert spec is not None and spec.origin, "verl is not installed in this environment"
    path = Path(spec.origin).parent / "utils/logger/aggregate_logger.py"
    tree = ast.parse(path.read_text())
    (fn,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "concat_dict_to_str"
    ]
    module = ast.Module(body=[fn], type_ignores=[])
    namespace: dict[str, Any] = {"numbers": numbers, "pprint": pprint}
    exec(compile(module, str(path), "exec"), namespace)
    return namespace["concat_dict_to_str"]  # type: ignore[no-any-return]


class NpFloat64(float):
    def __repr__(self) -> str:
        return f"np.float64({float.__repr__(self)})"


class NpInt64(int):
    def __repr__(self) -> str:
        return f"np.int64({int.__repr__(self)})"


def scalars() -> tuple[type, type]:
    """numpy's float64 and int64 where numpy is installed, else the stand-ins."""
    try:
        import numpy as np
    except ImportError:
        return NpFloat64, NpInt64
    return np.float64, np.int64


def held(value: Any, f64: type = NpFloat64, i64: type = NpInt64) -> Any:
    """The value a job held for a JSONL value (the rendering rule above)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return f64(math.nan)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return i64(value) if isinstance(value, int) else f64(value)


def jsonl_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            obj = json.loads(line, parse_constant=lambda _c: None)
            out.append((obj["step"], obj["data"]))
    return out


PREFIX = "\x1b[36m(TaskRunner pid=4242)\x1b[0m "
VLLM = "\x1b[36m(AsyncvLLMServer pid=777, ip=10.0.0.3)\x1b[0m "


def config_dump(project: str, experiment: str) -> list[str]:
    """The resolved config verl's TaskRunner pprints at start (a shortened one)."""
    config = {
        "actor_rollout_ref": {"rollout": {"name": "vllm", "n": 4}},
        "data": {"train_batch_size": 4},
        "trainer": {
            "balance_batch": True,
            "experiment_name": experiment,
            "logger": ["console", "file"],
            "project_name": project,
            "total_epochs": 1,
        },
    }
    return pprint.pformat(config).splitlines()


def driver_log(
    records: Iterable[tuple[int, dict[str, Any]]], project: str, experiment: str
) -> bytes:
    """A job driver's log (`ray job logs`) holding these records as verl prints them: Ray's
    coloured prefixes, the config dump, vLLM request logs between steps, a tqdm bar's `\\r`
    rewrites, Ray's dedup suffix on a step line and on a vLLM line."""
    concat = verl_concat()
    f64, i64 = scalars()
    out = [
        "2026-12-05 08:59:43,219\tINFO job_manager.py:581 -- Runtime env is setting up.",
        "Running entrypoint for job raysubmit_123: python3 -m verl.trainer.main_ppo",
        PREFIX + "TaskRunner hostname: head, PID: 4242",
    ]
    out += [PREFIX + line for line in config_dump(project, experiment)]
    for i, (step, data) in enumerate(records):
        for k in range(3):
            out.append(
                VLLM + f"INFO 12-05 09:00:0{k} [logger.py:41] Received request "
                f"chatcmpl-{step}-{k}: prompt: 'step: what is 2+2?', params: SamplingParams(n=1)"
            )
        printed = concat({key: held(v, f64, i64) for key, v in data.items()}, step=step)
        if i == 1:  # a progress bar rewritten in place before the step line
            printed = (
                "Training Progress:  10%|#         | 1/10\rTraining Progress:  20%|##\r" + printed
            )
        if i == 2:
            printed += "\x1b[32m [repeated 2x across cluster]\x1b[0m"
        out.append(PREFIX + printed)
        if i == 0:
            out.append(VLLM + "INFO engine stats\x1b[32m [repeated 2x across cluster]\x1b[0m")
    return ("\n".join(out) + "\n").encode()
