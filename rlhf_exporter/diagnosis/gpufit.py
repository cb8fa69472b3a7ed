"""A step's timeline fitted to its GPUs' busy time: where the untimed remainder ran, and how
long each fully-async sub-step's windows really lasted.

`busy(t)` is the GPU-seconds busy from a fixed origin up to `t`, summed over the job's GPUs
of each role (a tuple, one signal per role; or one number, the sum over every GPU); it is
non-decreasing and flat where nothing was sampled.

`place_untimed`: the windows keep their order and durations and the step its edges; only
the n+1 gaps g_0..g_n (before each window, after the last; each >= 0, summing to R) move.
The model: each role's summed utilization u(t) is zero in the gaps (R is driver-side CPU
work) and some level of its own in each window (per role: summed over every GPU, a training
window and the generation beside it look alike). Its least-squares fit, sum over roles and
windows of the integral of (u - window mean)^2 plus over gaps of u^2, equals a constant
minus sum_k |B_k|^2 / d_k (B_k: window k's busy GPU-seconds per role, d_k its duration), and
B_k depends only on C_k = g_0 + .. + g_k, the untimed seconds before window k. So: maximise
sum_k B_k(C_k)^2 / d_k less a prior that the gaps are alike, EVEN x level^2 x
sum_k (g_k - R/(n+1))^2 / (R/(n+1)) (level: the busiest window's mean utilization, |.| over
roles; the prior keeps a CPU-only window from swallowing a gap for a sample's worth of its
neighbour's busy time), over 0 <= C_0 <= .. <= C_{n-1} <= R: a dynamic programme over C
quantised to R / `quanta`, (n+1) x (quanta+1) evaluations of `busy` and n x quanta^2 / 2
steps.

Why squares, not the busy time in the gaps alone: that one cannot tell which window holds a
busy stretch, so a CPU-only neighbour may take a busy window's edge at no cost and the busy
window slides off its edges; the squares prefer each window holding its own.

Without a signal (no samples, idle GPUs, a constant rate) every placement fits equally, and
the even spread is kept: a placement must gain `GAIN` over it. The assumption: the untimed
work leaves the GPUs idle. Where it does not, `other`'s busy share comes out a lower bound
and its neighbours' an upper bound.

`fit_durations`: a fully-async record logs each timer's sum over its N sub-steps;
`timeline.substeps` gives every sub-step the mean, so a sub-step whose window ran longer
spills the rest of its busy stretch into the gap beside it (`other`) or its neighbour. The
same least-squares model, with one level per timer over the sub-steps (a timer does the same
work each sub-step) and each window's duration free within `SPREAD` of the mean, by
coordinate ascent over the edges (`_EdgeFit`).

Pure: no I/O, bounded work (the constants below).
"""

from __future__ import annotations

from collections.abc import Callable

from .timeline import UNTIMED, Interval, Timeline

QUANTA = 64  # R is placed in steps of R / QUANTA


Busy = Callable[[float], "float | tuple[float, ...]"]


def _vector(busy: Busy) -> Callable[[float], tuple[float, ...]]:
    """`busy` as a function to a tuple: one busy-time signal per GPU role, or the one sum."""

    def vec(t: float) -> tuple[float, ...]:
        x = busy(t)
        return x if isinstance(x, tuple) else (float(x),)

    return vec


def _sq(b: tuple[float, ...], a: tuple[float, ...]) -> float:
    """|b - a|^2."""
    return sum((y - x) ** 2 for x, y in zip(a, b, strict=True))


EVEN = 0.2  # weight of the prior that the gaps are alike (measured flat from 0.05 to 0.5)
TIE = 1e-7  # the prior's floor, for a step without a GPU signal (ties go to the even spread)
GAIN = 1e-6  # GPU^2 x seconds a placement must gain over the even spread to replace it


