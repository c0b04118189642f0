"""A TRL ``GRPOTrainer`` on moescope's task suite: the recipe, the checks and the tests share it.

The model (an embedded model's name, a checkpoint directory such as a proxy, or a loaded model)
is trained with GRPO on prompts of the suite's tasks, rewarded by exact match
(:func:`moescope.models.tasks.score`). Everything else is TRL's own: pass ``GRPOConfig`` fields
as keyword arguments to change them. Needs the ``trl`` extra (``pip install 'moescope[trl]'``).

>>> callbacks = [MoescopeCallback("toy.jsonl")]  # doctest: +SKIP
>>> trainer = grpo_on_tasks("toy", "out", max_steps=20, callbacks=callbacks)  # doctest: +SKIP
>>> trainer.train()  # doctest: +SKIP

From a shell, the same with a moescope trace and faults, on one process or several::

    python -m moescope.integrations.trl_tasks MODEL --trace T.jsonl [--steps N] [--fault F]...
    accelerate launch --num_processes 2 -m moescope.integrations.trl_tasks MODEL --trace T.jsonl

    accelerate launch --config_file examples/accelerate_fsdp2.yaml -m moescope.integrations.trl_tasks ...

(``--cpu`` after ``launch`` on a machine without GPUs: gloo; on GPUs the same command uses NCCL,
and ``--num_machines`` / ``--machine_rank`` spread it over nodes. The FSDP2 config shards each
decoder layer, on GPUs and, through :func:`~moescope.integrations.fsdp.shard_on_cpu`, on CPU.)
Only the main process writes the trace; the MoE statistics are reduced across processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from moescope.errors import MoescopeError
from moescope.integrations.fsdp import shard_on_cpu
from moescope.models.embedded import embedded_path, is_embedded
from moescope.models.tasks import make_examples, score

__all__ = ["DEFAULTS", "grpo_on_tasks"]

# a small CPU run: 2 prompts × 8 generations per step, no KL term, one log line per step, no
# activation checkpointing (TRL turns it on by default; the small models need no memory saved,
# and faults that change which experts a token reaches break its recomputation, see
# moescope.integrations.faults)
DEFAULTS: dict[str, Any] = {
    "gradient_checkpointing": False,
    "per_device_train_batch_size": 16,
    "num_generations": 8,
    "max_completion_length": 8,
    "learning_rate": 1e-4,
    "logging_steps": 1,
    "report_to": [],
    "temperature": 1.0,
    "save_strategy": "no",
    "beta": 0.0,
    "seed": 0,
}


def grpo_on_tasks(
    model: str | Path | torch.nn.Module,
    output_dir: str | Path,
    *,
    tasks: tuple[str, ...] = ("add2", "add3"),
    prompts_per_task: int = 64,
    callbacks: list[Any] | None = None,
    **config: Any,
) -> Any:
    """A ``GRPOTrainer`` of ``model`` on ``tasks`` (not started: call ``.train()``)."""
    try:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as err:
        raise MoescopeError(
            f"the TRL integration needs {err.name}; install it with pip install 'moescope[trl]'."
        ) from None
    fields = {**DEFAULTS, "use_cpu": not torch.cuda.is_available(), **config}
    seed = fields["seed"]
    path = embedded_path(model) if isinstance(model, str) and is_embedded(model) else model
    if isinstance(path, str | Path):
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:
        tokenizer = AutoTokenizer.from_pretrained(model.config._name_or_path)
    examples = [e for task in tasks for e in make_examples(task, prompts_per_task, seed=seed)]
    by_prompt = {e.prompt: e for e in examples}

    def exact_match(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [score(by_prompt[p], c) for p, c in zip(prompts, completions, strict=True)]

    dataset = Dataset.from_list([{"prompt": e.prompt} for e in examples]).shuffle(seed=seed)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_match,
        args=GRPOConfig(output_dir=str(output_dir), **fields),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    return shard_on_cpu(trainer)  # an FSDP2 launch shards on CPU as on GPUs


def main(argv: list[str] | None = None) -> int:
    """``python -m moescope.integrations.trl_tasks``: a GRPO run on the task suite, traced."""
    import argparse
    import tempfile

    from moescope.integrations.trl import instrument

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model", help="'toy', 'toy-v3' or a checkpoint directory (a proxy, say)")
    parser.add_argument("--trace", required=True, help="the moescope trace to write")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps")
    parser.add_argument("--fault", action="append", default=[], metavar="NAME[@STEP][:ARG]")
    parser.add_argument("--batch", type=int, default=DEFAULTS["per_device_train_batch_size"],
                        help="completions per step and process")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--greedy", action="store_true", help="decode greedily (a deterministic run)")
    parser.add_argument("--fp32", action="store_true", help="train in float32 (TRL's default: bf16)")
    args = parser.parse_args(argv)
    extra = {"generation_kwargs": {"do_sample": False}} if args.greedy else {}
    extra |= {"bf16": False} if args.fp32 else {}
    with tempfile.TemporaryDirectory(prefix="moescope-trl-") as out:
        trainer = grpo_on_tasks(
            args.model,
            out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            seed=args.seed,
            **extra,
        )
        instrument(trainer, args.trace, faults=args.fault)
        trainer.train()
        trainer.accelerator.end_training()  # the process group of a distributed run, destroyed
        # Kept past the return: freeing the trainer frees DDP's Reducer, whose gloo process group
        # joins a loop thread that waits for the GIL the freeing holds (a hang seen under load);
        # a distributed worker then leaves through os._exit, never freeing it.
        _HELD.append(trainer)
    return 0


_HELD: list[Any] = []


if __name__ == "__main__":
    from moescope._util.process import leave

    leave(main())  # a distributed worker without the interpreter's teardown, where gloo can hang
