"""What a verl tree (or a log) has that the project does not know.

The project's knowledge comes from where it lives: timers from the thresholds' timer map
(`diagnosis.windows.named_timers`), MFU stages and the keys the exporter reads from `jobs`,
the agent-loop statistics from `job.record_keys.AGENT_PARTS`, actor names from the Ray role map
(`sources.roles`). Only the few facts no other module needs are held here (`NOT_TIMERS`, the
file logger's variables and format, the words of the server names).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..diagnosis import Record, Thresholds
from ..diagnosis.advice import EVIDENCE_KEYS
from ..diagnosis.values import AGENT_LOOP, TIMER_PREFIX
from ..diagnosis.windows import named_timers, timer_name
from ..job.record_keys import (
    ABORTED_KEY,
    AGENT_PARTS,
    MEMORY_KEYS,
    MFU_PREFIX,
    MFU_STAGES,
    NON_ABORTED_PREFIX,
    PROCESSING_PREFIX,
    PROCESSING_STATS,
    RESOURCE_KEYS,
    RESPONSE_STATS,
)
from ..settings import VERL_FILE_LOGGER_PATH
from ..sources.roles import RoleMap
from .source import Timer, Tree

NOT_TIMERS: Mapping[str, str] = {
    # fully_async_rollouter.py (0.8.0-0.9.1): marked_timer into its validation's timing dict,
    # logged as `rollouter/validate_time` with no timing_s/ prefix (verl-stream.md)
    "rollouter/validate_time": "fully-async's validation time, logged without the timing_s/ "
    "prefix: not a timer",
    # verl 0.6's sharding managers time the weight reshard into their own `self.timing`,
    # which nothing reads (docs/verl-support.md, "Verified in verl source")
    "reshard": "timed into verl 0.6's sharding manager's own dict, which never reaches the log",
}
"""Names verl times that never reach the log as `timing_s/<name>` windows."""

ROLE_STRINGS: Mapping[str, str] = {
    "Actor": "actor",
    "Rollout": "rollout",
    "ActorRollout": "actor_rollout",
    "Critic": "critic",
    "RefPolicy": "ref",
    "RewardModel": "rm",
    "ActorRolloutRef": "actor_rollout_ref",
    "TeacherModel": "teacher",
}
"""`str(Role.X)`, verl/trainer/ppo/utils.py (`Role._get_role_string`, 0.6.1 to 0.9.1): a
recipe tree without verl's own table names `marked_timer(str(Role.RefPolicy), ...)` by it."""

LOGGER_ENV = (VERL_FILE_LOGGER_PATH, "VERL_FILE_LOGGER_ROOT")  # settings.py, verl_files.py
LOGGER_RECORD = ("step", "data")  # sources/verl_reader.py: {"step": int, "data": {...}}
LOGGER_SERIALIZERS = ("orjson.dumps", "json.dumps")  # 0.7.1+ (bytes, no NaN); 0.6 (bare NaN)
LOGGER_MODES = ("wb", "w")  # truncated at every (re)start: the reader starts again at 0

ENGINES = ("vllm", "sglang", "trtllm")
SERVER_WORDS = (
    "server",
    "rollout",
    "reward",
    "teacher",
    "decode",
    "colocate",
    "standalone",
    "pool",
)
"""The words of verl's rollout actor names (replica.py, *_async_server.py, *_pd_replica.py);
a name with another word may be a new kind of server that discovery would call rollout."""
MAX_LOG_NAMES = 10_000  # distinct timer and MFU-stage names a log's check keeps
SERVER_CLASS = "vLLMHttpServer"  # the class a server name is checked with


@dataclass(frozen=True)
class Finding:
    kind: str  # timer, mfu_stage, logger_env, logger_record, server_name, read_key
    name: str
    where: tuple[str, ...]  # file:line (or "step N" of a log), every place it occurs
    known: bool
    note: str  # how the project reads it, or why it does not know it
    fatal: bool = True  # an unknown that fails the check (read_key only informs)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "known": self.known,
            "note": self.note,
            "where": list(self.where),
        }


