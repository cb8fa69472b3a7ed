"""A verl-shaped Ray job that can be made to hang on purpose, for the stacks tests (issue 39).

Run as a Ray job's entrypoint (`ray job submit -- python verl_shaped_job.py LOG CONTROL
trainer.project_name=P trainer.experiment_name=E`). Its actors are named and classed as
verl 0.9.1's: the driver runs a `TaskRunner` actor, which makes `WorkerDict` trainer workers
(a class defined inside a function, as verl's colocated worker is), `vLLMHttpServer` rollout
servers named `vllm_server_<r>_0`, `AgentLoopWorker`s and a `RewardLoopWorker`. Each step the
TaskRunner asks the agent loops to generate (each `ray.get`s its server's `generate`), scores,
updates the trainer workers, and appends one record to LOG in verl's file-logger shape.

The CONTROL file says what the job does now (read at every call):
  step            make steps (also when the file is missing)
  rollout_lock    the servers' `generate` waits on a lock another thread holds
  rollout_sleep   the servers' `generate` sleeps
  collective      trainer rank 0 enters a gloo `all_reduce` that rank 1 does not join
                  (needs torch; the trainer workers then form a gloo group at start)
  checkpoint      the TaskRunner "saves a checkpoint" into a pipe nobody reads
Anything else is `step` again: every hang ends when the file says `step`, and the job steps.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import ray

HANGS = ("rollout_lock", "rollout_sleep", "collective", "checkpoint")


def mode(control: str) -> str:
    try:
        with open(control) as f:
            text = f.read().strip()
    except OSError:
        return "step"
    return text if text in HANGS else "step"


def until_released(control: str, hang: str) -> None:
    while mode(control) == hang:
        time.sleep(0.2)


@ray.remote(num_cpus=0)
class vLLMHttpServer:  # verl's name
    def __init__(self, control: str):
        self.control = control
        self.lock = threading.Lock()
        threading.Thread(target=self._holder, daemon=True, name="holder").start()

    def _holder(self) -> None:
        """Holds the lock while the control file says rollout_lock."""
        held = False
        while True:
            want = mode(self.control) == "rollout_lock"
            if want and not held:
                self.lock.acquire()
                held = True
            elif held and not want:
                self.lock.release()
                held = False
            time.sleep(0.1)

    def generate(self, prompt: int) -> int:
        if mode(self.control) == "rollout_sleep":
            while mode(self.control) == "rollout_sleep":
                time.sleep(0.5)
        with self.lock:
            return prompt + 1

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class AgentLoopWorker:
    def __init__(self, server):
        self.server = server

    def generate_sequences(self, prompt: int) -> int:
        return ray.get(self.server.generate.remote(prompt))


@ray.remote(num_cpus=0)
class RewardLoopWorker:
    def compute_score(self, n: int) -> float:
        return float(n)


def worker_class():
    """Made inside a function, as verl's colocated WorkerDict is (`...<locals>.WorkerDict`)."""

    class WorkerDict:
        def __init__(self, rank: int, world: int, port: int, control: str):
            self.rank, self.world, self.port, self.control = rank, world, port, control
            self.dist = None

        def init_group(self) -> bool:
            try:
                import torch.distributed as dist
            except ImportError:
                return False
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{self.port}",
                rank=self.rank,
                world_size=self.world,
            )
            self.dist = dist
            return True

        def update_actor(self, step: int) -> int:
            if self.dist is not None and mode(self.control) == "collective":
                import torch

                if self.rank != 0:  # the missing peer: joins only once released
                    until_released(self.control, "collective")
                self.dist.all_reduce(torch.ones(4))
            return step

    return ray.remote(num_cpus=0)(WorkerDict)


@ray.remote(num_cpus=0)
class TaskRunner:
    def run(self, log: str, control: str, workers: int, servers: int, port: int) -> None:
        from rlhf_exporter.demo import simulator as sim

        pool = [
            vLLMHttpServer.options(name=f"vllm_server_{r}_0").remote(control)
            for r in range(servers)
        ]
        agents = [
            AgentLoopWorker.options(name=f"agent_loop_worker_{i}").remote(s)
            for i, s in enumerate(pool)
        ]
        reward = RewardLoopWorker.options(name="reward_loop_worker_0").remote()
        cls = worker_class()
        trainers = [cls.remote(rank, workers, port, control) for rank in range(workers)]
        grouped = all(ray.get([t.init_group.remote() for t in trainers]))
        regime = sim.Regime(
            "tiny", {**sim.BASE_COST, "update_weights": 0.01}, tokens=30_000, v0=False
        )
        rng = random.Random(39)
        with open(log, "ab", buffering=0) as out:
            out.write(sim.encode({"step": 0, "data": {"stacks/grouped": float(grouped)}}))
            step = 0
            while True:
                step += 1
                ray.get([a.generate_sequences.remote(step) for a in agents])
                ray.get(reward.compute_score.remote(step))
                ray.get([t.update_actor.remote(step) for t in trainers])
                if mode(control) == "checkpoint":
                    self._save_checkpoint(control)
                out.write(sim.encode({"step": step, "data": sim.step_data(regime, step, rng)}))
                time.sleep(0.3)

    def _save_checkpoint(self, control: str) -> None:
        """Writes into a pipe nobody reads until released: a save stuck on its storage."""
        r, w = os.pipe()

        def drain() -> None:
            until_released(control, "checkpoint")
            while os.read(r, 1 << 16):
                pass

        threading.Thread(target=drain, daemon=True).start()
        with os.fdopen(w, "wb") as f:
            f.write(b"\0" * (8 << 20))

    def pid(self) -> int:
        return os.getpid()


def main(argv: list[str]) -> None:
    log, control = argv[1], argv[2]
    options = dict(a.split("=", 1) for a in argv[3:] if "=" in a and a.startswith("stacks."))
    ray.init()
    runner = TaskRunner.options(name="task_runner").remote()
    ray.get(
        runner.run.remote(
            log,
            control,
            int(options.get("stacks.workers", 2)),
            int(options.get("stacks.servers", 1)),
            int(options.get("stacks.port", 29500)),
        )
    )


if __name__ == "__main__":
    main(sys.argv)
