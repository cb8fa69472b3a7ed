"""Which part of a verl job a Ray actor is, from its class name.

An ordered list of rules `(role, pattern)`; the first whose regular expression matches the
whole `class_name` wins (anchored, as in Prometheus relabelling), and a class no rule
matches is `other`. Ray reports `__qualname__`, so a class defined inside a function
arrives as `outer.<locals>.Name`: a rule matches the full name or the part after the last
dot. The defaults cover the classes verl creates (see
../shared/spec/verl-stream.md). A YAML file adds rules in front of the defaults:

    - {role: rollout, pattern: 'MyVllmServer.*'}
    - {role: trainer, pattern: 'MegatronWorker'}
    # a final catch-all turns the defaults off:
    # - {role: other, pattern: '.*'}

(or the same list under a top-level `roles:` key).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import ConfigError, read_yaml

ROLES: tuple[str, ...] = ("trainer", "rollout", "agent_loop", "reward", "driver", "other")
UNMATCHED = "other"


@dataclass(frozen=True)
class Rule:
    role: str
    pattern: re.Pattern[str]


DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    # the driver: verl's main_ppo TaskRunner (V1 trainer: TaskRunnerV1)
    ("driver", r"TaskRunner(V\d+)?"),
    # training workers: the colocated fused worker, split workers, fully-async trainer
    (
        "trainer",
        r"WorkerDict|ActorRolloutRefWorker|AsyncActorRolloutRefWorker|TrainingWorker"
        r"|DetachActorWorker|DetachAsyncRolloutWorker|CriticWorker|RefWorker|FullyAsyncTrainer",
    ),
    # rollout servers (vLLM, SGLang, TensorRT-LLM) and the weight-transfer engine
    (
        "rollout",
        r"vLLMHttpServer\w*|SGLangHttpServer\w*|TRTLLMHttpServer\w*|AsyncvLLMServer\w*"
        r"|AsyncSglangServer\w*|CheckpointEngineWorker|FullyAsyncRollouter",
    ),
    ("agent_loop", r"AgentLoopWorker\w*|AgentLoopManager"),
    ("reward", r"RewardLoopWorker|RewardModelWorker|RewardManagerWorker\w*"),
    # fully-async's queue between rollouter and trainer, and anything else
    ("other", r"MessageQueue"),
)


class RoleMap:
    """class_name -> role; results are cached (a cluster has few classes)."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = tuple(rules)
        self._cache: dict[str, str] = {}

    @classmethod
    def default(cls) -> RoleMap:
        return cls(_compile(DEFAULT_RULES, "built-in roles"))

    @classmethod
    def from_file(cls, path: str | None) -> RoleMap:
        """The file's rules first, then the defaults. None: the defaults alone."""
        if path is None:
            return cls.default()
        return cls(parse_rules(read_yaml(path), str(path)) + cls.default().rules)

    def role(self, class_name: str) -> str:
        role = self._cache.get(class_name)
        if role is None:
            role = UNMATCHED
            short = short_name(class_name)
            for rule in self.rules:
                if rule.pattern.fullmatch(class_name) or rule.pattern.fullmatch(short):
                    role = rule.role
                    break
            if len(self._cache) < 10_000:  # class names are few; bound it anyway
                self._cache[class_name] = role
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
    pairs = []
    for i, item in enumerate(doc):
        at = f"{where}: rule {i + 1}"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at}: expected a mapping with 'role' and 'pattern', got {item!r}")
        unknown = set(item) - {"role", "pattern"}
        if unknown:
            raise ConfigError(
                f"{at}: unknown key(s) {sorted(map(str, unknown))}; "
                "a rule has only 'role' and 'pattern'"
            )
        if "role" not in item or "pattern" not in item:
            raise ConfigError(f"{at}: needs both 'role' and 'pattern'")
        pairs.append((item["role"], item["pattern"]))
    return _compile(pairs, where)


def _compile(pairs: Iterable[tuple[Any, Any]], where: str) -> tuple[Rule, ...]:
    rules = []
    for i, (role, pattern) in enumerate(pairs):
        at = f"{where}: rule {i + 1}"
        if role not in ROLES:
            raise ConfigError(f"{at}: unknown role {role!r}; roles are {', '.join(ROLES)}")
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"{at}: 'pattern' must be a non-empty string, got {pattern!r}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{at}: invalid regular expression {pattern!r}: {exc}") from None
        rules.append(Rule(role, compiled))
    return tuple(rules)
