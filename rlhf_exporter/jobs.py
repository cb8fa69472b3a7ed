"""One verl job, as the sidecar keeps it: records in, catalog series out.

A `Job` feeds every record to a `StreamDiagnoser` and keeps what the "verl steps" section of
the catalog needs. Its counters only ever grow: a restart (the step number going down), a
truncated or replaced file (`new_run()`) or a resume start a new run and a new baseline, and
the counters carry on. `samples()` is cached until the next record, so a scrape with
nothing new costs nothing.

Hostile or broken input is stopped here, before anything becomes a `Sample` (see `Limits`):
- a label value that is not valid UTF-8 (a lone surrogate from an undecodable file name or
  a `\\udc80` escape) or holds a control character has those code points replaced by
  U+FFFD (`label_not_utf8`, `label_control_char`);
- a number that is not a finite float (NaN, +-Inf, an integer too big for a double) is
  dropped from the record (`bad_number`); a step outside +-2**53 rejects the record
  (`bad_step`);
- per job, at most `Limits.unknown_timers` timers outside the thresholds' timer map are
  kept (and exported as `phase`); later ones are dropped (`too_many_timers`);
- `perf/mfu/<stage>` is kept for the known stages only (`unknown_mfu_stage`);
- a key longer than `Limits.key_chars` is dropped (`key_too_long`), and one step's merged
  data holds at most `Limits.step_keys` keys (`too_many_keys`), so it is bounded in keys
  and bytes however often the same step is sent again;
- a record that still makes ingestion fail is dropped and counted (`internal_error`); it
  never stops the records after it, nor any other job.
Each drop is counted in the `rejected` counter the source passes in (exported as
`rlhf_exporter_record_errors_total{reason}`) and logged once per job and reason.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from .diagnosis import (
    CHANGES,
    COST_GROUPS,
    GROUPS,
    REASONS,
    VERDICTS,
    Record,
    StepDiagnosis,
    StreamDiagnoser,
    Thresholds,
    history,
)
from .diagnosis.advice import EVIDENCE_KEYS, missing_evidence, shown_evidence
from .diagnosis.engines import EngineEvidence, EngineLimits, refine, rollout_spans
from .diagnosis.episodes import Episode, episodes
from .diagnosis.timeline import Placer, Timeline
from .diagnosis.values import AGENT_LOOP, TIMER_PREFIX, num
from .diagnosis.windows import timer_name
from .lifecycle import STATES, UNKNOWN, RayFact, job_state
from .metrics.catalog import BY_NAME
from .metrics.snapshot import Sample

GIB = float(1 << 30)  # verl's *_memory_*_gb are torch bytes / 2**30

RESPONSE_STATS = ("mean", "max", "min")
AGENT_PARTS = ("generate_sequences", "tool_calls", "compute_score")
AGENT_STATS = ("min", "max", "mean")
MEMORY_KEYS = {  # metric -> verl keys, newest spelling first (before 0.8: no actor/ prefix)
    "rlhf_memory_max_allocated_bytes": (
        "actor/perf/max_memory_allocated_gb",
        "perf/max_memory_allocated_gb",
    ),
    "rlhf_memory_max_reserved_bytes": (
        "actor/perf/max_memory_reserved_gb",
        "perf/max_memory_reserved_gb",
    ),
}
NON_ABORTED_PREFIX = "response_length_non_aborted/"
ABORTED_KEY = "response/aborted_ratio"
PROCESSING_PREFIX = "fully_async/processing_time/"
PROCESSING_STATS = frozenset({"avg", "max", "min", "tp50", "tp95", "tp99"})
RESOURCE_KEYS = {  # verl key -> `side` label (fully-async dynamic resources, verl 0.9.1)
    "dynamic_resource/rollout_resource_utilization": "rollout",
    "dynamic_resource/train_resource_utilization": "train",
}
MFU_PREFIX = "perf/mfu/"
FULLY_ASYNC_PREFIX = "fully_async/"
IDLE_SUFFIX = "/idle_ratio"
MAX_LABEL_CHARS = 120  # a verl key used as a label value (phase, stage, component)
MFU_STAGES = frozenset({"actor", "actor_infer", "critic", "ref"})  # verl's perf/mfu/<stage>
MAX_COMPONENTS = 16  # fully_async/<component>/idle_ratio components per job
MAX_STEP = 1 << 53  # a step beyond this is not exactly a double
ACCEPTED_KEYS = 1024  # keys a job remembers as already checked (a bounded memo)
MAX_INT = 1 << 63  # an integer value beyond this is no verl number (and may overflow a float)
# keys the exporter reads: kept first when a step has more keys than Limits.step_keys
_USED_PREFIXES = (TIMER_PREFIX, "perf/", "response_length/", "actor/perf/", FULLY_ASYNC_PREFIX,
                  AGENT_LOOP, "response/", NON_ABORTED_PREFIX, "dynamic_resource/",
                  "training/global_step")  # fmt: skip

# timers that run between two steps' records, outside timing_s/step (verl-stream.md: testing
# always; save_checkpoint in 0.6.x and the separated trainers; counted in any version)
BETWEEN_STEPS = (TIMER_PREFIX + "testing", TIMER_PREFIX + "save_checkpoint")
FINISHED_KEY = "rlhf_job_finished"  # a record key a job may log at its end (value 1)

# record_errors reasons for what ingestion drops (the sources add their own)
LABEL_NOT_UTF8 = "label_not_utf8"
LABEL_CONTROL_CHAR = "label_control_char"
BAD_NUMBER = "bad_number"
BAD_STEP = "bad_step"
TOO_MANY_TIMERS = "too_many_timers"
UNKNOWN_MFU_STAGE = "unknown_mfu_stage"
TOO_MANY_COMPONENTS = "too_many_components"
KEY_TOO_LONG = "key_too_long"
TOO_MANY_KEYS = "too_many_keys"
INTERNAL_ERROR = "internal_error"

log = logging.getLogger(__name__)


class Limits(NamedTuple):
    """Per-job bounds on what a job keeps (settings max_unknown_timers, max_step_keys,
    max_key_chars)."""

    unknown_timers: int = 32  # distinct timers outside the thresholds' map, per job
    step_keys: int = 1024  # keys of one step's merged data
    key_chars: int = 256  # longest key kept


DEFAULT_LIMITS = Limits()


def limits_from_settings(settings: Any) -> Limits:
    """The per-job bounds from `serve`'s settings (shared by the verl and push sources)."""
    return Limits(
        unknown_timers=settings.max_unknown_timers,
        step_keys=settings.max_step_keys,
        key_chars=settings.max_key_chars,
    )


