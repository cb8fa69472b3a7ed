"""Reading a verl source tree with `ast`: timers, MFU stages, the file logger, server names.

Nothing of verl is imported or run: the files are parsed. A tree is a directory (an installed
`site-packages/verl`, a checkout, the `verl-recipe` repository), a wheel (`.whl`) or an sdist
(`.tar.gz`); every `*.py` file in it is read, at most `MAX_FILES` of at most `MAX_FILE_BYTES`
each (what a bound drops is counted in `Tree.skipped`).
"""

from __future__ import annotations

import ast
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TIMER_CALLS = frozenset({"marked_timer", "_timer", "simple_timer"})
MFU_PREFIX = "perf/mfu/"
MAX_FILES = 20_000
MAX_FILE_BYTES = 4 << 20


@dataclass(frozen=True)
class Timer:
    name: str | None  # None when the name is not a literal (`expr` holds it)
    expr: str
    where: str  # file:line
    in_step: str  # "inside step", "via <function>", "outside step", "not in step"
    agent_loop: bool  # called from verl's agent loop: a per-sample statistic


@dataclass(frozen=True)
class ServerName:
    fmt: str  # the f-string as written, e.g. {prefix}server_reward_{self.replica_rank}_{node_rank}
    sample: str  # the name with placeholders filled in (vllm_server_reward_0_0)
    where: str


@dataclass
class Tree:
    """What a verl tree has that the project may depend on."""

    root: str
    files: int = 0
    skipped: int = 0  # files over the bounds or not Python that parses
    timers: list[Timer] = field(default_factory=list)
    mfu_stages: dict[str, str] = field(default_factory=dict)  # stage -> first file:line
    logger_env: dict[str, str] = field(default_factory=dict)  # env var -> file:line
    logger_record: tuple[str, ...] = ()  # keys of the FileLogger's record object
    logger_where: str = ""
    logger_serializer: str = ""  # orjson.dumps (0.7.1+), json.dumps (0.6)
    logger_mode: str = ""  # the open() mode: "wb" (0.7.1+), "w" (0.6)
    server_names: list[ServerName] = field(default_factory=list)
    strings: set[str] = field(default_factory=set)  # every string constant and f-string head
    role_strings: dict[str, str] = field(default_factory=dict)  # Role member -> str(Role.X)


def python_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(relative name, bytes) of every `*.py` in a directory, a wheel or an sdist."""
    if path.is_dir():
        for p in sorted(path.rglob("*.py")):
            if p.is_file() and p.stat().st_size <= MAX_FILE_BYTES:
                yield p.relative_to(path).as_posix(), p.read_bytes()
            else:
                yield p.relative_to(path).as_posix(), b""
    elif path.suffix == ".whl" or zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if info.filename.endswith(".py"):
                    big = info.file_size > MAX_FILE_BYTES
                    yield info.filename, b"" if big else z.read(info)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as t:
            for member in t:
                if member.isfile() and member.name.endswith(".py"):
                    f = None if member.size > MAX_FILE_BYTES else t.extractfile(member)
                    yield member.name, b"" if f is None else f.read()
    else:
        raise ValueError(f"{path}: not a directory, a wheel or an sdist (.tar.gz)")


def read_tree(path: Path) -> Tree:
    tree = Tree(str(path))
    parsed: list[tuple[str, ast.Module]] = []
    for name, data in python_files(path):
        if tree.files + tree.skipped >= MAX_FILES:
            tree.skipped += 1
            continue
        try:
            parsed.append((name, ast.parse(data, filename=name)))
            tree.files += 1
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree.skipped += 1
    reached = _reached_from_step(parsed)
    for name, module in parsed:
        _read_module(tree, name, module, reached)
    return tree


def _call_name(node: ast.AST) -> str | None:
    """`f` of a call `f(...)` or `x.f(...)`."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _timer_calls(node: ast.AST) -> Iterator[ast.Call]:
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _call_name(n) in TIMER_CALLS and n.args:
            yield n


def _step_blocks(module: ast.AST) -> list[ast.With | ast.AsyncWith]:
    """`with marked_timer("step", ...)` blocks."""
    out: list[ast.With | ast.AsyncWith] = []
    for n in ast.walk(module):
        if isinstance(n, (ast.With, ast.AsyncWith)):
            for item in n.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and _call_name(call) in TIMER_CALLS
                    and call.args
                    and _literal(call.args[0]) == "step"
                ):
                    out.append(n)
    return out


