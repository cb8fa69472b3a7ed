"""Scripted steps printed the way each framework prints them (unit fixtures for the readers).

A regime is a list of `Step`s (window seconds and tokens); each `print_*` renders it in one
framework's own output format, and `verl_records` gives the verl records the same windows
make, so a test can diagnose both and compare. The frameworks' own logging code, run on
stubbed trainer state, makes the golden fixtures (tests/fixtures/frameworks/<framework>/).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple


class Step(NamedTuple):
    step: int
    gen: float
    logprob: float
    update: float
    sync: float
    tokens: float
    untimed: float = 2.0

    @property
    def total(self) -> float:
        return self.gen + self.logprob + self.update + self.sync + self.untimed


def regime(name: str, steps: int = 20) -> list[Step]:
    """rollout (rollout-bound throughout), update (update-bound), sync (sync-bound),
    regression (update costs twice as much from step 12, same tokens), shift (tokens and
    every window double from step 12)."""
    out = []
    for i in range(1, steps + 1):
        late = i >= 12
        jitter = 0.1 * (i % 3)
        if name == "rollout":
            s = Step(i, 50 + jitter, 10, 20, 5, 1e6)
        elif name == "update":
            s = Step(i, 15 + jitter, 10, 60, 5, 1e6)
        elif name == "sync":
            s = Step(i, 15 + jitter, 10, 20, 55, 1e6)
        elif name == "regression":
            s = Step(i, 20 + jitter, 10, 40 if late else 20, 5, 1e6)
        elif name == "shift":
            k = 2.0 if late else 1.0
            s = Step(i, (30 + jitter) * k, 10 * k, 20 * k, 5, 1e6 * k)
        else:
            raise ValueError(name)
        out.append(s)
    return out


REGIMES = ("rollout", "update", "sync", "regression", "shift")


def verl_records(steps: list[Step], *, tokens: bool = True, untimed: bool = True) -> list[dict]:
    """verl's file-logger records of the same windows (`untimed`: the step total holds the
    untimed remainder, as a printed total does; without it S is the windows' sum)."""
    out = []
    for s in steps:
        data: dict[str, float] = {
            "timing_s/gen": s.gen,
            "timing_s/old_log_prob": s.logprob,
            "timing_s/update_actor": s.update,
            "timing_s/update_weights": s.sync,
            "timing_s/step": s.total if untimed else s.total - s.untimed,
        }
        if tokens:
            data["perf/total_num_tokens"] = s.tokens
        out.append({"step": s.step, "data": data})
    return out


def print_openrlhf(steps: list[Step]) -> str:
    lines = ["[INFO] ppo_trainer.py: starting"]
    for s in steps:
        status = {
            "policy_loss": 0.1,
            "timing/make_experience": s.logprob,
            "timing/ppo_train": s.update,
            "timing/broadcast": s.sync,
            "rollout/response_length_mean": 400.0,
            "total_length": 500.0,
            "rollout/num_samples": s.tokens / 500.0,
            "timing/generation": s.gen,
            "timing/step_total": s.total,
        }
        lines.append(f"[2026-01-01 00:00:00,000] [INFO] ✨ Global step {s.step}: {status}")
    return "\n".join(lines) + "\n"


def print_slime(steps: list[Step]) -> str:
    """Two lines a step: the rollout manager's, then the trainer's."""
    lines = []
    for s in steps:
        lines.append(f"INFO rollout.py:1 - perf {s.step}: { ({'perf/rollout_time': s.gen}) }")
        trainer = {
            "perf/log_probs_time": s.logprob,
            "perf/actor_train_time": s.update,
            "perf/actor_train_tflops": 123.0,
            "perf/actor_train_tok_per_s": s.tokens / s.update,
            "perf/step_time": s.total,
            "perf/update_weights_time": s.sync,
        }
        lines.append(f"INFO train_metric_utils.py:2 - perf {s.step}: {trainer}")
    return "\n".join(lines) + "\n"


def _roll_metrics(s: Step, previous: Step | None) -> dict[str, float]:
    """ROLL's metrics of a step: its step total is the step before's (0 at the first)."""
    return {
        "time/step_generate": s.gen,
        "time/old_log_probs": s.logprob,
        "time/step_train": s.update,
        "time/step_model_update": s.sync,
        "time/step_total": previous.total if previous is not None else 0,
    }


