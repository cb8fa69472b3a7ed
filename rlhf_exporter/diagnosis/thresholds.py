"""The decision table's numbers, validated. Pure: it takes mappings, never reads files.

`rlhf_exporter.thresholds_file` reads the YAML files; this module checks them against the packaged
defaults and builds the immutable `Thresholds` that the rest of the diagnosis uses.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

GROUPS = ("rollout", "reward", "logprob", "update", "sync", "checkpoint", "other")
"""Decision-table groups, in the order used for ties and for display."""

_DURATION = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")  # Prometheus: 10m, 1h30m, 1500ms
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
    "y": 31536000,
}
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def seconds(text: str | float) -> float:
    """A duration in seconds: the Prometheus syntax ('10m', '1h30m', '1500ms'), or a bare
    number of seconds ('600', 600). The one duration parser of the project: the thresholds
    file, the settings (`--job-expiry 10m`), the rules and the dashboards use it."""
    value: float
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip()
        if _DURATION.fullmatch(s):
            value = sum(int(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(s))
        elif _NUMBER.fullmatch(s):
            value = float(s)
        else:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 10m, 1h30m or seconds)")
    if value != value or value < 0:
        raise ValueError(f"not a duration: {text!r}")
    return value


class ThresholdsError(ValueError):
    """A thresholds document is wrong. The message names the key and the problem."""


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "duration" if _DURATION.fullmatch(value) else "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, Mapping):
        return "mapping"
    return type(value).__name__


_EXPECT = {
    "number": "a number",
    "duration": "a duration such as 30s, 10m or 1h",
    "list": "a list of timer names",
    "mapping": "a mapping",
    "string": "a string",
    "bool": "true or false",
}


def merge(defaults: Mapping[str, Any], override: Any, path: str = "") -> dict[str, Any]:
    """Deep-merge `override` onto `defaults`, rejecting unknown keys and wrong types."""
    if not isinstance(override, Mapping):
        where = path.rstrip(".") or "the file"
        raise ThresholdsError(f"{where}: expected a mapping of keys, got {_kind(override)}")
    merged = dict(defaults)
    free_form = path in ("groups.", "nested_timers.", "split_timers.", "regrouped_timers.")
    for key, value in override.items():
        where = f"{path}{key}"
        if key not in defaults and not free_form:
            hint = difflib.get_close_matches(str(key), [str(k) for k in defaults], n=1)
            extra = f" (did you mean '{path}{hint[0]}'?)" if hint else ""
            raise ThresholdsError(f"{where}: unknown key{extra}")
        if key not in defaults:
            if path == "groups.":
                raise ThresholdsError(f"{where}: unknown group; groups are {', '.join(GROUPS)}")
            want = "list" if path in ("split_timers.", "regrouped_timers.") else "string"
            merged[key] = _check_leaf(where, value, want)
            continue
        base = defaults[key]
        if isinstance(base, Mapping):
            merged[key] = merge(base, value, where + ".")
        else:
            merged[key] = _check_leaf(where, value, _kind(base))
            if str(key).endswith("_url"):
                _check_url(where, value)
    return merged


_URL = re.compile(r"https?://[^\s\x00-\x1f\x7f<>\"'`\\]+")


def _check_url(where: str, value: str) -> None:
    """A link the job view, the report and the alerts carry: http(s) only (a `javascript:`
    or `data:` URL would run in whoever clicks it), no space, quote or control character."""
    if not _URL.fullmatch(value):
        raise ThresholdsError(f"{where}: expected an http:// or https:// URL, got {value!r}")


def _check_leaf(where: str, value: Any, want: str) -> Any:
    got = _kind(value)
    if got != want:
        shown = repr(value) if got in ("string", "duration", "bool", "number") else got
        raise ThresholdsError(f"{where}: expected {_EXPECT.get(want, want)}, got {shown}")
    if want == "number" and value < 0:
        raise ThresholdsError(f"{where}: must not be negative, got {value}")
    if want == "list" and not all(isinstance(v, str) and v for v in value):
        raise ThresholdsError(f"{where}: every entry must be a timer name (a string)")
    return value


@dataclass(
    frozen=True, eq=False
)  # eq=False: hashed by identity (windows.py memoizes per Thresholds)
class Thresholds:
    """Every number of the decision table, plus the timer-to-group map. Immutable."""

    min_share: float
    min_margin: float
    preempted_max: float
    tool_calls_fraction: float
    compute_score_fraction: float
    long_tail_generate_ratio: float
    long_tail_response_ratio: float
    mfu_compute_bound: float
    untimed_fraction: float
    baseline_steps: int
    min_baseline_steps: int
    step_time_ratio: float
    throughput_ratio: float
    cost_ratio: float
    significant_share: float
    min_excess: float
    checkpoint_timer: str
    checkpoint_tolerance: float
    checkpoint_needs: frozenset[str]
    separated_timers: frozenset[str]
    separated_key_prefix: str
    timer_groups: Mapping[str, str]
    ignored_timers: frozenset[str]
    nested_timers: Mapping[str, str]
    split_timers: Mapping[str, tuple[str, str]]  # inner -> (outer, rest window)
    regrouped_timers: Mapping[str, tuple[str, str]]  # timer -> (marker timer, group)
    generation_batches_key: str  # DAPO's n generation batches (train/num_gen_batches)
    alerts: Mapping[str, Any]
    document: Mapping[str, Any]  # the merged document, for renderers

    @classmethod
    def from_documents(cls, defaults: Mapping[str, Any], *overrides: Any) -> Thresholds:
        """Build from the packaged defaults and any number of user documents (later wins)."""
        doc: dict[str, Any] = dict(defaults)
        for override in overrides:
            if override is None:  # an empty YAML file
                continue
            doc = merge(doc, override)
        return cls._from_doc(doc)

    @classmethod
    def _from_doc(cls, doc: Mapping[str, Any]) -> Thresholds:
        ch = doc["change"]
        for key in ("baseline_steps", "min_baseline_steps"):
            if not isinstance(ch[key], int) or ch[key] < 1:
                raise ThresholdsError(f"change.{key}: must be a whole number >= 1, got {ch[key]!r}")
        if ch["min_baseline_steps"] > ch["baseline_steps"]:
            raise ThresholdsError(
                "change.min_baseline_steps: must not exceed change.baseline_steps "
                f"({ch['min_baseline_steps']} > {ch['baseline_steps']})"
            )
        timer_groups: dict[str, str] = {}
        for group, timers in doc["groups"].items():
            for timer in timers:
                if timer in timer_groups and timer_groups[timer] != group:
                    raise ThresholdsError(
                        f"groups.{group}: timer '{timer}' is already in groups.{timer_groups[timer]}"
                    )
                timer_groups[timer] = group
        split_timers: dict[str, tuple[str, str]] = {}
        for inner, pair in doc["split_timers"].items():
            if not pair:  # `inner: []` turns a default split off
                continue
            if len(pair) != 2 or len({inner, *pair}) != 3:
                raise ThresholdsError(
                    f"split_timers.{inner}: expected [outer timer, rest window] (or [] for none), two names "
                    f"other than '{inner}' and each other, got {list(pair)!r}"
                )
            split_timers[inner] = (pair[0], pair[1])
        regrouped_timers = _regrouped(doc["regrouped_timers"])
        v, r, ck = doc["verdict"], doc["reason"], doc["checkpoint"]
        return cls(
            min_share=float(v["min_share"]),
            min_margin=float(v["min_margin"]),
            preempted_max=float(r["preempted_max"]),
            tool_calls_fraction=float(r["tool_calls_fraction"]),
            compute_score_fraction=float(r["compute_score_fraction"]),
            long_tail_generate_ratio=float(r["long_tail_generate_ratio"]),
            long_tail_response_ratio=float(r["long_tail_response_ratio"]),
            mfu_compute_bound=float(r["mfu_compute_bound"]),
            untimed_fraction=float(r["untimed_fraction"]),
            baseline_steps=ch["baseline_steps"],
            min_baseline_steps=ch["min_baseline_steps"],
            step_time_ratio=float(ch["step_time_ratio"]),
            throughput_ratio=float(ch["throughput_ratio"]),
            cost_ratio=float(ch["cost_ratio"]),
            significant_share=float(ch["significant_share"]),
            min_excess=float(ch["min_excess"]),
            checkpoint_timer=ck["timer"],
            checkpoint_tolerance=float(ck["tolerance"]),
            checkpoint_needs=frozenset(ck["inside_needs"]),
            separated_timers=frozenset(ck["separated_timers"]),
            separated_key_prefix=ck["separated_key_prefix"],
            timer_groups=MappingProxyType(timer_groups),
            ignored_timers=frozenset(doc["ignored_timers"]),
            nested_timers=MappingProxyType(dict(doc["nested_timers"])),
            split_timers=MappingProxyType(split_timers),
            regrouped_timers=MappingProxyType(regrouped_timers),
            generation_batches_key=doc["generation_batches_key"],
            alerts=MappingProxyType(dict(doc["alerts"])),
            document=MappingProxyType(doc),
        )


def _regrouped(doc: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """`regrouped_timers`: timer -> (marker timer, group); `timer: []` turns one off."""
    out: dict[str, tuple[str, str]] = {}
    for timer, pair in doc.items():
        if not pair:
            continue
        if len(pair) != 2 or pair[1] not in GROUPS or pair[0] == timer:
            raise ThresholdsError(
                f"regrouped_timers.{timer}: expected [marker timer, group] (or [] for none), "
                f"a timer other than '{timer}' and one of {', '.join(GROUPS)}, got {list(pair)!r}"
            )
        out[timer] = (pair[0], pair[1])
    return out
