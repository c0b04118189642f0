"""moescope inside TRL under FSDP2: what the instruments cost per sharded GRPO step.

Two processes launched by ``accelerate launch --config_file examples/accelerate_fsdp2.yaml`` (on
CPU over gloo here, on GPUs over NCCL) train the toy with TRL's ``GRPOTrainer``
(``grpo_on_tasks`` defaults: 2 prompts × 8 generations per step and process), the model sharded
with FSDP2 (each decoder layer and the root). Within the one launch, rounds alternate a run
without and a run with ``moescope.integrations.trl.instrument`` (trace, expert load and router
statistics summed over ranks, gradient norms by group from the shards, the non-finite search's
flag all-reduced); per run the median step time (first step left out), from the step's start to
the end of its callbacks (the instruments' reductions and trace line included), and the ratio of
the two medians over the rounds, side by side. Goal: ≤ 1.10× in wall time; rank 0's CPU time
beside it, which a machine busy with other work disturbs less.

    .venv/bin/python bench/trl_fsdp2.py [--rounds 4] [--steps 8] [--processes 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent / "examples" / "accelerate_fsdp2.yaml"
GOAL = 1.10
LABELS = ("bare", "instrumented")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # CPU: rank 0's, waits left out


def worker(rounds: int, steps: int, out: Path) -> None:
    """One process of the launch: the rounds, bare then instrumented; rank 0 writes the times."""
    import torch

    from moescope.integrations.trl import instrument
    from moescope.integrations.trl_tasks import grpo_on_tasks
    from moescope.models.sharding import is_sharded_model

    times: dict[str, list[float]] = {f"{label}/{clock}": [] for label in LABELS for clock in CLOCKS}
    held = []  # trainers stay alive: freeing a sharded model's gloo state mid-run is not measured
    with tempfile.TemporaryDirectory(prefix="moescope-fsdp2-") as tmp:
        for _ in range(rounds):
            for label in LABELS:
                trainer = grpo_on_tasks("toy", Path(tmp) / "run", max_steps=steps)
                if label == "instrumented":
                    instrument(trainer, Path(tmp) / "trace.jsonl")
                timer = _StepTimer()
                trainer.add_callback(timer.callback)  # the last callback: the step's whole work is inside
                trainer.train()
                for clock in CLOCKS:
                    times[f"{label}/{clock}"].append(statistics.median(timer.times[clock][1:]))
                held.append(trainer)
        sharded = all(is_sharded_model(t.model) for t in held)
        if trainer.accelerator.is_main_process:
            world = torch.distributed.get_world_size()
            out.write_text(json.dumps({**times, "sharded": sharded, "world": world}))
        trainer.accelerator.end_training()


class _StepTimer:
    """Each optimizer step's wall and CPU time, from the step's start to the end of the callbacks
    before this one (the instruments' per-step reductions and trace line included)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        self.times: dict[str, list[float]] = {clock: [] for clock in CLOCKS}
        self._start: dict[str, float] = {}
        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, *args: object, **kwargs: object) -> None:
                timer._start = {clock: CLOCKS[clock]() for clock in CLOCKS}

            def on_step_end(self, *args: object, **kwargs: object) -> None:
                for clock, read in CLOCKS.items():
                    timer.times[clock].append(read() - timer._start[clock])

        self.callback = Callback()


def launch(rounds: int, steps: int, processes: int) -> dict:
    """The worker under ``accelerate launch`` with the shipped FSDP2 config; what rank 0 wrote."""
    with tempfile.TemporaryDirectory(prefix="moescope-fsdp2-") as tmp, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
        sock.close()
        out = Path(tmp) / "times.json"
        launcher = Path(sys.executable).with_name("accelerate")
        command = [str(launcher), "launch", "--config_file", str(CONFIG), "--num_processes", str(processes),
                   "--main_process_port", port, str(Path(__file__).resolve()), "--worker",
                   "--rounds", str(rounds), "--steps", str(steps), "--out", str(out)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
        if done.returncode != 0:
            sys.exit(f"the FSDP2 launch failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from moescope._util.process import leave

        worker(args.rounds, args.steps, args.out)
        leave(0)
    result = launch(args.rounds, args.steps, args.processes)
    from trl_integration import overhead_text

    line = overhead_text(result["bare/wall"], result["instrumented/wall"], args.steps, GOAL)
    print(f"FSDP2 overhead ({result['world']} processes, sharded: {result['sharded']}), wall: {line}")
    line = overhead_text(result["bare/cpu"], result["instrumented/cpu"], args.steps)
    print(f"FSDP2 overhead, CPU time of rank 0 (waits for the other process left out): {line}")


if __name__ == "__main__":
    main()