def _roll_steps(steps: list[Step]) -> list[tuple[Step, dict[str, float]]]:
    return [(s, _roll_metrics(s, steps[i - 1] if i else None)) for i, s in enumerate(steps)]


def print_roll(steps: list[Step]) -> str:
    lines = [
        f"metrics_tag: {json.dumps({'step': s.step, 'metrics': m})}" for s, m in _roll_steps(steps)
    ]
    return "\n".join(lines) + "\n"


def roll_jsonl(steps: list[Step]) -> str:
    return "".join(json.dumps({"step": s.step, "metrics": m}) + "\n" for s, m in _roll_steps(steps))


def print_areal(steps: list[Step]) -> str:
    """AReaL's table: four key/value pairs a row, column-major, values as .4e."""
    lines = []
    for s in steps:
        stats = {
            "ppo_actor/loss": 0.1,
            "timeperf/recompute_logp": s.logprob,
            "timeperf/rollout": s.gen,
            "timeperf/train_step": s.update,
            "timeperf/update_weights": s.sync,
        }
        lines.append(f"Epoch 1/1 Step {s.step}/99 Train step {s.step}/99 done.")
        lines.append("20260101-00:00:00.000 StatsLogger INFO: Stats (1/1):")
        lines.append("20260101-00:00:00.000 StatsLogger INFO: ")
        items = list(stats.items())
        rows = (len(items) + 3) // 4
        lines.append("╒" + "═" * 20 + "╤" + "═" * 12 + "╕")
        for r in range(rows):
            cells = []
            for c in range(4):
                i = r + c * rows
                if i < len(items):
                    cells += [items[i][0], f"{items[i][1]:.4e}"]
                else:
                    cells += ["", ""]
            lines.append("│ " + " │ ".join(cells) + " │")
            if r < rows - 1:
                lines.append("├" + "─" * 20 + "┼" + "─" * 12 + "┤")
        lines.append("╘" + "═" * 20 + "╧" + "═" * 12 + "╛")
    return "\n".join(lines) + "\n"


def _nemo_rate(s: Step) -> float:
    """NeMo-RL's printed E2E tokens/s (per group): its tokens over its step time."""
    return s.tokens / (s.total + 1.0)


def print_nemo_rl(steps: list[Step]) -> str:
    lines = []
    for s in steps:
        timers = {
            "generation": s.gen,
            "policy_and_reference_logprobs": s.logprob,
            "policy_training": s.update,
            "prepare_for_generation/total": s.sync + 1.0,
            "prepare_for_generation/transfer_and_update_weights": s.sync,
        }
        lines += [f"{'=' * 25} Step {s.step}/99 {'=' * 25}", "▶ Generating responses..."]
        lines += ["", "📊 Training Results:", "  • Loss: 0.1000", "", "⏱️  Timing:"]
        lines.append(f"  • Total step time: {s.total + 1.0:.2f}s")
        for k, v in sorted(timers.items(), key=lambda kv: kv[1], reverse=True):
            lines.append(f"  • {k}: {v:.2f}s ({100 * v / (s.total + 1.0):.1f}%)")
        lines += ["", "🔍 Performance Metrics:", "  • Throughputs (per Group):"]
        lines.append(f"    - E2E (Tokens/sec): {_nemo_rate(s):.2f}")
        lines.append("")
    return "\n".join(lines) + "\n"


def tensorboard_scalars(framework: str, steps: list[Step]) -> list[tuple[int, dict[str, float]]]:
    """What each framework's `tensorboard` logger writes per step (tag -> value)."""
    out = []
    roll = dict((s.step, m) for s, m in _roll_steps(steps))
    for s in steps:
        if framework == "openrlhf":
            d = {
                "train/timing/generation": s.gen,
                "train/timing/make_experience": s.logprob,
                "train/timing/ppo_train": s.update,
                "train/timing/broadcast": s.sync,
                "train/timing/step_total": s.total,
                "train/rollout/num_samples": s.tokens / 500.0,
                "train/rollout/response_length_mean": 400.0,
                "train/total_length": 500.0,
            }
        elif framework == "verl":
            d = verl_records([s])[0]["data"]
        elif framework == "roll":
            d = roll[s.step]
        elif framework == "nemo_rl":
            d = {
                "timing/train/generation": s.gen,
                "timing/train/policy_and_reference_logprobs": s.logprob,
                "timing/train/policy_training": s.update,
                "timing/train/prepare_for_generation/transfer_and_update_weights": s.sync,
                "timing/train/total_step_time": s.total,
                "train/total_num_tokens": s.tokens,
            }
        elif framework == "areal":
            d = {
                "timeperf/rollout": s.gen,
                "timeperf/recompute_logp": s.logprob,
                "timeperf/train_step": s.update,
                "timeperf/update_weights": s.sync,
            }
        else:
            raise ValueError(framework)
        out.append((s.step - (framework == "areal"), d))  # AReaL's: its 0-based global step
    return out