_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def clean_label(text: str) -> tuple[str, str | None]:
    """`text` fit to be a label value, and why it was not (None when it was).

    A lone surrogate (an undecodable byte that os.fsdecode escaped, or a JSON `\\udc80`)
    becomes U+FFFD (`label_not_utf8`), and so does a control character such as a newline
    in a directory name (`label_control_char`)."""
    if text.isprintable():  # the fast path: no surrogate, no control character
        return text, None
    reason = None
    if _SURROGATE.search(text):
        text, reason = _SURROGATE.sub("\ufffd", text), LABEL_NOT_UTF8
    if _CONTROL.search(text):
        text, reason = _CONTROL.sub("\ufffd", text), reason or LABEL_CONTROL_CHAR
    return text, reason


def known_timers(th: Thresholds) -> frozenset[str]:
    """Timer names the thresholds know (exported as `phase` without counting against the
    per-job cap on unknown timers)."""
    nested = set(th.nested_timers) | set(th.nested_timers.values())
    return frozenset(th.timer_groups) | th.ignored_timers | nested | {"step"}


def _agent_key(key: str) -> str | None:
    """`agent_loop/...` with verl's `timing_s/` prefix removed, or None."""
    if key.startswith(TIMER_PREFIX):
        key = key[len(TIMER_PREFIX) :]
    return key[len(AGENT_LOOP) :] if key.startswith(AGENT_LOOP) else None


