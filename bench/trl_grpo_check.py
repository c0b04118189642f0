"""Does RL on a proxy get a learning signal? A few steps of TRL's ``GRPOTrainer`` per model.

Each ``LABEL=MODEL`` (an embedded model's name or a checkpoint directory, e.g. a proxy written by
``moescope export``) is trained for ``--steps`` GRPO steps on add2/add3 prompts of the task suite
with the exact-match reward (:func:`moescope.models.tasks.score`): 2 prompts × 8 generations per
step, learning rate 1e-4, no KL term. Printed per model: the mean reward and the mean share of
groups whose rewards were all equal (TRL's ``frac_reward_zero_std``; 1.0 is no signal at all).

TRL comes with the ``trl`` extra (``pip install 'moescope[trl]'``; ``make install`` has it). The
trainer is :func:`moescope.integrations.trl_tasks.grpo_on_tasks` with its defaults.

    .venv/bin/python bench/trl_grpo_check.py toy=toy proxy=moescope-out/proxy [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

from moescope.integrations.trl_tasks import grpo_on_tasks


def grpo_run(model: str, steps: int, seed: int = 0) -> dict[str, float]:
    """Train a fresh copy of ``model``; mean reward and zero-std share over the steps."""
    with tempfile.TemporaryDirectory() as out:
        trainer = grpo_on_tasks(model, out, max_steps=steps, seed=seed)
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    return {
        "reward": statistics.fmean(entry["reward"] for entry in logs),
        "zero_std": statistics.fmean(entry["frac_reward_zero_std"] for entry in logs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="LABEL=MODEL")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | mean reward | share of groups with zero reward std |\n|---|---|---|")
    for label, _, model in (given.partition("=") for given in args.models):
        result = grpo_run(model, args.steps)
        print(f"| {label} | {result['reward']:.2f} | {result['zero_std']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
