"""Which part of a verl job a Ray actor is, from its actor name and class name.

An ordered list of rules; the first that matches wins, and an actor no rule matches is
`other`. A rule matches the whole actor `name` (`name:` rules) or the whole `class_name`
(`pattern:` rules), anchored as in Prometheus relabelling. Name rules come first in the
defaults because verl reuses its rollout server classes for the reward model and the
distillation teacher: only the actor name tells `vllm_server_reward_0_0` (reward) from
`vllm_server_0_0` (rollout). Ray reports `__qualname__`, so a class defined inside a function
arrives as `outer.<locals>.Name`: a class rule matches the full name or the part after the
last dot. The defaults cover the classes and names verl 0.6-0.9.1 creates (see
docs/verl-support.md). A YAML file adds rules in front of the defaults:

    - {role: rollout, pattern: 'MyVllmServer.*'}
    - {role: trainer, pattern: 'MegatronWorker'}
    - {role: reward, name: 'my_judge_.*'}
    # a final catch-all turns the defaults off:
    # - {role: other, pattern: '.*'}

(or the same list under a top-level `roles:` key).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..frameworks import ACTOR_FRAMEWORKS
from ..thresholds_file import ConfigError, read_yaml

ROLES: tuple[str, ...] = (
    "trainer",
    "rollout",
    "agent_loop",
    "reward",
    "teacher",
    "driver",
    "other",
)
UNMATCHED = "other"
# the verl actors whose stdout holds a job's printed steps (verl's console logger) and its
# resolved config: main_ppo's TaskRunner (V1: TaskRunnerV1), one-step-off's, fully-async's
# runner and its trainer (which logs the steps); matched against a class name's last part
TRAINER_CLASSES = re.compile(
    r"TaskRunner(?:V\d+)?|OneStepTaskRunner|FullyAsyncTaskRunner|FullyAsyncTrainer"
    + "".join("|" + re.escape(c) for c in ACTOR_FRAMEWORKS)  # other frameworks' (frameworks/)
)
ON = ("pattern", "name")  # what a rule matches: the class name, or the actor name


@dataclass(frozen=True)
class Rule:
    role: str
    pattern: re.Pattern[str]
    on: str = "pattern"


# Actor names verl gives the servers and worker groups of a reward model or a distillation
# teacher, which run the rollout classes (vLLMHttpServer, SGLangHttpServer, TRTLLMHttpServer,
# CheckpointEngineWorker): `<engine>_server_reward_<replica>_<node>`,
# `<engine>_server_teacher_...`, and for the worker groups `rollout_reward_colocate_<replica>...`,
# `rollout_teacher_standalone_...` (verl's source: docs/verl-support.md, "Verified in verl
# source").
DEFAULT_NAME_RULES: tuple[tuple[str, str], ...] = (
    ("reward", r"(?:\w+_)?server_reward_.*|rollout_reward_.*"),
    ("teacher", r"(?:\w+_)?server_teacher_.*|rollout_teacher_.*"),
)

DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    # the driver: main_ppo's TaskRunner (V1: TaskRunnerV1), one-step-off's and fully-async's;
    # with V1, the TransferQueue that holds the driver's batches (its controller and storage
    # units, made by `tq.init()` in verl's main_ppo; seen in real V1 runs)
    (
        "driver",
        r"TaskRunner(V\d+)?|OneStepTaskRunner|FullyAsyncTaskRunner"
        r"|TransferQueueController|SimpleStorageUnit",
    ),
    # training workers: the colocated fused worker, split workers, fully-async trainer
    (
        "trainer",
        r"WorkerDict|FusedWorker|ActorRolloutRefWorker|AsyncActorRolloutRefWorker|TrainingWorker"
        r"|DetachActorWorker|DetachAsyncRolloutWorker|CriticWorker|RefWorker|FullyAsyncTrainer",
    ),
    # rollout servers (vLLM, SGLang, TensorRT-LLM), the weight-transfer engine, the request
    # router in front of the servers, and fully-async's rollout controller
    (
        "rollout",
        r"vLLMHttpServer\w*|SGLangHttpServer\w*|TRTLLMHttpServer\w*|AsyncvLLMServer\w*"
        r"|AsyncSglangServer\w*|CheckpointEngineWorker|GlobalRequestLoadBalancer"
        r"|FullyAsyncRollouter",
    ),
    ("agent_loop", r"AgentLoopWorker\w*|AgentLoopManager"),
    (
        "reward",
        r"RewardLoopWorker|RewardComputeWorker|RewardModelWorker|RewardManagerWorker\w*",
    ),
    # fully-async's queue between rollouter and trainer, and anything else
    ("other", r"MessageQueue"),
)


class RoleMap:
    """(class_name, actor name) -> role; results are cached."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = tuple(rules)
        self._names = any(r.on == "name" for r in self.rules)
        self._cache: dict[tuple[str, str], str] = {}

    @classmethod
    def default(cls) -> RoleMap:
        return cls(
            _compile(DEFAULT_NAME_RULES, "built-in roles", on="name")
            + _compile(DEFAULT_RULES, "built-in roles")
        )

    @classmethod
    def from_file(cls, path: str | None) -> RoleMap:
        """The file's rules first, then the defaults. None: the defaults alone."""
        if path is None:
            return cls.default()
        return cls(parse_rules(read_yaml(path), str(path)) + cls.default().rules)

    def role(self, class_name: str, name: str = "") -> str:
        """The role of an actor of class `class_name` named `name` ('' when unnamed or
        unknown, e.g. in Ray's per-class summaries: then only class rules apply)."""
        key = (class_name, name if self._names else "")
        role = self._cache.get(key)
        if role is None:
            role = UNMATCHED
            short = short_name(class_name)
            for rule in self.rules:
                if rule.on == "name":
                    hit = bool(name) and rule.pattern.fullmatch(name) is not None
                else:
                    hit = bool(rule.pattern.fullmatch(class_name) or rule.pattern.fullmatch(short))
                if hit:
                    role = rule.role
                    break
            if len(self._cache) < 10_000:  # bounded: actor names can be many
                self._cache[key] = role
        return role