def _own_call(node: ast.AST) -> str | None:
    """`f` of a call `f(...)` or `self.f(...)`: a call the tree itself may define."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return func.attr if func.value.id == "self" else None
    return None


MAX_DEPTH = 4  # calls followed from a `step` block


def _reached_from_step(parsed: list[tuple[str, ast.Module]]) -> dict[str, str]:
    """Function name -> the function called inside a `step` block that leads to it, following
    `f(...)` and `self.f(...)` calls by name across the tree, at most `MAX_DEPTH` deep and
    never through a loop around `step` (a heuristic: Python resolves calls at run time)."""
    defs: dict[str, list[ast.AST]] = {}
    for _, module in parsed:
        for n in ast.walk(module):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(n.name, []).append(n)
    reached: dict[str, str] = {}
    todo: list[tuple[str, str, int]] = []
    for _, module in parsed:
        for block in _step_blocks(module):
            for n in ast.walk(block):
                callee = _own_call(n)
                if callee in defs and callee not in reached:
                    reached[callee] = callee
                    todo.append((callee, callee, 1))
    while todo:
        name, origin, depth = todo.pop(0)
        if depth >= MAX_DEPTH:
            continue
        for fn in defs.get(name, ()):
            if _step_blocks(fn):  # a loop around `step` (fit): decided by its lines
                continue
            for n in ast.walk(fn):
                callee = _own_call(n)
                if callee in defs and callee not in reached:
                    reached[callee] = origin
                    todo.append((callee, origin, depth + 1))
    return reached


def _functions(module: ast.Module) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    """(node, enclosing function defs, innermost last) for every node."""
    stack: list[tuple[ast.AST, list[ast.AST]]] = [(module, [])]
    while stack:
        node, outer = stack.pop()
        yield node, outer
        inner = (
            outer + [node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else outer
        )
        for child in ast.iter_child_nodes(node):
            stack.append((child, inner))


def _actor_names(module: ast.Module) -> set[int]:
    """ids of the f-strings a module gives as a name (`name = f"..."`, `actor_name=f"..."`,
    `name_prefix = f"..."`): not a resource pool's name (`resource_pool_name`)."""
    out: set[int] = set()
    for n in ast.walk(module):
        pairs: list[tuple[str, ast.AST]] = []
        if isinstance(n, ast.Assign):
            for target in n.targets:
                label = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
                pairs.append((label, n.value))
        elif isinstance(n, ast.keyword) and n.arg:
            pairs.append((n.arg, n.value))
        for label, value in pairs:
            if label.endswith(("name", "name_prefix")) and "pool" not in label:
                for v in ast.walk(value):  # also `x if c else y`
                    if isinstance(v, ast.JoinedStr):
                        out.add(id(v))
    return out