def _timer_note(name: str, th: Thresholds) -> str | None:
    """How the decision table reads timer `name`, or None when it does not name it."""
    if name in th.ignored_timers:
        return "not a window of the step (ignored_timers)"
    if name in th.split_timers:
        outer, rest = th.split_timers[name]
        return f"split from `{outer}` ({th.timer_groups.get(name, 'other')}; rest `{rest}`)"
    if name in th.nested_timers:
        return f"nested in `{th.nested_timers[name]}` ({th.timer_groups.get(name, 'other')})"
    group = th.timer_groups.get(name)
    if group is not None:
        regroup = th.regrouped_timers.get(name)
        extra = f"; `{regroup[1]}` with `{regroup[0]}`" if regroup else ""
        return f"group `{group}`{extra}"
    if name in named_timers(th):
        return "named (nested/split/regrouped timer)"
    return None


def resolved_name(timer: Timer, tree: Tree) -> str | None:
    """The logged name of a timer: a literal (without one `timing_s/` prefix), or
    `str(Role.X)` read through the tree's own Role table."""
    if timer.name is not None:
        return (
            timer.name[len(TIMER_PREFIX) :] if timer.name.startswith(TIMER_PREFIX) else timer.name
        )
    m = re.fullmatch(r"str\(Role\.(\w+)\)", timer.expr)
    if m:
        member = m.group(1)
        return tree.role_strings.get(member) or ROLE_STRINGS.get(member, member.lower())
    return None


def check_timers(tree: Tree, th: Thresholds) -> list[Finding]:
    by_name: dict[tuple[str, bool], list[Timer]] = {}
    for t in tree.timers:
        name = resolved_name(t, tree)
        by_name.setdefault((name if name is not None else f"<{t.expr}>", name is None), []).append(
            t
        )
    out = []
    for (name, dynamic), calls in by_name.items():
        where = tuple(f"{t.where} ({t.in_step})" for t in calls)
        if dynamic:
            out.append(Finding("timer", name, where, False, "a name computed at run time"))
            continue
        note = None
        if all(t.agent_loop for t in calls) and name in AGENT_PARTS:
            note = f"agent-loop statistic (timing_s/{AGENT_LOOP}{name}/...), not a window"
        note = note or _timer_note(name, th)
        if note is None and name in NOT_TIMERS:
            note = NOT_TIMERS[name]
        if note is None:
            note = (
                "not named by the decision table: counted in `other`, clipped to the untimed time"
            )
        out.append(Finding("timer", name, where, not note.startswith("not named"), note))
    return out


def check_mfu(stages: Mapping[str, str]) -> list[Finding]:
    return [
        Finding(
            "mfu_stage",
            MFU_PREFIX + stage,
            (where,),
            stage in MFU_STAGES,
            "exported as rlhf_mfu_ratio{stage}"
            if stage in MFU_STAGES
            else "not a known stage: dropped and counted as unknown_mfu_stage",
        )
        for stage, where in sorted(stages.items())
    ]


def check_logger(tree: Tree) -> list[Finding]:
    if not tree.logger_where:
        return []  # a recipe tree or a fork without verl's utils/tracking.py
    out = [
        Finding(
            "logger_env",
            var,
            (where,),
            var in LOGGER_ENV,
            "the file logger's path (docs/verl-support.md)"
            if var in LOGGER_ENV
            else "a path variable the sidecar does not read",
        )
        for var, where in sorted(tree.logger_env.items())
    ]
    out += [
        Finding(
            "logger_env", var, (tree.logger_where,), False, "no longer read by verl's FileLogger"
        )
        for var in LOGGER_ENV
        if var not in tree.logger_env
    ]
    fmt = f"{{{', '.join(tree.logger_record)}}} by {tree.logger_serializer or '?'}, "
    fmt += f"open(mode={tree.logger_mode or '?'!r})"
    known = (
        tree.logger_record == LOGGER_RECORD
        and tree.logger_serializer in LOGGER_SERIALIZERS
        and tree.logger_mode in LOGGER_MODES
    )
    note = (
        "one JSON object per line, as the reader expects"
        if known
        else "a record format the reader does not know"
    )
    return out + [Finding("logger_record", fmt, (tree.logger_where,), known, note)]


