"""Sample lines written directly, as prometheus_client's text 0.0.4 encoder writes them.

The exporter's one sample-line writer: tests/test_exposition_golden.py holds whole bodies
byte-identical to prometheus_client's generate_latest (text and OpenMetrics) on every
catalog family with the hardest label values and numbers. Only fragments of well-formed
samples of the catalog are written here (`lines` returns None for anything else, which then
takes prometheus_client's checked path, where bad samples are counted and dropped). Why, and
the line's grammar: docs/exposition.md.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from prometheus_client.utils import floatToGoString

from .catalog import BY_NAME, COUNTER
from .snapshot import Layout, PackedSamples, Sample


def _go(value: float) -> str:
    """prometheus_client's own float formatting (untyped upstream), typed here. A float
    whose `repr` has its dot within the first 7 characters (or none) and is not inf or nan
    is written as its `repr`, as floatToGoString writes it, without the call."""
    if type(value) is float:
        text = repr(value)
        if text.find(".") <= 6 and text[-1] != "f" and text[-1] != "n":
            return text
    slow: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return slow


# name -> (the sample name, (label index, 'label="') in label-name order, label count)
_Plan = tuple[str, tuple[tuple[int, str], ...], int]


def _plan(name: str) -> _Plan | None:
    metric = BY_NAME.get(name)
    if metric is None:
        return None
    sample_name = (
        metric.name.removesuffix("_total") + "_total" if metric.type == COUNTER else metric.name
    )
    order = sorted(range(len(metric.labels)), key=lambda i: metric.labels[i])
    return sample_name, tuple((i, f'{metric.labels[i]}="') for i in order), len(metric.labels)


_PLANS: dict[str, _Plan] = {name: p for name in BY_NAME if (p := _plan(name)) is not None}


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


# A packed job's line, but for its two label values and its value: `a` + experiment + `b`
# + project + `c` (label names sort experiment before project), or None (not a catalog row)
_Template = tuple[str, tuple[str, str, str] | None]
_TEMPLATES: weakref.WeakKeyDictionary[Layout, tuple[_Template, ...]] = (
    weakref.WeakKeyDictionary()
)  # as long as the layout lives (while a job holds it)


def _templates(layout: Layout) -> tuple[_Template, ...]:
    """Each row's family and line template (computed once per layout: jobs share them)."""
    hit = _TEMPLATES.get(layout)
    if hit is not None:
        return hit
    out: list[_Template] = []
    for name, extra in zip(layout.names, layout.extras):
        plan = _PLANS.get(name)
        if plan is None or len(extra) + 2 != plan[2] or not all(type(v) is str for v in extra):
            out.append((name, None))
            continue
        pieces: list[str] = []
        heads: list[int] = []
        cur = plan[0] + "{"
        for k, (i, prefix) in enumerate(plan[1]):
            cur += ('",' if k else "") + prefix
            if i < 2:
                pieces.append(cur)
                heads.append(i)
                cur = ""
            else:
                v = extra[i - 2]
                cur += _escape(v) if ("\\" in v or "\n" in v or '"' in v) else v
        pieces.append(cur + '"} ')
        out.append((name, (pieces[0], pieces[1], pieces[2]) if heads == [1, 0] else None))
    templates = _TEMPLATES[layout] = tuple(out)
    return templates


def _packed_lines(samples: PackedSamples) -> dict[str, bytes] | None:
    """`lines` of a packed job: its layout's templates, its two label values escaped once."""
    head = samples.head
    if len(head) != 2 or type(head[0]) is not str or type(head[1]) is not str:
        return None
    project, experiment = (_escape(v) if ("\\" in v or "\n" in v or '"' in v) else v for v in head)
    out: dict[str, list[str]] = {}
    for (name, t), value in zip(_templates(samples.layout), samples.values):
        if t is None:
            return None
        line = f"{t[0]}{experiment}{t[1]}{project}{t[2]}{_go(value)}\n"
        fam = out.get(name)
        if fam is None:
            out[name] = [line]
        else:
            fam.append(line)
    try:
        return {name: "".join(fam).encode("utf-8") for name, fam in out.items()}
    except UnicodeEncodeError:
        return None


def lines(samples: Sequence[Any]) -> dict[str, bytes] | None:
    """The samples' lines per family name (first-seen order, samples in order), or None when
    one is not a well-formed catalog `Sample` (a float or int value, str label values of
    the catalog's count) or a line cannot be encoded as UTF-8."""
    if type(samples) is PackedSamples:
        packed = _packed_lines(samples)
        if packed is not None:
            return packed
    plans = _PLANS
    out: dict[str, list[str]] = {}
    for s in samples:
        if type(s) is not Sample:
            return None
        name, labels, value = s
        plan = plans.get(name)
        if plan is None or type(labels) is not tuple or len(labels) != plan[2]:
            return None
        tv = type(value)
        if tv is not float and tv is not int:
            return None
        if plan[1]:
            parts = []
            for i, prefix in plan[1]:
                v = labels[i]
                if type(v) is not str:
                    return None
                if "\\" in v or "\n" in v or '"' in v:
                    v = _escape(v)
                parts.append(prefix + v)
            joined = '",'.join(parts)
            line = f'{plan[0]}{{{joined}"}} {_go(value)}\n'
        else:
            line = f"{plan[0]} {_go(value)}\n"
        fam = out.get(name)
        if fam is None:
            out[name] = [line]
        else:
            fam.append(line)
    try:
        return {name: "".join(fam).encode("utf-8") for name, fam in out.items()}
    except UnicodeEncodeError:  # a lone surrogate: prometheus_client's path counts it
        return None