def extra_values(data: Mapping[str, Any]) -> dict[tuple[str, tuple[str, ...]], float]:
    """The per-record gauges that are read straight from verl keys (not the decision table):
    throughput, MFU, response length (and without aborted samples, the aborted share), agent
    loop, memory, fully-async idle ratios, per-sample processing time and dynamic resource
    utilization. Label values come from fixed sets (stat, side), so each series is bounded.
    Keys map (metric name, extra label values) to the value."""
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    for key, raw in data.items():
        value = num(raw)
        if value is None:
            continue
        if key == "perf/throughput":
            out["rlhf_throughput_tokens_per_gpu_second", ()] = value
        elif key.startswith(MFU_PREFIX):
            stage = key[len(MFU_PREFIX) :]
            if stage and len(stage) <= MAX_LABEL_CHARS:
                out["rlhf_mfu_ratio", (stage,)] = value
        elif key.startswith("response_length/"):
            stat = key[len("response_length/") :]
            if stat in RESPONSE_STATS:
                out["rlhf_response_length_tokens", (stat,)] = value
        elif key.startswith(NON_ABORTED_PREFIX):
            stat = key[len(NON_ABORTED_PREFIX) :]
            if stat in RESPONSE_STATS:
                out["rlhf_response_length_non_aborted_tokens", (stat,)] = value
        elif key == ABORTED_KEY:
            if value <= 1.0:  # a share: anything else is no verl value
                out["rlhf_response_aborted_ratio", ()] = value
        elif key.startswith(PROCESSING_PREFIX):
            stat = key[len(PROCESSING_PREFIX) :]
            if stat in PROCESSING_STATS:
                out["rlhf_fully_async_processing_seconds", (stat,)] = value
        elif key in RESOURCE_KEYS:
            if value <= 1.0:
                out["rlhf_dynamic_resource_utilization_ratio", (RESOURCE_KEYS[key],)] = value
        elif key.startswith(FULLY_ASYNC_PREFIX) and key.endswith(IDLE_SUFFIX):
            component = key[len(FULLY_ASYNC_PREFIX) : -len(IDLE_SUFFIX)]
            if component and len(component) <= MAX_LABEL_CHARS:
                out["rlhf_fully_async_idle_ratio", (component,)] = value
        else:
            agent = _agent_key(key)
            if agent is None:
                continue
            part, _, stat = agent.partition("/")
            if part == "slowest":
                if stat in AGENT_PARTS:
                    out["rlhf_agent_loop_slowest_seconds", (stat,)] = value
                elif stat == "response_length":
                    out["rlhf_agent_loop_slowest_response_length_tokens", ()] = value
            elif part in AGENT_PARTS and stat in AGENT_STATS:
                out["rlhf_agent_loop_seconds", (part, stat)] = value
            elif part == "num_preempted" and stat == "max":
                out["rlhf_agent_loop_preempted_max", ()] = value
    for metric, keys in MEMORY_KEYS.items():
        for key in keys:
            value = num(data.get(key))
            if value is not None:
                out[metric, ()] = value * GIB
                break
    return out


