"""The decision table (docs/decision-table.md) as pure code: records in, verdicts out.

No I/O, and no imports from the rest of the package: the offline `diagnose`, the sidecar
and the tests share this one implementation.
"""

from .change import CHANGES, COST_GROUPS, Baseline, Change, Point
from .steps import BatchDiagnoser, Record, StepDiagnosis, StreamDiagnoser, StreamEvent, classify
from .thresholds import GROUPS, Thresholds, ThresholdsError
from .verdict import BALANCED, REASONS, UNKNOWN, VERDICTS
from .windows import Windows, split, timers

__all__ = [
    "BALANCED",
    "CHANGES",
    "COST_GROUPS",
    "GROUPS",
    "REASONS",
    "UNKNOWN",
    "VERDICTS",
    "Baseline",
    "BatchDiagnoser",
    "Change",
    "Point",
    "Record",
    "StepDiagnosis",
    "StreamDiagnoser",
    "StreamEvent",
    "Thresholds",
    "ThresholdsError",
    "Windows",
    "classify",
    "split",
    "timers",
]