def place_untimed(tl: Timeline, busy: Busy, quanta: int = QUANTA) -> Timeline:
    """The step with its untimed remainder R moved to where the GPUs were idle (the model:
    the module's docstring); `tl` itself (the even spread) where no placement gains."""
    windows: list[Interval] = []
    r = 0.0
    for iv in tl.intervals:
        if iv.end < iv.start:
            return tl
        if iv.timer == UNTIMED:
            r += iv.end - iv.start
        else:
            windows.append(iv)
    n = len(windows)
    if r <= 0.0 or n == 0 or quanta < 1:
        return tl
    s, q = tl.start, r / quanta
    timed = [0.0]  # D_k: timed seconds before window k
    for iv in windows:
        timed.append(timed[-1] + (iv.end - iv.start))
    # window k placed at C_k = j q covers [s + D_k + j q, s + D_{k+1} + j q]
    vec = _vector(busy)
    at = [[vec(s + d + j * q) for j in range(quanta + 1)] for d in timed]
    dur = [max(timed[k + 1] - timed[k], 1e-9) for k in range(n)]
    # fit[k][j]: window k's |B_k|^2 / d_k at C_k = j quanta
    fit = [[_sq(at[k + 1][j], at[k][j]) / dur[k] for j in range(quanta + 1)] for k in range(n)]
    level2 = max(_sq(vec(iv.end), vec(iv.start)) / dur[k] ** 2 for k, iv in enumerate(windows))
    even_gap = r / (n + 1)
    weight = EVEN * level2 / even_gap + TIE / (r * r)
    tie = [weight * (m * q) ** 2 for m in range(quanta + 1)]  # a gap of m quanta
    cs = _best_offsets(fit, tie, quanta)
    placed = sum(fit[k][c] for k, c in enumerate(cs))
    even = 0.0
    for k, iv in enumerate(windows):
        even += _sq(vec(iv.end), vec(iv.start)) / dur[k]
    if placed - even < GAIN:
        return tl
    intervals: list[Interval] = []
    t = s
    for k, iv in enumerate(windows):
        a, b = s + timed[k] + cs[k] * q, min(s + timed[k + 1] + cs[k] * q, tl.end)
        if a > t:
            intervals.append(Interval(UNTIMED, "other", t, a))
        intervals.append(iv._replace(start=a, end=b))
        t = b
    if tl.end > t:
        intervals.append(Interval(UNTIMED, "other", t, tl.end))
    return tl._replace(intervals=tuple(intervals))


def _best_offsets(fit: list[list[float]], tie: list[float], quanta: int) -> list[int]:
    """The dynamic programme: C_k (in quanta, non-decreasing, at most `quanta`) for each
    window k, maximising sum_k fit[k][C_k] less tie[gap] for every gap (the last one too)."""
    n = len(fit)
    # best[j]: the best fit (less the prior) of windows 0..k with C_k = j quanta
    best = [fit[0][j] - tie[j] for j in range(quanta + 1)]
    back: list[list[int]] = []
    for k in range(1, n):
        here = fit[k]
        row, arg = [], []
        for j in range(quanta + 1):
            top, i = best[j], j  # the gap before window k: j - i quanta
            for m in range(1, j + 1):
                value = best[j - m] - tie[m]
                if value > top:
                    top, i = value, j - m
            row.append(top + here[j])
            arg.append(i)
        best = row
        back.append(arg)
    j = max(range(quanta + 1), key=lambda j: best[j] - tie[quanta - j])
    cs = [0] * n
    for k in range(n - 1, -1, -1):
        cs[k] = j
        if k:
            j = back[k - 1][j]
    return cs


SPREAD = 0.25  # a sub-step's window may be this much longer or shorter than the record's mean
PUSH = 4  # windows moved at most to make room for one edge
FIT_STEPS = 12  # candidate positions tried per window edge and pass
FIT_PASSES = 3

Move = tuple[int, float, float]
"""Window k placed at [start, end]."""


