"""The pictures, as inline SVG strings: step anatomy, verdict strip, markers, throughput,
sparklines. Pure (no I/O); the job view (`/`, `/jobs/...`) and `diagnose --html` share it.

The colours are the dashboards' (`rlhf_exporter/render/dashboards/style.py`), so a bar here and a
stacked panel in Grafana read alike. The untimed remainder (inside the `other` group) is its
own segment, drawn in `other`'s colour with a hatch, so "time no timer saw" is visible.
Every element carries `class`/`data-*` attributes the browser tests read.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from html import escape

from ..diagnosis import GROUPS
from ..diagnosis.history import StepPoint
from ..render.dashboards.style import CHANGE_COLOURS, VERDICT_COLOURS

UNTIMED = "untimed"
UNTIMED_COLOUR = VERDICT_COLOURS["other"]  # the dashboards fold it into `other`
SEGMENTS = (*GROUPS, UNTIMED)  # stacking order, bottom up


def _f(x: float) -> str:
    return f"{x:.1f}"


def segments(p: StepPoint) -> list[tuple[str, float]]:
    """(segment, seconds) of one step, nonzero only; `other` without its untimed part."""
    out = []
    for group, seconds in zip(GROUPS, p.group_seconds):
        if group == "other":
            seconds -= p.untimed_seconds
        if seconds > 1e-9:
            out.append((group, seconds))
    if p.untimed_seconds > 1e-9:
        out.append((UNTIMED, p.untimed_seconds))
    return out


def colour(segment: str) -> str:
    return UNTIMED_COLOUR if segment == UNTIMED else VERDICT_COLOURS[segment]


HATCH = (
    '<defs><pattern id="untimed-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#ffffff"/>'
    f'<rect width="3" height="6" fill="{UNTIMED_COLOUR}"/></pattern></defs>'
)


def legend() -> str:
    """HTML: one swatch per segment, in the dashboards' colours."""
    items = []
    for seg in SEGMENTS:
        style = (
            f"background:repeating-linear-gradient(45deg,{UNTIMED_COLOUR} 0 3px,#fff 3px 6px)"
            if seg == UNTIMED
            else f"background:{colour(seg)}"
        )
        items.append(f'<span class="sw"><i style="{style}"></i>{seg}</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


WARM_UP_FILL = "#ececec"  # the band behind warm-up steps: pale, under the bars


def _warm_up_bands(warm: Collection[int], left: float, bw: float, top: int, base: int) -> str:
    """A pale band behind each stretch of warm-up steps (indices into the drawn points),
    labelled above the bars: their change was not judged, there was no baseline yet."""
    out, have = [], set(warm)
    for a in sorted(i for i in have if i - 1 not in have):
        z = a
        while z + 1 in have:
            z += 1
        x, w = left + a * bw, (z - a + 1) * bw
        out.append(
            f'<rect class="warm-up" data-first="{a}" data-last="{z}" x="{_f(x)}" y="{top}" '
            f'width="{_f(w)}" height="{base - top}" fill="{WARM_UP_FILL}"><title>warm-up: '
            "no baseline yet, so no change was judged (regression or workload shift)</title>"
            f'</rect><text class="warm-label axis" x="{_f(x + 2)}" y="{top - 5}">warm-up</text>'
        )
    return "".join(out)


def anatomy(
    points: Sequence[StepPoint], width: int = 900, height: int = 240, warm: Collection[int] = ()
) -> str:
    """Stacked bars: one per step, one segment per nonzero group (+ the untimed remainder);
    a verdict strip under the bars (reason on hover); markers above them for regressions
    (naming the regressed group) and workload shifts; a dashed line where a run starts; a
    pale band behind the warm-up steps (`warm`: their indices), before the run's baseline."""
    if not points:
        return '<p class="empty">No classified step yet.</p>'
    left, right, top, strip, bottom = 48, 8, 18, 12, 18
    plot_h = height - top - strip - bottom - 4
    plot_w = width - left - right
    n = len(points)
    bw = plot_w / n
    gap = min(1.0, bw * 0.15)
    ymax = max(p.step_seconds for p in points) or 1.0
    scale = plot_h / ymax
    base = top + plot_h
    out = [
        f'<svg class="anatomy" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="step anatomy of the last {n} steps">',
        HATCH,
        f'<text x="4" y="{top + 4}" class="axis">{ymax:.0f}s</text>'
        f'<text x="4" y="{base}" class="axis">0</text>'
        f'<line x1="{left}" y1="{top}" x2="{left + plot_w}" y2="{top}" class="grid"/>'
        f'<line x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}" class="grid"/>',
        _warm_up_bands(warm, left, bw, top, base),
    ]
    prev_run = points[0].run
    for i, p in enumerate(points):
        x = left + i * bw
        w = max(bw - gap, 0.5)
        title = f"step {p.step}: {p.step_seconds:.1f}s, {p.verdict}" + (
            f" ({p.reason})" if p.reason else ""
        )
        out.append(f'<g class="bar" data-step="{p.step}" data-run="{p.run}">')
        y = float(base)
        for seg, seconds in segments(p):
            h = seconds * scale
            y -= h
            fill = "url(#untimed-hatch)" if seg == UNTIMED else colour(seg)
            out.append(
                f'<rect class="seg" data-group="{seg}" data-colour="{colour(seg)}" '
                f'x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="{max(h, 0.2):.2f}" '
                f'fill="{fill}"><title>{escape(title)}&#10;{seg}: {seconds:.2f}s '
                f"({seconds / p.step_seconds:.0%})</title></rect>"
            )
        out.append("</g>")
        reason = f": {p.reason}" if p.reason else ""
        out.append(
            f'<rect class="verdict" data-verdict="{p.verdict}" x="{_f(x)}" y="{base + 4}" '
            f'width="{_f(w)}" height="{strip}" fill="{VERDICT_COLOURS[p.verdict]}">'
            f"<title>step {p.step}: {escape(p.verdict + reason)}</title></rect>"
        )
        cx = x + w / 2
        if p.change in ("regression", "workload_shift"):
            what = f"regression: {p.regressed}" if p.change == "regression" else "workload shift"
            shape = "▼" if p.change == "regression" else "◆"
            out.append(
                f'<text class="marker" data-step="{p.step}" data-change="{p.change}" '
                f'data-regressed="{p.regressed or ""}" x="{_f(cx)}" y="{top - 5}" '
                f'text-anchor="middle" fill="{CHANGE_COLOURS[p.change]}">{shape}'
                f"<title>step {p.step}: {escape(what)}</title></text>"
            )
        if p.run != prev_run:
            out.append(
                f'<line class="run" x1="{_f(x)}" y1="{top}" x2="{_f(x)}" y2="{base}">'
                f"<title>run {p.run} starts (a restart: new baseline)</title></line>"
            )
            prev_run = p.run
    out.append(
        f'<text x="{left}" y="{height - 3}" class="axis">step {points[0].step}</text>'
        f'<text x="{left + plot_w}" y="{height - 3}" class="axis" text-anchor="end">'
        f"step {points[-1].step}</text></svg>"
    )
    return "".join(out)


def line(
    points: Sequence[StepPoint],
    value: Callable[[StepPoint], float | None],
    label: str,
    width: int = 900,
    height: int = 110,
    colour_: str = "#3274D9",
) -> str:
    """A line of one value per step (e.g. tokens per GPU-second); gaps where it is unknown."""
    vals = [value(p) for p in points]
    known = [v for v in vals if v is not None]
    if not known:
        return f'<p class="empty">{escape(label)}: not logged by this job.</p>'
    left, right, top, bottom = 48, 8, 10, 16
    plot_w, plot_h = width - left - right, height - top - bottom
    vmax = max(known) or 1.0
    n = len(points)
    step_w = plot_w / n
    paths: list[list[str]] = []
    cur: list[str] = []
    for i, v in enumerate(vals):
        if v is None:
            if cur:
                paths.append(cur)
            cur = []
            continue
        cur.append(f"{left + (i + 0.5) * step_w:.1f},{top + plot_h - v / vmax * plot_h:.1f}")
    if cur:
        paths.append(cur)
    body = "".join(
        f'<polyline points="{" ".join(c)}" fill="none" stroke="{colour_}" stroke-width="1.8"/>'
        for c in paths
    )
    last = known[-1]
    return (
        f'<svg class="line" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">'
        f'<text x="4" y="{top + 4}" class="axis">{vmax:,.0f}</text>'
        f'<text x="4" y="{top + plot_h}" class="axis">0</text>'
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        f'class="grid"/>{body}<text x="{left + plot_w}" y="{height - 2}" class="axis" '
        f'text-anchor="end">{escape(label)}: last {last:,.0f}</text></svg>'
    )


def sparkline(points: Sequence[StepPoint], width: int = 240, height: int = 34) -> str:
    """Compact: step time as a line over a one-pixel-high verdict strip (the index page)."""
    if not points:
        return ""
    n = len(points)
    strip = 6
    plot_h = height - strip - 3
    smax = max(p.step_seconds for p in points) or 1.0
    dx = width / n
    coords = " ".join(
        f"{(i + 0.5) * dx:.0f},{1 + plot_h - p.step_seconds / smax * (plot_h - 1):.0f}"
        for i, p in enumerate(points)
    )
    cells, start = [], 0
    for i in range(1, n + 1):  # one rect per run of equal verdicts: 100 jobs stay small
        if i == n or points[i].verdict != points[start].verdict:
            cells.append(
                f'<rect x="{start * dx:.1f}" y="{height - strip}" '
                f'width="{(i - start) * dx:.1f}" height="{strip}" '
                f'fill="{VERDICT_COLOURS[points[start].verdict]}"/>'
            )
            start = i
    return (
        f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">'
        f'<polyline points="{coords}" fill="none" stroke="#555" stroke-width="1.2"/>'
        f"{''.join(cells)}</svg>"
    )


ROLES = ("colocated", "rollout", "trainer")  # GPU roles, drawn in this order


def gpu_time(
    counters: Mapping[tuple[str, str], tuple[float, float]], width: int = 900, row: int = 22
) -> str:
    """GPU time by step window and role as a picture: one bar per GPU role, its length the
    role's GPU-seconds (the largest role's fills the width), one segment per window group
    in the dashboards' colours, solid for its busy GPU-seconds, pale for its idle ones."""
    totals: dict[str, float] = {}
    for (_group, role), (_busy, total) in counters.items():
        if total > 0:
            totals[role] = totals.get(role, 0.0) + total
    if not totals:
        return '<p class="empty">No GPU-seconds joined yet.</p>'
    roles = [r for r in ROLES if r in totals] + sorted(set(totals) - set(ROLES))
    left, right = 80, 150
    plot_w = width - left - right
    scale = plot_w / max(totals.values())
    height = row * len(roles) + 4
    out = [
        f'<svg class="gpu-time" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="GPU time by step window and role">'
    ]
    order = [*GROUPS, *sorted({g for g, _ in counters} - set(GROUPS))]
    for i, role in enumerate(roles):
        y, x = 2 + i * row, float(left)
        busy_all = 0.0
        out.append(f'<text x="4" y="{y + row - 8}" class="axis">{escape(role)}</text>')
        for group in order:
            busy, total = counters.get((group, role), (0.0, 0.0))
            if total <= 0:
                continue
            busy_all += busy
            fill = VERDICT_COLOURS.get(group, "#8E8E8E")
            title = (
                f"{role} GPUs in {group} windows: {total:,.0f} GPU-seconds, "
                f"busy {busy / total:.0%}, idle {total - busy:,.0f}"
            )
            for part, seconds, opacity in (("busy", busy, 1.0), ("idle", total - busy, 0.3)):
                w = seconds * scale
                if w <= 0:
                    continue
                out.append(
                    f'<rect class="gpu-seg" data-role="{escape(role)}" data-group="'
                    f'{escape(group)}" data-part="{part}" x="{_f(x)}" y="{y}" width="{_f(w)}" '
                    f'height="{row - 6}" fill="{fill}" fill-opacity="{opacity}">'
                    f"<title>{escape(title)}</title></rect>"
                )
                x += w
        total = totals[role]
        out.append(
            f'<text x="{_f(x + 6)}" y="{y + row - 8}" class="axis">{total:,.0f} GPU-s, '
            f"busy {busy_all / total:.0%}</text>"
        )
    out.append("</svg>")
    return "".join(out)