class Job:
    """The state of one verl job (`project`, `experiment`) across all its runs."""

    def __init__(
        self,
        project: str,
        experiment: str,
        th: Thresholds,
        limits: Limits = DEFAULT_LIMITS,
        rejected: Counter[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        total_steps: int | None = None,
        windows: Any = None,
    ):
        # what ingestion drops is counted here (a source passes its record_errors counter)
        self.rejected: Counter[str] = Counter() if rejected is None else rejected
        self._logged: set[str] = set()
        project, bad_p = clean_label(project)
        experiment, bad_e = clean_label(experiment)
        bad = bad_p or bad_e
        if bad:
            self._drop(bad)
        self.project = project
        self.experiment = experiment
        self.labels = (project, experiment)
        self._th = th
        self.limits = limits
        self._known_timers = known_timers(th)
        self._unknown_timers: set[str] = set()
        self._components: set[str] = set()
        self._step_keys: set[str] = set()  # keys kept so far for the current step
        self._accepted: set[str] = set()  # keys taken unchanged before (a memo, bounded)
        self._diagnoser = StreamDiagnoser(th)
        self._run_base = 0  # runs before the current diagnoser (explicit new_run calls)
        self._clock = clock
        self.total_steps = total_steps
        self._windows = windows  # a WindowBoard: each classified step's timeline goes there
        self._placer = Placer(th)  # places steps in time (fully-async: shifted sub-steps)
        self._arrival = 0.0  # when the record being fed was read
        self.between_steps_max = 0.0  # this run's longest testing + save_checkpoint
        self.finished_marker = False  # this run logged rlhf_job_finished
        self.finished_file = False  # a `<experiment>.finished` file lies beside its log
        self.ray: RayFact | None = None  # what Ray's Jobs API and death causes say (set_ray)
        self._state = (UNKNOWN, "none")
        self.state_since: float = clock()  # when the job entered its current state
        self._evidence_seen: set[str] = set()  # EVIDENCE_KEYS the log has shown
        self.records = 0
        self.step: int | None = None
        self.last_step_time: float | None = None
        self.last: StepDiagnosis | None = None
        self.steps = 0
        self.step_seconds = 0.0
        self.untimed_seconds = 0.0
        self.tokens = 0.0
        self.group_seconds = dict.fromkeys(GROUPS, 0.0)
        self.verdict_steps = dict.fromkeys(VERDICTS, 0)
        self.reason_steps = {(v, r): 0 for v in VERDICTS for r in REASONS[v]}
        self.change_steps = dict.fromkeys(CHANGES, 0)
        self.regression_steps = dict.fromkeys(COST_GROUPS, 0)
        self._extra: dict[tuple[str, tuple[str, ...]], float] = {}
        self._samples: tuple[Sample, ...] | None = None
        self._history: tuple[history.StepPoint, ...] = ()  # the last steps, for the job view
        # the change episodes of `_history`, computed when first shown after a step
        self._episodes: tuple[tuple[history.StepPoint, ...], tuple[Episode, ...]] = ((), ())
        # engine evidence (diagnosis/engines.py): the last measured rollout window's
        self.engine: EngineEvidence | None = None
        self.engine_step: int | None = None
        self._engine_windows = {"true": 0, "false": 0}
        self._engine_preemptions = 0.0

    @property
    def run(self) -> int:
        return self._run_base + max(self._diagnoser.run, 0)

    @property
    def declared_finished(self) -> bool:
        """The job reached the end verl shows (its step reached its total steps), logged the
        rlhf_job_finished marker in this run, or has a `.finished` file beside its log."""
        reached = (
            self.total_steps is not None and self.step is not None and self.step >= self.total_steps
        )
        return reached or self.finished_marker or self.finished_file

    @property
    def state(self) -> str:
        """running, finished, failed or unknown (see rlhf_exporter.lifecycle)."""
        return self._refresh_state()[0]

    @property
    def state_signal(self) -> str:
        """Which signal the state came from (ray_job, actor_death, declared, steps, none)."""
        return self._refresh_state()[1]

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def _refresh_state(self) -> tuple[str, str]:
        state = job_state(
            stepped=self.step is not None, declared_finished=self.declared_finished, ray=self.ray
        )
        if state[0] != self._state[0]:
            self.state_since = self._clock()
            self._samples = None
        self._state = state
        return state

    def set_ray(self, fact: RayFact | None) -> None:
        """What Ray says about this job now (None: nothing ties a submission to it)."""
        if fact != self.ray:
            self.ray = fact
            self._samples = None
            self._refresh_state()

    def set_finished_file(self, present: bool) -> None:
        if present != self.finished_file:
            self.finished_file = present
            self._samples = None
            self._refresh_state()

    def set_total_steps(self, total: int | None) -> None:
        if total != self.total_steps:
            self.total_steps = total
            self._samples = None
            self._refresh_state()

    @property
    def verdict(self) -> str | None:
        return self.last.verdict if self.last else None

    def new_run(self) -> None:
        """The input started over (a truncated or replaced file): whatever step comes next
        opens a new run with a fresh baseline. Counters carry on."""
        if self._diagnoser.run >= 0:
            self._run_base += self._diagnoser.run + 1
            self._diagnoser = StreamDiagnoser(self._th)
            self._run_reset()
            self._samples = None

    def _run_reset(self) -> None:
        self._placer.reset()
        self._extra.clear()
        self.between_steps_max = 0.0
        self.finished_marker = False

    def feed(self, records: Iterable[Record], now: float | None = None) -> int:
        """Ingest records in order; returns how many."""
        n = 0
        self._arrival = self._clock() if now is None else now
        # GPU windows: only a step from the batch's last record has a known arrival time (the
        # file's mtime, or the push); earlier records of a backlog were written before it
        post: StepDiagnosis | None = None
        # the last trainer record (classified, or fully-async's empty one) not yet known to
        # be followed by another record of the batch: the placer's anchor (timeline.Placer)
        anchor: Record | None = None
        # with engine evidence the batch's last diagnosis waits for its timeline (its reason
        # may come from the engines); without, every step is classified as it comes
        engines = getattr(self._windows, "engines", None)
        pending: StepDiagnosis | None = None
        for record in records:
            try:
                clean = self._clean(record)
                if clean is None:
                    continue
                event = self._diagnoser.feed(clean)
                if anchor is not None:  # followed by this record: its arrival is unknown
                    self._placer.unplaced(anchor.data)
                    anchor = None
                if event.new_run:
                    self._run_reset()
                if event.diagnosis is not None or not clean.data:
                    anchor = clean
                if event.new_step:
                    self.steps += 1
                    self.last_step_time = self._clock() if now is None else now
                self.step = clean.step
                self._extra.update(extra_values(clean.data))
                self._between_steps(clean.data)
                self._remember_evidence(clean.data)
                post = event.diagnosis
                if event.diagnosis is not None:
                    if engines is None:
                        self._classified(event.diagnosis)
                    else:
                        if pending is not None:
                            self._classified(pending)
                        pending = event.diagnosis
                n += 1
            except Exception:  # a bug or an input no check foresaw: drop this record only
                self._drop(INTERNAL_ERROR, exc_info=True)
                self._samples = None
        if n:
            self.records += n
            self._samples = None
        if anchor is not None and self._windows is not None:
            if post is None:  # fully-async's empty trainer record (verl 0.8.0)
                self._placer.empty(self._arrival, anchor.step)
            else:
                timelines = self._placer.place(
                    post.step, post.windows, post.timers, anchor.data, self._arrival
                )
                if pending is not None and pending is post and timelines:
                    pending = self._with_engines(pending, timelines, engines)
                for timeline in timelines:
                    self._windows.post(self.labels, timeline)
        if pending is not None:
            try:
                self._classified(pending)
            except Exception:
                self._drop(INTERNAL_ERROR, exc_info=True)
            self._samples = None
        return n

    def _with_engines(
        self, d: StepDiagnosis, timelines: Sequence[Timeline], engines: Any
    ) -> StepDiagnosis:
        """The step's reason and evidence with the engines' evidence over its rollout window
        (a `rollout` verdict's reason comes from the engines when usable and one holds); a
        fully-async record places several sub-steps: their rollout spans together."""
        try:
            spans = rollout_spans([iv for tl in timelines for iv in tl.intervals])
            ev = engines.evidence(spans) if spans else None
        except Exception:  # the engine side must never cost a step its diagnosis
            self._drop(INTERNAL_ERROR, exc_info=True)
            return d
        if ev is None:
            return d
        self.engine, self.engine_step = ev, d.step
        self._engine_windows["true" if ev.usable else "false"] += 1
        if ev.usable:
            self._engine_preemptions += ev.preemptions
        limits = getattr(engines, "limits", None) or EngineLimits()
        reason, evidence = refine(
            d.verdict, d.reason, d.evidence, ev if ev.usable else None, limits
        )
        if not ev.usable:
            evidence.update(ev.numbers())
        return d._replace(reason=reason, evidence=evidence)

    def _remember_evidence(self, data: Mapping[str, Any]) -> None:
        """Which of the keys the reasons need this job's log has reported (either spelling of
        agent-loop keys; verl's "not reported" values such as a -1 preemption count are not
        evidence): what it has never reported, its verdicts cannot say."""
        if len(self._evidence_seen) < len(EVIDENCE_KEYS):
            self._evidence_seen |= shown_evidence(data)

    def _between_steps(self, data: Mapping[str, Any]) -> None:
        outside = 0.0
        for key in BETWEEN_STEPS:
            value = num(data.get(key))
            if value is not None and value > 0:
                outside += value
        if outside > self.between_steps_max:
            self.between_steps_max = outside
        if num(data.get(FINISHED_KEY)):
            self.finished_marker = True

    def _drop(self, reason: str, n: int = 1, exc_info: bool = False) -> None:
        self.rejected[reason] += n
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "job %s/%s: dropped input (%s); counted in rlhf_exporter_record_errors_total, "
                "logged once per job and reason",
                getattr(self, "project", "?"),
                getattr(self, "experiment", "?"),
                reason,
                exc_info=exc_info,
                extra={"reason": reason},
            )

    def _clean(self, record: Record) -> Record | None:
        """The record with every key and value this job may keep, or None to reject it."""
        step = record.step
        if type(step) is not int or not -MAX_STEP <= step <= MAX_STEP:
            self._drop(BAD_STEP)
            return None
        lim = self.limits
        out: dict[str, Any] = {}
        changed = False
        accepted = self._accepted
        for key, value in record.data.items():
            t = type(value)
            if t is float:
                if value - value != 0.0:  # NaN or +-Inf (math.isfinite, without a call)
                    self._drop(BAD_NUMBER)
                    changed = True
                    continue
            elif t is int and not -MAX_INT <= value <= MAX_INT:
                self._drop(BAD_NUMBER)
                changed = True
                continue
            if key in accepted:  # a key this job already took as it is: the common case
                out[key] = value
                continue
            if type(key) is not str or len(key) > lim.key_chars:
                self._drop(KEY_TOO_LONG)
                changed = True
                continue
            if not key.isprintable():  # a key may become a label value (phase, component)
                key, bad = clean_label(key)
                if bad:
                    self._drop(bad)
                    changed = True
            if key.startswith(TIMER_PREFIX):
                name = timer_name(key)
                if (
                    name is not None
                    and name not in self._known_timers
                    and name not in self._unknown_timers
                ):
                    if len(self._unknown_timers) >= lim.unknown_timers:
                        self._drop(TOO_MANY_TIMERS)
                        changed = True
                        continue
                    self._unknown_timers.add(name)
            elif key.startswith(MFU_PREFIX):
                if key[len(MFU_PREFIX) :] not in MFU_STAGES:
                    self._drop(UNKNOWN_MFU_STAGE)
                    changed = True
                    continue
            elif key.startswith(FULLY_ASYNC_PREFIX) and key.endswith(IDLE_SUFFIX):
                component = key[len(FULLY_ASYNC_PREFIX) : -len(IDLE_SUFFIX)]
                if component not in self._components:
                    if len(self._components) >= MAX_COMPONENTS:
                        self._drop(TOO_MANY_COMPONENTS)
                        changed = True
                        continue
                    self._components.add(component)
            if not changed and len(accepted) < ACCEPTED_KEYS:
                accepted.add(key)  # (a cleaned key is checked again each time: rare)
            out[key] = value
        # one step's merged data: at most step_keys keys, whatever is sent again
        seen = self._step_keys
        if step != self._diagnoser.step or self._diagnoser.run < 0:
            if len(out) <= lim.step_keys:  # a new step that fits: the common case
                seen.clear()
                seen.update(out)
                return Record(step, out) if changed else record
            seen.clear()
        new = [k for k in out if k not in seen]
        room = lim.step_keys - len(seen)
        if len(new) > room:
            new.sort(key=lambda k: not k.startswith(_USED_PREFIXES))  # stable: used keys first
            for key in new[max(room, 0) :]:
                del out[key]
            self._drop(TOO_MANY_KEYS, len(new) - max(room, 0))
            new = new[: max(room, 0)]
            changed = True
        seen.update(new)
        return Record(step, out) if changed else record

    def _classified(self, d: StepDiagnosis) -> None:
        self.last = d
        self.step_seconds += d.windows.step_seconds
        self.untimed_seconds += d.windows.untimed_seconds
        for group, seconds in d.windows.group_seconds.items():
            self.group_seconds[group] += seconds
        self.verdict_steps[d.verdict] += 1
        if d.reason is not None:
            self.reason_steps[d.verdict, d.reason] = (
                self.reason_steps.get((d.verdict, d.reason), 0) + 1
            )
        self.change_steps[d.change.change] += 1
        if d.change.regressed is not None:
            self.regression_steps[d.change.regressed] += 1
        if d.tokens is not None:
            self.tokens += d.tokens
        tpgs = self._extra.get(("rlhf_throughput_tokens_per_gpu_second", ()))
        response = self._extra.get(("rlhf_response_length_tokens", ("mean",)))
        longest = self._extra.get(("rlhf_response_length_tokens", ("max",)))
        # replaced whole, never changed in place: a page being drawn keeps a consistent tuple
        self._history = (*self._history, history.point(d, tpgs, response, longest))[
            -history.HISTORY_STEPS :
        ]

    # -- scrape side ----------------------------------------------------------------------
    def samples(self) -> tuple[Sample, ...]:
        """Every series of the job, label values in catalog order; cached until new input."""
        if self._samples is None:
            self._samples = tuple(self._build())
        return self._samples

    def _build(self) -> Iterable[Sample]:
        j = self.labels
        if self.step is not None:
            yield Sample("rlhf_step", j, float(self.step))
        yield Sample("rlhf_run", j, float(self.run))
        yield Sample("rlhf_steps_total", j, float(self.steps))
        if self.last_step_time is not None:
            yield Sample("rlhf_last_step_timestamp_seconds", j, self.last_step_time)
            yield Sample("rlhf_between_steps_max_seconds", j, self.between_steps_max)
        state = self.state
        yield Sample("rlhf_job_finished", j, 1.0 if state == "finished" else 0.0)
        for name in STATES:
            yield Sample("rlhf_job_state", j + (name,), 1.0 if name == state else 0.0)
        yield Sample("rlhf_job_state_timestamp_seconds", j, self.state_since)
        yield Sample("rlhf_step_seconds_total", j, self.step_seconds)
        yield Sample("rlhf_untimed_seconds_total", j, self.untimed_seconds)
        yield Sample("rlhf_tokens_total", j, self.tokens)
        for group in GROUPS:
            yield Sample("rlhf_group_seconds_total", j + (group,), self.group_seconds[group])
        last = self.last
        for verdict in VERDICTS:
            hit = last is not None and last.verdict == verdict
            yield Sample("rlhf_bottleneck", j + (verdict,), 1.0 if hit else 0.0)
            yield Sample(
                "rlhf_bottleneck_steps_total", j + (verdict,), float(self.verdict_steps[verdict])
            )
        for (verdict, reason), n in self.reason_steps.items():
            yield Sample("rlhf_bottleneck_reason_steps_total", j + (verdict, reason), float(n))
        for kind in CHANGES:
            hit = last is not None and last.change.change == kind
            yield Sample("rlhf_change", j + (kind,), 1.0 if hit else 0.0)
            yield Sample("rlhf_change_steps_total", j + (kind,), float(self.change_steps[kind]))
        for group in COST_GROUPS:
            yield Sample(
                "rlhf_regression_steps_total", j + (group,), float(self.regression_steps[group])
            )
        if last is not None:
            yield from self._last_step(last)
        if self.engine is not None:
            yield from self._engine_samples(self.engine)
        for (name, extra), value in sorted(self._extra.items()):
            yield Sample(name, j + extra, value)

    def _engine_samples(self, ev: EngineEvidence) -> Iterable[Sample]:
        j = self.labels
        yield Sample("rlhf_engine_evidence_usable", j, 1.0 if ev.usable else 0.0)
        for usable, n in self._engine_windows.items():
            yield Sample("rlhf_engine_windows_total", j + (usable,), float(n))
        yield Sample("rlhf_engine_window_seconds", j, ev.window_seconds)
        yield Sample("rlhf_engine_coverage_ratio", j, ev.coverage)
        yield Sample("rlhf_engine_replicas", j, float(ev.replicas))
        yield Sample("rlhf_engine_running_requests_peak", j, ev.peak_running)
        yield Sample("rlhf_engine_running_requests_mean", j, ev.running_mean)
        yield Sample("rlhf_engine_waiting_requests_mean", j, ev.waiting_mean)
        yield Sample("rlhf_engine_kv_cache_usage_max_ratio", j, ev.kv_max)
        yield Sample("rlhf_engine_preemptions", j, ev.preemptions)
        yield Sample("rlhf_engine_preemptions_total", j, self._engine_preemptions)
        if ev.imbalance is not None:
            yield Sample("rlhf_engine_imbalance_ratio", j, ev.imbalance)
        for condition, share in (
            ("kv_pressure", ev.kv_pressure_share),
            ("queueing", ev.queueing_share),
            ("long_tail", ev.long_tail_share),
        ):
            yield Sample("rlhf_engine_window_share_ratio", j + (condition,), share)
        for replica, tokens in sorted(ev.tokens.items()):
            label, _ = clean_label(replica[:MAX_LABEL_CHARS])
            yield Sample("rlhf_engine_replica_generated_tokens", j + (label,), tokens)
        for replica, kv in sorted(ev.kv_max_by_replica.items()):
            label, _ = clean_label(replica[:MAX_LABEL_CHARS])
            yield Sample("rlhf_engine_replica_kv_cache_usage_max_ratio", j + (label,), kv)

    def _last_step(self, d: StepDiagnosis) -> Iterable[Sample]:
        j = self.labels
        w = d.windows
        yield Sample("rlhf_step_duration_seconds", j, w.step_seconds)
        yield Sample("rlhf_untimed_duration_seconds", j, w.untimed_seconds)
        phases = dict(d.timers)
        for _outer, rest in self._th.split_timers.values():  # e.g. verl 0.6's weight load
            if rest in w.counted:
                phases.setdefault(rest, w.counted[rest])
        for phase, seconds in sorted(phases.items()):
            if (
                phase != "step" and len(phase) <= MAX_LABEL_CHARS
            ):  # step: rlhf_step_duration_seconds
                yield Sample("rlhf_phase_duration_seconds", j + (phase,), seconds)
        for group in GROUPS:
            yield Sample("rlhf_group_duration_seconds", j + (group,), w.group_seconds[group])
            yield Sample("rlhf_group_share_ratio", j + (group,), w.shares[group])
        for reason in REASONS[d.verdict]:
            yield Sample(
                "rlhf_bottleneck_reason",
                j + (d.verdict, reason),
                1.0 if reason == d.reason else 0.0,
            )
        if d.tokens is not None:
            yield Sample("rlhf_step_tokens", j, d.tokens)
        point, base = d.change.point, d.change.baseline
        if point is not None:
            for group in COST_GROUPS:
                yield Sample("rlhf_group_cost_seconds_per_token", j + (group,), point.costs[group])
        if base is not None:
            for group in COST_GROUPS:
                yield Sample(
                    "rlhf_baseline_group_cost_seconds_per_token", j + (group,), base.costs[group]
                )
            yield Sample("rlhf_baseline_step_duration_seconds", j, base.busy_seconds)
            yield Sample("rlhf_baseline_tokens_per_second", j, base.tokens_per_second)

    def episodes(self) -> tuple[Episode, ...]:
        """The change episodes of the kept steps (rlhf_exporter/diagnosis/episodes.py),
        computed once per new step, when a page first asks."""
        kept = self._history  # replaced whole by the source's thread: read once
        cached = self._episodes
        if cached[0] is not kept:
            cached = self._episodes = (kept, tuple(episodes(kept)))
        return cached[1]

    def summary(self) -> dict[str, Any]:
        """What the landing page shows for this job."""
        d = self.last
        out: dict[str, Any] = {
            "project": self.project,
            "experiment": self.experiment,
            "step": self.step,
            "run": self.run,
            "history": self._history,  # StepPoints (the job view; not in /api/v1/jobs)
            "episodes": self.episodes(),  # Episodes of the history (the job view)
            "steps": self.steps,
            "verdict": d.verdict if d else None,
            "reason": d.reason if d else None,
            "change": d.change.change if d else None,
            "regressed": d.change.regressed if d else None,
            "step_seconds": d.windows.step_seconds if d else None,
            "last_step_time": self.last_step_time,
            # what the stall limit reads (diagnosis/stall.py), as rlhf_baseline_step_duration_
            # seconds and rlhf_between_steps_max_seconds export them
            "baseline_step_seconds": (
                d.change.baseline.busy_seconds if d and d.change.baseline is not None else None
            ),
            "between_steps_max": self.between_steps_max,
            "finished": self.finished,
            "state": self.state,
            "state_signal": self.state_signal,
            "cannot_show": missing_evidence(self._evidence_seen),
        }
        if self.engine is not None:  # a sidecar without engines: the summary as before
            out["engine"] = _engine_summary(self.engine, self.engine_step)
        return out


def _engine_summary(ev: EngineEvidence, step: int | None) -> dict[str, Any]:
    """The engine evidence for `/` and the job view."""
    return {
        "step": step,
        "usable": ev.usable,
        "coverage": ev.coverage,
        "replicas": ev.replicas,
        "peak_running": ev.peak_running,
        "waiting_mean": ev.waiting_mean,
        "kv_max": ev.kv_max,
        "preemptions": ev.preemptions,
        "imbalance": ev.imbalance,
        "kv_pressure_share": ev.kv_pressure_share,
        "queueing_share": ev.queueing_share,
        "long_tail_share": ev.long_tail_share,
    }


def verl_metric_names() -> frozenset[str]:
    """The catalog's "verl steps" names (a test checks `Job` can emit each of them)."""
    return frozenset(n for n, m in BY_NAME.items() if m.section == "verl steps")