def fit_durations(windows: list[Interval], tl: Timeline, busy: Busy) -> list[Interval]:
    """Sub-steps' windows (in order, inside `tl`) with their edges fitted to the GPU signal:
    maximise sum over timers of |sum of its windows' B|^2 / their seconds, less a prior that
    each window lasts its mean (weighted as `place_untimed`'s evenness prior), by coordinate
    ascent over the edges (`FIT_PASSES` passes, each finer around the last, `FIT_STEPS`
    candidates per edge; a neighbour in the way is moved whole or shortened; the windows
    keep their order and never overlap). B is measured above the quietest level (window or
    untimed time) per role, so a CPU-only window at the idle level gains nothing by growing:
    with no signal an edge stays where it was (a move must gain `GAIN`)."""
    if len(windows) < 1:
        return windows
    fit = _EdgeFit(windows, tl, busy)
    for p in range(FIT_PASSES):
        # each pass searches around where the last one left the edge, finer
        zoom = (2.0 / FIT_STEPS) ** p
        for k in range(fit.n):
            width = 2.0 * SPREAD * fit.nominal[k] * zoom
            fit.move_edge(k, -1, width)  # its start, pushing the windows before it back
            fit.move_edge(k, +1, width)  # then its end, pushing the windows after it on
    return fit.out


def _quiet_levels(
    vec: Callable[[float], tuple[float, ...]], windows: list[Interval], tl: Timeline
) -> tuple[list[list[float]], list[float]]:
    """Each window's mean busy level per role, and per role the quiet level: the quietest
    window's, or the untimed time's where that is lower (every window may be busy on some
    role)."""
    spans = [(vec(iv.start), vec(iv.end), iv.end - iv.start) for iv in windows]
    levels = [[(y - x) / d for x, y in zip(a, b, strict=True)] for a, b, d in spans if d > 0.0]
    gaps = [(vec(iv.start), vec(iv.end), iv.end - iv.start) for iv in tl.intervals]
    gaps = [g for g, iv in zip(gaps, tl.intervals, strict=True) if iv.timer == UNTIMED]
    quiet = sum(d for _a, _b, d in gaps)
    if quiet > 0.0 and levels:
        levels = [
            *levels,
            [sum(b[i] - a[i] for a, b, _d in gaps) / quiet for i in range(len(levels[0]))],
        ]
    return levels, [min(col) for col in zip(*levels, strict=True)] if levels else []