def check_server_names(tree: Tree, roles: RoleMap | None = None) -> list[Finding]:
    roles = roles or RoleMap.default()
    out = []
    for s in tree.server_names:
        words = [w for w in s.sample.split("_") if w and not w.isdigit() and w not in ENGINES]
        strange = [w for w in words if w not in SERVER_WORDS]
        want = "reward" if "reward" in words else "teacher" if "teacher" in words else "rollout"
        got = roles.role(SERVER_CLASS, s.sample)
        known = not strange and got == want
        if strange:
            note = f"unknown word(s) {', '.join(strange)}: discovery would call it {got}"
        else:
            note = f"discovery: {got}" + ("" if got == want else f" (should be {want})")
        out.append(Finding("server_name", s.fmt, (s.where,), known, note))
    return out


def read_keys() -> list[str]:
    """The verl keys the exporter reads (the catalog's series, the decision table's inputs,
    the evidence of the reasons)."""
    keys = ["timing_s/step", "perf/total_num_tokens", "perf/throughput", "prompt_length/mean"]
    keys += [f"response_length/{s}" for s in RESPONSE_STATS]
    keys += [f"{NON_ABORTED_PREFIX}{s}" for s in RESPONSE_STATS]
    keys += [ABORTED_KEY, *RESOURCE_KEYS]
    keys += [f"{PROCESSING_PREFIX}{s}" for s in sorted(PROCESSING_STATS)]
    keys += [k for spellings in MEMORY_KEYS.values() for k in spellings]
    keys += [MFU_PREFIX + s for s in sorted(MFU_STAGES)]
    keys += sorted(k.removeprefix(TIMER_PREFIX) for k in EVIDENCE_KEYS)
    return list(dict.fromkeys(keys))


def check_read_keys(tree: Tree, th: Thresholds) -> list[Finding]:
    """Keys the exporter reads that the tree never writes (a renamed key reads as missing).
    Informative: a key of another verl version or of a recipe is absent from most trees."""
    heads = [s[:-1] for s in tree.strings if s.endswith("{")]
    out = []
    for key in [*read_keys(), th.generation_batches_key]:
        _, _, rest = key.partition("/")
        found = key in tree.strings or any(h and key.startswith(h) for h in heads)
        if not found and rest in tree.strings:
            continue  # written without its first segment, which verl adds (actor/perf/...)
        if not found:
            out.append(
                Finding(
                    "read_key", key, (), False, "read by the exporter, written nowhere here", False
                )
            )
    return out


def check_tree(tree: Tree, th: Thresholds) -> list[Finding]:
    return [
        *check_timers(tree, th),
        *check_mfu(tree.mfu_stages),
        *check_logger(tree),
        *check_server_names(tree),
        *check_read_keys(tree, th),
    ]


def check_records(records: Iterable[Record], th: Thresholds) -> list[Finding]:
    """A log's timers and MFU stages (`timing_s/*`, `perf/mfu/*`), each with its first step."""
    timers: dict[str, str] = {}
    stages: dict[str, str] = {}
    dropped = 0  # names past MAX_LOG_NAMES (a hostile log): counted, not kept
    for record in records:
        for key in record.data:
            name = timer_name(key)
            seen = timers if name is not None else stages if key.startswith(MFU_PREFIX) else None
            if seen is None:
                continue
            label = name if name is not None else key[len(MFU_PREFIX) :]
            if label in seen:
                continue
            if len(timers) + len(stages) >= MAX_LOG_NAMES:
                dropped += 1
                continue
            seen[label] = f"step {record.step}"
    out = []
    if dropped:
        why = f"more timer or MFU-stage names than {MAX_LOG_NAMES}: not listed"
        out.append(Finding("timer", f"{dropped} more names", (), False, why))
    for name, where in timers.items():
        note = _timer_note(name, th)
        out.append(
            Finding(
                "timer",
                name,
                (where,),
                note is not None,
                note
                or "not named by the decision table: counted in `other`, clipped to the untimed time",
            )
        )
    return out + check_mfu(stages)


def failed(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if not f.known and f.fatal]
