"""Recording rules in `level:metric:operations` form (the table is in the package docstring)."""

from __future__ import annotations

from ...diagnosis import VERDICTS

# The one-hot verdict gauge as one number per job, recorded once per evaluation: a fleet
# panel's range query over 1,000 jobs then reads one series per job instead of evaluating a
# nine-way `or` at every step (measured: bench/prometheus_fleet.py, bench/README.md).
VERDICT_CODE = "project_experiment:rlhf_bottleneck_verdict:code"
VERDICT_CODES = {v: i + 1 for i, v in enumerate(VERDICTS)}  # the dashboards' value mappings


def verdict_code_expr() -> str:
    terms = [f'rlhf_bottleneck{{verdict="{v}"}} * {code}' for v, code in VERDICT_CODES.items()]
    return "max without (verdict) (\n  " + "\n  or ".join(terms) + "\n)"


class RecordingRules:
    """Mixed into `Rules`: the recording rules."""

    def recording(self) -> list[dict[str, str]]:
        w = self.window

        def ratio(numerator: str, label: str) -> str:
            return (
                f"{numerator}\n/ ignoring ({label}) group_left ()\n"
                f"(sum without ({label}) ({numerator}) > 0)"
            )

        return [
            {
                "record": self.share,
                "expr": ratio(f"increase(rlhf_group_seconds_total[{w}])", "group"),
            },
            {
                "record": self.verdicts,
                "expr": ratio(f"increase(rlhf_bottleneck_steps_total[{w}])", "verdict"),
            },
            {
                "record": self.reasons,
                "expr": ratio(f"increase(rlhf_bottleneck_reason_steps_total[{w}])", "reason"),
            },
            {"record": self.step_rate, "expr": f"rate(rlhf_steps_total[{w}])"},
            {"record": self.regressions, "expr": f"increase(rlhf_regression_steps_total[{w}])"},
            {
                "record": self.changes,
                "expr": ratio(f"increase(rlhf_change_steps_total[{w}])", "kind"),
            },
            {
                "record": self.tokens_rate,
                "expr": f"rate(rlhf_tokens_total[{w}])\n/ (rate(rlhf_step_seconds_total[{w}]) > 0)",
            },
            {"record": self.gpu_busy, "expr": f"rate(rlhf_gpu_busy_seconds_total[{w}])"},
            {
                "record": self.gpus_busy,
                "expr": f"avg without (gpu, uuid) (rate(rlhf_gpu_busy_seconds_total[{w}]))",
            },
            {"record": VERDICT_CODE, "expr": verdict_code_expr()},
        ]
