"""Exact-match accuracy of a causal LM on the task suite, greedy and sampled.

Sampled accuracy at temperature 1 is what an RL rollout sees, and ``mixed`` (the share of
prompts whose group of samples is neither all right nor all wrong) is the share of GRPO groups
that carry a learning signal. Greedy accuracy is the model's "best guess" skill.

Example
-------
>>> from moescope.models.toy import load_toy
>>> model, tok = load_toy()
>>> acc = evaluate_tasks(model, tok, ["add2"], n=8, samples=2)
>>> acc.to_frame().columns.tolist()
['task', 'mode', 'accuracy', 'mixed', 'n']
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope import schema
from moescope.models.tasks import Example, check_tasks, heldout, max_answer_chars, score

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    import torch

GREEDY, SAMPLED = "greedy", "sampled"


@dataclass(frozen=True)
class TaskResult:
    """Accuracy of one task family.

    Attributes
    ----------
    task : str
        Family name.
    n : int
        Held-out prompts evaluated.
    greedy : float
        Share of prompts whose greedy answer is exactly right.
    sampled : float
        Share of all ``n * samples`` sampled answers that are exactly right.
    mixed : float
        Share of prompts with between 1 and ``samples - 1`` right samples.
    """

    task: str
    n: int
    greedy: float
    sampled: float
    mixed: float


@dataclass(frozen=True)
class TaskAccuracy:
    """Per-task accuracies plus the sampling settings that produced them."""

    results: tuple[TaskResult, ...]
    samples: int
    temperature: float
    seed: int

    def __getitem__(self, task: str) -> TaskResult:
        for r in self.results:
            if r.task == task:
                return r
        raise KeyError(task)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(r.task for r in self.results)

    def to_frame(self) -> pd.DataFrame:
        """Long form: one row per task and mode; ``mixed`` is NaN for greedy (one answer per prompt)."""
        import pandas as pd

        columns = [schema.TASK, "mode", "accuracy", "mixed", "n"]
        rows = []
        for r in self.results:
            rows.append((r.task, GREEDY, r.greedy, math.nan, r.n))
            rows.append((r.task, SAMPLED, r.sampled, r.mixed, r.n))
        return pd.DataFrame(rows, columns=columns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "temperature": self.temperature,
            "seed": self.seed,
            "results": [asdict(r) for r in self.results],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskAccuracy:
        results = tuple(TaskResult(**r) for r in d["results"])
        return cls(results, int(d["samples"]), float(d["temperature"]), int(d["seed"]))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TaskAccuracy:
        return cls.from_dict(json.loads(Path(path).read_text()))


def decode_completions(tokenizer: Any, new_ids: torch.Tensor) -> list[str]:
    """Decode generated ids (prompt removed) up to the first end-of-sequence.

    Special tokens other than the trailing pad are kept in the text, so an answer with a stray
    ``<unk>`` or ``<bos>`` inside never scores as correct; an answer that never ends also stays
    wrong, because the generation budget is one token longer than the longest answer.
    """
    texts = []
    for row in new_ids.tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id)]
        texts.append(tokenizer.decode(row, skip_special_tokens=False))
    return texts


def _generate(model: Any, tokenizer: Any, prompts: list[str], budget: int, sample_kw: dict) -> list[str]:
    return decode_completions(tokenizer, new_token_ids(model, tokenizer, prompts, budget, sample_kw))


def new_token_ids(
    model: Any, tokenizer: Any, prompts: list[str], budget: int, sample_kw: dict
) -> torch.Tensor:
    """``(len(prompts), ≤ budget)`` ids generated after the left-padded ``prompts``."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left").to(model.device)
    out = model.generate(
        **enc,
        max_new_tokens=budget,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sample_kw,
    )
    return out[:, enc["input_ids"].shape[1] :]


def generate_answers(
    model: Any, tokenizer: Any, examples: Sequence[Example], *, batch_size: int = 64, **sampling: Any
) -> list[str]:
    """Generate and decode one completion per example, in left-padded batches.

    ``sampling`` goes to ``generate`` (``do_sample``, ``temperature``, ...); the budget is the
    longest answer of the examples' tasks plus end-of-sequence.
    """
    budget = max(max_answer_chars(ex.task) for ex in examples) + 1
    answers: list[str] = []
    for i in range(0, len(examples), batch_size):
        chunk = [ex.prompt for ex in examples[i : i + batch_size]]
        answers += _generate(model, tokenizer, chunk, budget, sampling)
    return answers


def _task_seed(seed: int, task: str) -> int:
    # Per-task seeds: a task's numbers do not depend on which other tasks are evaluated with it.
    return (seed * 1_000_003 + zlib.crc32(task.encode())) % 2**63


def _evaluate_task(
    model: Any,
    tokenizer: Any,
    task: str,
    *,
    n: int,
    samples: int,
    temperature: float,
    seed: int,
    batch_size: int,
) -> TaskResult:
    """Greedy and sampled exact match of one task family; see :func:`evaluate_tasks`."""
    import torch

    examples = heldout(task, n)
    greedy = generate_answers(model, tokenizer, examples, batch_size=batch_size, do_sample=False)
    g_acc = sum(score(ex, a) for ex, a in zip(examples, greedy, strict=True)) / n

    repeated = [ex for ex in examples for _ in range(samples)]  # a prompt's samples stay adjacent
    # fork_rng: seeding here must not change the caller's random stream (e.g. an RL run)
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(_task_seed(seed, task))
        sampled = generate_answers(
            model,
            tokenizer,
            repeated,
            batch_size=batch_size,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
        )
    right = [score(ex, a) for ex, a in zip(repeated, sampled, strict=True)]
    per_prompt = [sum(right[i : i + samples]) for i in range(0, len(right), samples)]
    mixed = sum(0 < c < samples for c in per_prompt) / n
    return TaskResult(task, n, g_acc, sum(right) / len(right), mixed)


def evaluate_tasks(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str] | None = None,
    *,
    n: int = 200,
    samples: int = 4,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
) -> TaskAccuracy:
    """Exact-match accuracy per task on the fixed held-out prompts, greedy and sampled.

    Parameters
    ----------
    model, tokenizer
        A causal LM and its tokenizer (pad, eos defined); prompts are left-padded.
    tasks : sequence of str, optional
        Families to evaluate; all of :data:`moescope.models.tasks.TASK_FAMILIES` by default.
    n : int
        Held-out prompts per task (the first ``n`` of the fixed pool).
    samples : int
        Sampled answers per prompt, the RL group size (pure temperature sampling, no top-k/top-p).
    temperature : float
        Sampling temperature.
    seed : int
        Seeds the sampling; the same seed on the same machine gives the same numbers.
    batch_size : int
        Sequences per ``generate`` call.

    Returns
    -------
    TaskAccuracy
    """
    import torch

    names = check_tasks(tasks)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            results = tuple(
                _evaluate_task(
                    model,
                    tokenizer,
                    t,
                    n=n,
                    samples=samples,
                    temperature=temperature,
                    seed=seed,
                    batch_size=batch_size,
                )
                for t in names
            )
    finally:
        model.train(was_training)
    return TaskAccuracy(results, samples, temperature, seed)
