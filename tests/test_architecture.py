"""The package's shape, as docs/architecture.md draws it, checked on its own source (ast):

- every import runs down the layer order (or stays within its layer), and no modules
  import each other in a circle;
- no function is longer than MAX_LINES (prose lives in Markdown templates, so no function
  is a long table of text);
- no module is longer than MAX_MODULE_LINES, except the declarative tables named in
  TABLE_MODULES (a table of every setting, of every metric);
- a record goes through the job package one way: each of its modules imports only those
  before it in JOB_ORDER, and each limit the package names is defined there only.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rlhf_exporter"

# lowest first: a module may import its own layer's modules and those of the layers before
# it, never one of a later layer (docs/architecture.md, "Layers")
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("rlhf_exporter", "diagnosis", "frameworks", "metrics", "lifecycle", "logs")),
    ("configuration", ("thresholds_file", "auth", "options", "settings")),
    ("generated and drawn", ("render", "view")),
    ("the join", ("join",)),
    ("one job", ("job",)),
    ("sources", ("sources",)),
    ("server", ("server",)),
    ("demo", ("demo",)),
    ("tools", ("drift",)),
    ("commands", ("commands", "cli", "__main__")),
)
MAX_LINES = 80
MAX_MODULE_LINES = 600
# modules held to MAX_MODULE_LINES (paths under rlhf_exporter/); add a module here once it
# fits, until every module outside the declarative tables is listed
# the modules that are one declarative table each, allowed past MAX_MODULE_LINES: every
# `serve` option (flag, key, variable, default, help), every exported metric
TABLE_MODULES: tuple[str, ...] = ("options.py", "metrics/catalog.py")
# the job package in the order a record goes through it (rlhf_exporter/job/__init__.py)
JOB_ORDER = (
    "limits",
    "record_keys",
    "cleaning",
    "counts",
    "end_signals",
    "packed_history",
    "placement",
    "series",
    "summary",
    "state",
    "windows_wire",
)
# declarative tables (a rule, a markdown generator) exempt from MAX_LINES: none left, as their
# prose now lives in rlhf_exporter/render/templates/


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level == 0:
        names = [f"{node.module}.{a.name}" for a in node.names]
    else:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
        names = [f"{base}.{a.name}" for a in node.names]
    out = []
    for name in names:  # `from . import style` is the module; `from . import X` the package
        while name not in MODULES and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in MODULES and name != module:
            out.append(name)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in it: a lazy import counts)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(_targets(module, path, node))
    return graph


def layer(module: str) -> int:
    rest = module.split(".")[1:2] or ["rlhf_exporter"]
    for i, (_title, tops) in enumerate(LAYERS):
        if rest[0] in tops:
            return i
    raise AssertionError(f"{module} is on no layer: add it to LAYERS and docs/architecture.md")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_on_a_layer():
    assert {m: layer(m) for m in MODULES}


def test_no_import_climbs_up_a_layer():
    graph = import_graph()
    up = sorted(
        f"{m} ({LAYERS[layer(m)][0]}) -> {t} ({LAYERS[layer(t)][0]})"
        for m, targets in graph.items()
        for t in targets
        if layer(t) > layer(m)
    )
    assert up == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_checks_see_a_circle_and_a_climb():
    """The checks above can fail: a drawn circle is found, and so is an upward import."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = import_graph()
    assert "rlhf_exporter.join.board" in graph["rlhf_exporter.sources.nvml"]
    assert layer("rlhf_exporter.sources.nvml") > layer("rlhf_exporter.join.board")


def _functions() -> list[tuple[str, str, int]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rel = path.relative_to(PKG).as_posix()
                out.append((rel, node.name, (node.end_lineno or node.lineno) - node.lineno + 1))
    return out


def test_no_function_is_over_80_lines():
    long = sorted(f"{rel}:{name} ({n} lines)" for rel, name, n in _functions() if n > MAX_LINES)
    assert long == []


def test_mypy_runs_strict_on_every_module():
    """pyproject's mypy config (scripts/test.sh and CI run `mypy` with it): strict, over the
    whole package, with no module let off."""
    import tomllib

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert mypy.get("strict") is True and mypy["packages"] == ["rlhf_exporter"]
    assert "overrides" not in mypy and not any(k.startswith("disallow") for k in mypy)


def too_long(paths: list[Path]) -> list[str]:
    """The modules among `paths` over MAX_MODULE_LINES, with their lengths."""
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return [f"{p.name} ({n} lines)" for p, n in sizes.items() if n > MAX_MODULE_LINES]


def test_no_module_outside_the_tables_is_over_600_lines():
    modules = sorted(PKG.rglob("*.py"))
    tables = {PKG / rel for rel in TABLE_MODULES}
    assert tables <= set(modules)  # a table that moved must be named again
    assert too_long([p for p in modules if p not in tables]) == []


def backward(graph: dict[str, set[str]], order: tuple[str, ...]) -> list[str]:
    """Imports from a module of `order` to itself or one after it."""
    rank = {m: i for i, m in enumerate(order)}
    return sorted(f"{m} -> {t}" for m in order for t in graph[m] if rank.get(t, -1) >= rank[m])


def test_a_record_never_goes_back_in_the_job_package():
    """A module of the job package imports only modules before it in JOB_ORDER: a record
    followed from cleaning to the series never returns to a module it has left."""
    order = tuple(f"rlhf_exporter.job.{m}" for m in JOB_ORDER)
    assert backward(import_graph(), order) == []


def test_the_checks_see_a_long_module_and_a_step_back(tmp_path):
    """The two checks above can fail: a 601-line module is too long, and an import from a
    module to a later one goes back."""
    long, short = tmp_path / "long.py", tmp_path / "short.py"
    long.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    short.write_text("x = 1\n" * MAX_MODULE_LINES)
    assert too_long([long, short]) == [f"long.py ({MAX_MODULE_LINES + 1} lines)"]
    assert backward({"a": set(), "b": {"a", "c"}, "c": set()}, ("a", "b", "c")) == ["b -> c"]


def test_every_job_module_is_in_the_order():
    job = {m.rsplit(".", 1)[1] for m in MODULES if m.startswith("rlhf_exporter.job.")}
    assert job == set(JOB_ORDER)


def _constants(path: Path) -> set[str]:
    out = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        out |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return out


def _limits(path: Path) -> set[str]:
    return {n for n in _constants(path) if n.startswith("MAX_") or n.endswith(("_CHARS", "_BYTES"))}


def test_each_limit_of_the_job_package_has_one_definition():
    """A limit the job package defines (MAX_STEP, KEY_LABEL_CHARS, WIRE_NAME_CHARS, ...) is
    defined nowhere else in the package: one name, one value, one place."""
    job = {p: _limits(p) for p in sorted((PKG / "job").glob("*.py"))}
    mine = [name for names in job.values() for name in names]
    assert len(mine) == len(set(mine))
    elsewhere = sorted(
        f"{p.relative_to(PKG)}: {name}"
        for p in sorted(PKG.rglob("*.py"))
        if p.parent != PKG / "job"
        for name in _limits(p) & set(mine)
    )
    assert elsewhere == []
    assert {"MAX_STEP", "KEY_LABEL_CHARS", "WIRE_NAME_CHARS"} <= set(mine)
    assert not any("MAX_LABEL_CHARS" in _constants(p) for p in PKG.rglob("*.py"))