def write_tensorboard(directory: Path, scalars: list[tuple[int, dict[str, float]]]) -> Path:
    """Event files as `SummaryWriter.add_scalar` writes them (TensorBoard's own writer)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory))
    for step, values in scalars:
        for tag, value in values.items():
            summary = summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]
            )
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    writer.close()
    return directory


# what each framework's printed steps carry: K (tokens) and an untimed remainder in S
PRINTED = {
    "openrlhf": (print_openrlhf, {"tokens": True, "untimed": True}),
    "slime": (print_slime, {"tokens": True, "untimed": True}),
    "roll": (print_roll, {"tokens": False, "untimed": True}),
    "areal": (print_areal, {"tokens": False, "untimed": False}),
    "nemo_rl": (print_nemo_rl, {"tokens": True, "untimed": True}),
}


def expected_records(framework: str, steps: list[Step]) -> list[dict]:
    """verl's records of what `framework`'s printed `steps` carry."""
    rows = verl_records(steps, **PRINTED[framework][1])
    for row in rows:
        if framework == "openrlhf":
            row["data"]["response_length/mean"] = 400.0
        if framework == "roll" and row is rows[-1]:
            del row["data"]["timing_s/step"]  # its total is logged with no later step
        if framework == "nemo_rl":
            row["data"]["timing_s/step"] += 1.0  # the preparation around the weight transfer
            step_time = row["data"]["timing_s/step"]  # K: the printed rate (2 decimals) x S
            rate = float(f"{row['data']['perf/total_num_tokens'] / step_time:.2f}")
            row["data"]["perf/total_num_tokens"] = rate * step_time
    return rows


def write_unit_fixtures(root: Path) -> None:
    """tests/fixtures/frameworks/_unit/: one regime per framework and input kind, with the
    labels verl's own records of the same windows get (`<name>.expected.jsonl`)."""
    from rlhf_exporter.diagnosis import BatchDiagnoser, Record
    from rlhf_exporter.thresholds_file import load_thresholds

    def labels(rows: list[dict]) -> str:
        steps = BatchDiagnoser(load_thresholds()).diagnose(
            Record(r["step"], r["data"]) for r in rows
        )
        keep = ("step", "verdict", "reason", "change")
        return "".join(json.dumps({k: d.to_json()[k] for k in keep}) + "\n" for d in steps)

    root.mkdir(parents=True, exist_ok=True)
    plan = [
        ("openrlhf", "regression"),
        ("slime", "shift"),
        ("roll", "sync"),
        ("areal", "update"),
        ("nemo_rl", "rollout"),
    ]
    for framework, name in plan:
        steps = regime(name)
        (root / f"{framework}_{name}.console.log").write_text(
            PRINTED[framework][0](steps), encoding="utf-8"
        )
        (root / f"{framework}_{name}.expected.jsonl").write_text(
            labels(expected_records(framework, steps)), encoding="utf-8"
        )
    steps = regime("regression")
    (root / "roll_regression.jsonl").write_text(roll_jsonl(steps), encoding="utf-8")
    (root / "roll_regression.expected.jsonl").write_text(
        labels(expected_records("roll", steps)), encoding="utf-8"
    )
    for framework in ("nemo_rl", "openrlhf"):
        tb = root / f"{framework}_tb_regression.tfevents"
        for old in tb.glob("*"):
            old.unlink()
        write_tensorboard(tb, tensorboard_scalars(framework, steps))
        (root / f"{framework}_tb_regression.expected.jsonl").write_text(
            labels(verl_records(steps)), encoding="utf-8"
        )


if __name__ == "__main__":
    import sys

    write_unit_fixtures(Path(sys.argv[1]))