class _EdgeFit:
    """The state of `fit_durations`' coordinate ascent: the windows as placed so far, each
    one's busy GPU-seconds above the quiet level, and their sums per timer (one level per
    timer over the sub-steps: a short CPU-only window sitting on a neighbour's busy stretch
    explains it worse than the neighbour does; with a level per window, both fit it
    equally). An edge moves on side -1 (a window's start; its neighbours are the windows
    before it) or +1 (its end; the windows after it): one search, mirrored."""

    def __init__(self, windows: list[Interval], tl: Timeline, busy: Busy):
        self.tl = tl
        self.vec = _vector(busy)
        levels, self.base = _quiet_levels(self.vec, windows, tl)
        self.nominal = [iv.end - iv.start for iv in windows]
        # the prior that a window lasts its mean: weighted as place_untimed's evenness prior,
        # by the busiest window's level, so a window moves only for its own busy stretch,
        # never for a sample's worth of noise at an idle level
        level2 = max((sum(x * x for x in row) for row in levels), default=0.0)
        self.stiff = [EVEN * level2 / max(d, 1e-9) for d in self.nominal]
        self.out = list(windows)
        self.n = len(windows)
        self.shortest = [d * (1 - SPREAD) for d in self.nominal]
        self.longest = [d * (1 + SPREAD) for d in self.nominal]
        self.timer_of = [iv.timer for iv in windows]
        self.parts = [self.part(iv.start, iv.end) for iv in windows]
        self.sums: dict[str, tuple[list[float], float]] = {}
        for t, (pb, pd) in zip(self.timer_of, self.parts, strict=True):
            sb, sd = self.sums.get(t, ([0.0] * len(pb), 0.0))
            self.sums[t] = ([x + y for x, y in zip(sb, pb, strict=True)], sd + pd)

    def part(self, a: float, b: float) -> tuple[list[float], float]:
        """A window's busy GPU-seconds above the quiet level, per role, and its seconds."""
        d = b - a
        xa, xb = self.vec(a), self.vec(b)
        return [y - x - c * d for x, y, c in zip(xa, xb, self.base, strict=False)], d

    def move_edge(self, k: int, side: int, width: float) -> None:
        """Window k's start (side -1) or end (+1) moved to the best of FIT_STEPS + 1
        candidates within `width` of it (and within the window's spread and the step), the
        neighbour on that side pushed whole or shortened; kept where no move gains GAIN."""
        a, b = self.out[k].start, self.out[k].end
        tl = self.tl
        if side < 0:  # the end stays: the start between the longest and shortest window
            first = max(tl.start, b - self.longest[k], a - width)
            last = min(b - self.shortest[k], a + width)
        else:
            first = max(a + self.shortest[k], b - width)
            last = min(tl.end, a + self.longest[k], b + width)
        best: list[Move] | None = None
        top = GAIN
        beside = k + side
        for i in range(FIT_STEPS + 1):
            x = first + (last - first) * i / FIT_STEPS
            pushed = self.push(beside, x, side) if 0 <= beside < self.n else []
            for room in (pushed, self.shorten(beside, x, side)):
                if room is None:
                    continue
                moves = [(k, x, b) if side < 0 else (k, a, x), *room]
                g = self.regroup(moves)[0]
                if g > top:
                    top, best = g, moves
        if best is not None:
            self.apply(best)

    def push(self, k: int, x: float, side: int) -> list[Move] | None:
        """Windows k, k+side, .. moved whole so that window k ends by `x` (side -1) or
        starts at `x` or later (+1); the last one shortened at the step's edge where that
        stops it (None: below its spread, or more than PUSH windows in the way)."""
        out, tl = self.out, self.tl
        moves: list[Move] = []
        while 0 <= k < self.n and (out[k].end > x if side < 0 else out[k].start < x):
            if len(moves) >= PUSH:
                return None
            iv = out[k]
            far = x - (iv.end - iv.start) if side < 0 else x + (iv.end - iv.start)
            edge, outermost = (tl.start, 0) if side < 0 else (tl.end, self.n - 1)
            if k == outermost and (far < edge if side < 0 else far > edge):
                if (x - edge if side < 0 else edge - x) < self.shortest[k] - 1e-9:
                    return None
                far = edge
            moves.append((k, far, x) if side < 0 else (k, x, far))
            x, k = far, k + side
        return moves

    def shorten(self, k: int, x: float, side: int) -> list[Move] | None:
        """Window k (beside the one moving, on `side`) shortened to end by `x` (-1) or to
        start at `x` (+1) (None: nothing to do, or below its spread): the alternative to
        pushing it and those beyond it."""
        if not 0 <= k < self.n:
            return None
        iv = self.out[k]
        if side < 0:
            if iv.end <= x or x - iv.start < self.shortest[k] - 1e-9:
                return None
            return [(k, iv.start, x)]
        if iv.start >= x or iv.end - x < self.shortest[k] - 1e-9:
            return None
        return [(k, x, iv.end)]

    def penalty(self, k: int, d: float) -> float:
        return self.stiff[k] * (d - self.nominal[k]) ** 2

    def regroup(
        self, moves: list[Move]
    ) -> tuple[float, dict[str, tuple[list[float], float]], list[tuple[list[float], float]]]:
        """What `moves` gain, the timers' new sums and the moved windows' new parts."""
        changed: dict[str, tuple[list[float], float]] = {}
        new_parts = []
        g = 0.0
        for j, a, b in moves:
            t = self.timer_of[j]
            sb, sd = changed.get(t, self.sums[t])
            (pb, pd), (nb, nd) = self.parts[j], self.part(a, b)
            changed[t] = ([s - x + y for s, x, y in zip(sb, pb, nb, strict=True)], sd - pd + nd)
            new_parts.append((nb, nd))
            g += self.penalty(j, pd) - self.penalty(j, nd)
        for t, (sb, sd) in changed.items():
            g += _term(sb, sd) - _term(*self.sums[t])
        return g, changed, new_parts

    def apply(self, moves: list[Move]) -> None:
        _g, changed, new_parts = self.regroup(moves)
        self.sums.update(changed)
        for (j, a, b), np_ in zip(moves, new_parts, strict=True):
            self.out[j] = self.out[j]._replace(start=a, end=b)
            self.parts[j] = np_


def _term(sb: list[float], sd: float) -> float:
    return sum(x * x for x in sb) / sd if sd > 1e-9 else 0.0
