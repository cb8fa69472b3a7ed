"""What every panel function reads: the thresholds and the names of the recording rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...diagnosis import Thresholds
from ..rules import Context


@dataclass(frozen=True)
class DashboardContext:
    """The inputs of one rendering; panel functions take it and return a panel.

    `rules` gives the recording-rule names and the window they are computed over (so the
    dashboards query exactly what alerts/ records); it is built here and nowhere else.
    """

    th: Thresholds
    rules: Context

    @classmethod
    def of(cls, th: Thresholds) -> DashboardContext:
        return cls(th, Context(th))

    @property
    def alerts(self) -> Mapping[str, Any]:
        """The thresholds file's `alerts:` section."""
        return self.th.alerts
