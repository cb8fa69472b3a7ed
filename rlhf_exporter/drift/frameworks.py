"""The drift check of the frameworks beyond verl (`rlhf-exporter framework-drift`): the timing
keys a framework's release writes that its mapping (`frameworks/tables.py`) does not know.

The release is read with `ast`, never imported. Each framework names its timers its own way
(docs/frameworks.md): a literal key (OpenRLHF's `timing/*`, ROLL's `time/*`), a call that
takes the timer's name (AReaL's `record_timing`, NeMo-RL's `timer.time`, slime's `timer`),
or a decorated function whose name is the timer's (slime's `@timer`). `Rule` says which, and
where in the tree; a name built at run time (an f-string) is kept as a pattern with its
placeholders, `{role}_onload`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..frameworks import TABLES, Framework, is_timer
from .source import python_files


@dataclass(frozen=True)
class Rule:
    """One way a framework's code names a timing key."""

    kind: str  # "literal", "call", "decorator" or "dict_key"
    template: str  # the key, "{}" standing for the name found
    names: frozenset[str] = frozenset()  # the callable (or, for dict_key, function) names
    receiver: str | None = None  # "call": the object the method is called on (timer.time)
    prefix: str = ""  # "literal": the keys start so
    files: tuple[str, ...] = ()  # read only files whose path holds one of these
    skip_functions: frozenset[str] = frozenset()  # calls inside these functions are not read
    skip_calls: frozenset[str] = frozenset()  # "literal": not the arguments of these calls


RULES: dict[str, tuple[Rule, ...]] = {
    "openrlhf": (Rule("literal", "{}", prefix="timing/", files=("trainer/",)),),
    "areal": (
        Rule("call", "timeperf/{}", frozenset({"record_timing"}), files=("trainer/rl_trainer.py",)),
    ),
    "nemo_rl": (
        Rule(
            "call",
            "timing/train/{}",
            frozenset({"time", "start"}),
            receiver="timer",
            files=("algorithms/grpo.py",),
            skip_functions=frozenset({"validate"}),  # its timer goes to timing/validation/
        ),
    ),
    "slime": (
        Rule("call", "perf/{}_time", frozenset({"timer", "inverse_timer"}), files=("slime/",)),
        Rule("decorator", "perf/{}_time", frozenset({"timer"}), files=("slime/",)),
        Rule(
            "dict_key",
            "perf/{}",
            frozenset({"compute_perf_metrics_from_samples"}),
            files=("observability/rollout_metrics.py",),
        ),
        Rule("literal", "{}", prefix="perf/", files=("observability/train_metric_utils.py",)),
    ),
    "roll": (
        Rule(
            "literal",
            "{}",
            prefix="time/",
            files=("pipeline/rlvr/",),
            # a domain's timers are logged as <domain>/time/...: not step windows
            skip_calls=frozenset({"add_domain_metrics"}),
        ),
    ),
}


@dataclass
class Key:
    """A timing key the release writes."""

    key: str  # placeholders of a name built at run time stay as {expr}
    where: list[str] = field(default_factory=list)  # file:line
    known: bool = False
    note: str = ""


def _text(node: ast.AST) -> str | None:
    """A string literal as written, an f-string with its placeholders as {expr}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                parts.append("{" + ast.unparse(v.value) + "}")
        return "".join(parts)
    return None


def _callee(node: ast.Call) -> tuple[str | None, str | None]:
    """(name, receiver) of a call: `timer.time(...)` is ("time", "timer")."""
    f = node.func
    if isinstance(f, ast.Name):
        return f.id, None
    if isinstance(f, ast.Attribute):
        receiver = f.value.id if isinstance(f.value, ast.Name) else None
        return f.attr, receiver
    return None, None


def _decorator_name(node: ast.expr) -> str | None:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    return target.attr if isinstance(target, ast.Attribute) else None


def _walk(node: ast.AST, skip: frozenset[str], function: str = "") -> Iterator[tuple[ast.AST, str]]:
    """Every node with the name of the function it sits in, not entering `skip`."""
    for child in ast.iter_child_nodes(node):
        name = function
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            if child.name in skip:
                continue
            name = child.name
        yield child, name
        yield from _walk(child, skip, name)


def _inside_calls(module: ast.Module, names: frozenset[str]) -> set[int]:
    """The ids of every node in the arguments of a call to one of `names`."""
    out: set[int] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and _callee(node)[0] in names:
            out.update(id(n) for arg in [*node.args, *node.keywords] for n in ast.walk(arg))
    return out


def _names(rule: Rule, module: ast.Module) -> Iterator[tuple[str, int]]:
    """(name, line) of every timer `rule` finds in a module."""
    skipped = _inside_calls(module, rule.skip_calls) if rule.skip_calls else set()
    for node, function in _walk(module, rule.skip_functions):
        if rule.kind == "literal" and id(node) not in skipped:
            text = _text(node)
            if text and text.startswith(rule.prefix) and text != rule.prefix:
                yield text, node.lineno  # type: ignore[attr-defined]
        elif rule.kind == "call" and isinstance(node, ast.Call) and node.args:
            name, receiver = _callee(node)
            if name in rule.names and (rule.receiver is None or receiver == rule.receiver):
                text = _text(node.args[0])
                if text:
                    yield text, node.lineno
        elif rule.kind == "decorator" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if any(_decorator_name(d) in rule.names for d in node.decorator_list):
                yield node.name, node.lineno
        elif rule.kind == "dict_key" and function in rule.names and isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and (text := _text(target.slice)):
                    yield text, node.lineno


def read_keys(framework: str, path: Path) -> tuple[dict[str, Key], int]:
    """The timing keys a release of `framework` writes (dir, wheel or sdist), and the number
    of Python files read."""
    rules = RULES[framework]
    keys: dict[str, Key] = {}
    files = 0
    for name, data in python_files(path):
        wanted = [r for r in rules if any(part in name for part in r.files)]
        if not wanted or not data:
            continue
        try:
            module = ast.parse(data, filename=name)
        except (SyntaxError, ValueError):
            continue
        files += 1
        for rule in wanted:
            for found, line in _names(rule, module):
                key = rule.template.format(found)
                keys.setdefault(key, Key(key)).where.append(f"{name}:{line}")
    return keys, files


def _known(fw: Framework) -> dict[str, str]:
    """Every key the mapping names, with what it is."""
    out = {w.key: f"window ({w.timer or 'a container'})" for w in fw.windows}
    out.update({k: "not a window of the step" for k in fw.not_windows})
    if fw.step_total:
        out[fw.step_total] = "the step total"
    return out


def check(framework: str, keys: dict[str, Key]) -> list[Key]:
    """The timer keys of a release, each marked known or not by the framework's mapping."""
    fw = TABLES[framework]
    known = _known(fw)
    out = []
    for key in sorted(keys):
        k = keys[key]
        if not is_timer(fw, key.replace("{", "").replace("}", "")):
            continue
        if key in known:
            k.known, k.note = True, known[key]
        elif "{" in key:
            pattern = re.compile(re.sub(r"\\\{[^}]*\\\}", ".*", re.escape(key)) + "$")
            matches = sorted(m for m in known if pattern.match(m))
            k.known = bool(matches)
            k.note = (
                "a name built at run time; the mapping knows " + ", ".join(matches)
                if matches
                else "a name built at run time; the mapping knows none of its values"
            )
        else:
            k.note = "not in the mapping: an unnamed timer, clipped into other"
        out.append(k)
    return out