def _read_module(tree: Tree, name: str, module: ast.Module, reached: dict[str, str]) -> None:
    steps = [(b.lineno, b.end_lineno or b.lineno) for b in _step_blocks(module)]
    agent_loop = "/agent_loop/" in f"/{name}"
    names = _actor_names(module) if "/rollout/" in f"/{name}" else set()
    parts = {id(v) for n in ast.walk(module) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node, outer in _functions(module):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in parts:  # an f-string's literal parts: read with the f-string
                _string(tree, name, node, node.value)
        elif isinstance(node, ast.JoinedStr):
            _fstring(tree, name, node, id(node) in names)
        if isinstance(node, ast.Call) and _call_name(node) in TIMER_CALLS and node.args:
            timer = _timer(name, node, outer, steps, reached, agent_loop)
            if timer is not None:
                tree.timers.append(timer)
        elif isinstance(node, ast.Assign):
            for key, line in _timing_keys(node):
                if not key.startswith("agent_loop/"):  # per-sample statistics, not windows
                    where = f"{name}:{line}"
                    tree.timers.append(Timer(key, repr(key), where, "meta_info timing", agent_loop))
        if isinstance(node, ast.ClassDef) and node.name == "FileLogger":
            _file_logger(tree, name, node)
        if isinstance(node, ast.Dict):
            _role_strings(tree, node)


def _role_strings(tree: Tree, node: ast.Dict) -> None:
    """verl's `Role._get_role_string` table ({Role.RefPolicy: "ref", ...}): the timer
    `marked_timer(str(Role.RefPolicy), ...)` is named by it."""
    pairs = []
    for k, v in zip(node.keys, node.values):
        if not (
            isinstance(k, ast.Attribute)
            and isinstance(k.value, ast.Name)
            and k.value.id == "Role"
            and (text := _literal(v))
        ):
            return
        pairs.append((k.attr, text))
    tree.role_strings.update(pairs)


def _is_meta_timing(node: ast.AST) -> bool:
    """`<x>["timing"]`: a worker's `output.meta_info["timing"]`, which the trainer merges into
    the step's timers (`timing_raw.update(output.meta_info["timing"])`)."""
    return (
        isinstance(node, ast.Subscript)
        and _literal(node.slice) == "timing"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "meta_info"
    )


def _timing_keys(node: ast.Assign) -> Iterator[tuple[str, int]]:
    """Keys a worker hands the trainer as timers without a timer call
    (`meta_info["timing"] = {"get_teacher_knowledge": ...}` in GKD,
    `meta_info["timing"]["x"] = ...`)."""
    for target in node.targets:
        if isinstance(target, ast.Subscript) and _is_meta_timing(target.value):
            key = _literal(target.slice)
            if key:
                yield key, node.lineno
        elif _is_meta_timing(target) and isinstance(node.value, ast.Dict):
            for k in node.value.keys:
                key = _literal(k) if k is not None else None
                if key:
                    yield key, node.lineno


def _timer(
    name: str,
    call: ast.Call,
    outer: list[ast.AST],
    steps: list[tuple[int, int]],
    reached: dict[str, str],
    agent_loop: bool,
) -> Timer | None:
    arg = call.args[0]
    fn = outer[-1] if outer else None
    params = set()
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    if isinstance(arg, ast.Name) and arg.id in params:
        return None  # a wrapper passing its own parameter on (marked_timer itself)
    line = call.lineno
    looping = [f for f in outer if any(f.lineno <= a <= (f.end_lineno or a) for a, _ in steps)]  # type: ignore[attr-defined]
    via = [getattr(f, "name", "") for f in outer if getattr(f, "name", "") in reached]
    if any(a <= line <= b for a, b in steps):
        where_in = "inside step"
    elif looping:  # in the loop around `step`, before or after it
        where_in = "outside step"
    elif via:
        where_in = f"via {reached[via[-1]]}"
    else:
        where_in = "not in step"
    return Timer(_literal(arg), ast.unparse(arg), f"{name}:{line}", where_in, agent_loop)


def _string(tree: Tree, name: str, node: ast.Constant, value: str) -> None:
    if len(value) <= 200:
        tree.strings.add(value)
    if value.startswith(MFU_PREFIX) and len(value) > len(MFU_PREFIX):
        tree.mfu_stages.setdefault(value[len(MFU_PREFIX) :], f"{name}:{node.lineno}")


def _fstring(tree: Tree, name: str, node: ast.JoinedStr, actor_name: bool) -> None:
    head = _literal(node.values[0]) if node.values else None
    if head:
        tree.strings.add(head + "{")  # an f-string's literal head: keys built with a suffix
    if head and head.startswith(MFU_PREFIX):
        tree.mfu_stages.setdefault(head[len(MFU_PREFIX) :] + "{…}", f"{name}:{node.lineno}")
    if not actor_name:
        return
    text = "".join(_part(v) for v in node.values)
    words = [str(v.value) for v in node.values if isinstance(v, ast.Constant)]
    if any("server_" in w for w in words) or any(w.startswith("rollout_") for w in words[:1]):
        tree.server_names.append(ServerName(text, _sample(node), f"{name}:{node.lineno}"))


def _part(v: ast.expr) -> str:
    """One part of an f-string as written: a literal, or `{expression}`."""
    if isinstance(v, ast.Constant):
        return str(v.value)
    if isinstance(v, ast.FormattedValue):
        return "{" + ast.unparse(v.value) + "}"
    return ast.unparse(v)


def _sample(node: ast.JoinedStr) -> str:
    """An f-string's value with `{prefix}` as `vllm_`, suffixes empty, other fields 0."""
    out = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            out.append(str(v.value))
            continue
        expr = ast.unparse(v.value)  # type: ignore[attr-defined]
        if expr.endswith("prefix"):
            out.append("vllm_")
        elif expr.endswith("suffix"):
            out.append("")
        else:
            out.append("0")
    return "".join(out)


def _file_logger(tree: Tree, name: str, cls: ast.ClassDef) -> None:
    """The logger's path variables (`os.getenv("X")`, `os.environ["X"]`), the keys of the
    record object it writes, the serializer and the file's open mode."""
    tree.logger_where = f"{name}:{cls.lineno}"
    for n in ast.walk(cls):
        if isinstance(n, ast.Call):
            callee = _call_name(n)
            var = _literal(n.args[0]) if n.args else None
            if callee in ("get", "getenv") and var and var.isupper():
                tree.logger_env.setdefault(var, f"{name}:{n.lineno}")
            if callee == "dumps":
                tree.logger_serializer = ast.unparse(n.func)
            if callee == "open" and len(n.args) > 1 and (mode := _literal(n.args[1])):
                tree.logger_mode = mode
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "log":
            dicts = [
                tuple(_literal(k) or "" for k in d.keys if k)
                for d in ast.walk(n)
                if isinstance(d, ast.Dict) and d.keys and all(_literal(k) for k in d.keys if k)
            ]
            with_step = [keys for keys in dicts if "step" in keys]
            if with_step or dicts:
                tree.logger_record = (with_step or dicts)[0]
        if isinstance(n, ast.Subscript) and (var := _literal(n.slice)) and var.isupper():
            tree.logger_env.setdefault(var, f"{name}:{n.lineno}")


def installed_verl() -> Path | None:
    """The installed verl package's directory, found without importing it."""
    from importlib.util import find_spec

    spec = find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
