"""Does RL on a proxy get a learning signal? A few steps of TRL's ``GRPOTrainer`` per model.

Each ``LABEL=MODEL`` (an embedded model's name or a checkpoint directory, e.g. a proxy written by
``moescope export``) is trained for ``--steps`` GRPO steps on add2/add3 prompts of the task suite
with the exact-match reward (:func:`moescope.models.tasks.score`): 2 prompts × 8 generations per
step, learning rate 1e-4, no KL term. Printed per model: the mean reward and the mean share of
groups whose rewards were all equal (TRL's ``frac_reward_zero_std``; 1.0 is no signal at all).

TRL is not a moescope dependency; install it beside moescope first (``pip install trl``).

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

from moescope.models.embedded import embedded_path, is_embedded
from moescope.models.tasks import make_examples, score


def grpo_run(path: str, steps: int, seed: int = 0) -> dict[str, float]:
    """Train a fresh copy of the model at ``path``; mean reward and zero-std share over the steps."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    examples = make_examples("add2", 64, seed=seed) + make_examples("add3", 64, seed=seed)
    by_prompt = {e.prompt: e for e in examples}

    def reward(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        return [score(by_prompt[p], c) for p, c in zip(prompts, completions, strict=True)]

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, max_steps=steps, per_device_train_batch_size=16, num_generations=8,
            max_completion_length=8, learning_rate=1e-4, logging_steps=1, report_to=[], use_cpu=True,
            seed=seed, temperature=1.0, save_strategy="no", beta=0.0,
        )  # fmt: skip
        dataset = Dataset.from_list([{"prompt": e.prompt} for e in examples]).shuffle(seed=seed)
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer
        )
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
        path = str(embedded_path(model)) if is_embedded(model) else model
        result = grpo_run(path, args.steps)
        print(f"| {label} | {result['reward']:.2f} | {result['zero_std']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