def short_name(class_name: str) -> str:
    """Ray reports a class's __qualname__: verl's WorkerDict, made inside a function, arrives
    as `create_colocated_worker_cls.<locals>.WorkerDict`. Rules match either form."""
    return class_name.rsplit(".", 1)[-1]


def parse_rules(doc: Any, where: str) -> tuple[Rule, ...]:
    """Validate a roles document (a list of {role, pattern}); ConfigError says what is wrong."""
    if isinstance(doc, Mapping):
        extra = set(doc) - {"roles"}
        if extra or "roles" not in doc:
            raise ConfigError(
                f"{where}: expected a list of {{role, pattern}} "
                f"(or one under 'roles:'), got keys {sorted(map(str, doc))}"
            )
        doc = doc["roles"]
    if not isinstance(doc, list):
        raise ConfigError(
            f"{where}: expected a list of {{role, pattern}}, got {type(doc).__name__}"
        )
    rules: list[Rule] = []
    for i, item in enumerate(doc):
        at = f"{where}: rule {i + 1}"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at}: expected a mapping with 'role' and 'pattern', got {item!r}")
        unknown = set(item) - {"role", *ON}
        if unknown:
            raise ConfigError(
                f"{at}: unknown key(s) {sorted(map(str, unknown))}; "
                "a rule has only 'role' and 'pattern' (class name) or 'name' (actor name)"
            )
        on = [k for k in ON if k in item]
        if "role" not in item or len(on) != 1:
            raise ConfigError(
                f"{at}: needs 'role' and one of 'pattern' (class name) or 'name' (actor name)"
            )
        rules += _compile([(item["role"], item[on[0]])], where, on=on[0], first=i + 1)
    return tuple(rules)


def _compile(
    pairs: Iterable[tuple[Any, Any]], where: str, on: str = "pattern", first: int = 1
) -> tuple[Rule, ...]:
    rules = []
    for i, (role, pattern) in enumerate(pairs, start=first):
        at = f"{where}: rule {i}"
        if role not in ROLES:
            raise ConfigError(f"{at}: unknown role {role!r}; roles are {', '.join(ROLES)}")
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"{at}: '{on}' must be a non-empty string, got {pattern!r}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{at}: invalid regular expression {pattern!r}: {exc}") from None
        rules.append(Rule(role, compiled, on))
    return tuple(rules)
