"""The original's task accuracy from few reads of the model: for a checkpoint run a decoder layer
at a time (:func:`~moescope.explore.sequential.layer_sequential`), where every forward reads the
whole model from disk once.

:func:`~moescope.models.accuracy.model_accuracy` samples one ``generate`` per task and chunk of
64 rows, one forward per generated token: on the task suite at 100 prompts and 4 samples, some
300 reads of the model. The two estimators here give a frame of the same shape (``task, mode,
accuracy, mixed, n``, the same tasks and rows) from a handful:

- ``"teacher-forced"`` (:func:`teacher_forced_accuracy`): one forward over every prompt followed
  by its reference answer (and end-of-sequence where the judge needs the completion to stop),
  all rows in as few batches as memory allows. The sampled accuracy is each prompt's
  probability that temperature-1 sampling writes the answer, averaged: the expectation that
  sampling estimates, without its noise. One read of the model per batch.
- ``"sampled"`` (:func:`batched_sampled_accuracy`): the same sampling as ``model_accuracy``, every
  prompt of every task in one ``generate`` (one for greedy, one for the samples), each row's
  completion cut to its own task's budget before it is judged. One read per generated token.

Teacher-forced is the default. On the task suite at 100 prompts and 4 samples (toy and toy-v3)
it was within 0.003 of ``model_accuracy`` at 64 samples, the expectation it computes; against
``model_accuracy`` at 4 samples and 5 seeds it differed by 0.007 (toy) and 0.005 (toy-v3) per task
on average, batched sampling by 0.012 and 0.010, being a second draw of the same noise; and it
read the model once where batched sampling read it 26 times and ``model_accuracy`` 423. An export
measures the original teacher-forced whether it holds it in memory or reads it a layer at a
time (:func:`~moescope.export.fidelity.original_record.export_original_accuracy`), so both reads
of one model set the same capability target.

Example
-------
>>> from moescope.models.toy import load_toy
>>> model, tok = load_toy()
>>> frame = original_accuracy(model, tok, ("add2",), n_prompts=4, samples=2)
>>> frame.columns.tolist(), frame["mode"].tolist()
(['task', 'mode', 'accuracy', 'mixed', 'n'], ['greedy', 'sampled'])
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from moescope.errors import MoescopeError
from moescope.models.accuracy import greedy_accuracy
from moescope.models.evaluation import GREEDY, TaskAccuracy, TaskResult, decode_completions, new_token_ids
from moescope.models.tasks import Example, heldout, max_answer_chars, score

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedModel

Method = Literal["teacher-forced", "sampled"]
METHODS: tuple[str, ...] = ("teacher-forced", "sampled")
"""The estimators of :func:`original_accuracy`; the first is the default (see the module)."""


def original_accuracy(
    model: PreTrainedModel,
    tokenizer: Any,
    tasks: tuple[str, ...] | list[Example],
    *,
    n_prompts: int = 100,
    samples: int = 4,
    seed: int = 0,
    method: Method = "teacher-forced",
    batch_size: int | None = None,
) -> pd.DataFrame:
    """``task, mode, accuracy, mixed, n`` of ``model`` on resolved ``tasks``, in the shape of
    :func:`~moescope.models.accuracy.model_accuracy` (same rows, same order), from few forwards.

    ``model`` may be in memory or layer-sequential. ``batch_size``: rows per forward, each a read
    of the model (by default as many as memory allows: :func:`answer_log_probs`); for
    ``"sampled"``, rows per ``generate``, a read per generated token (by default all, whose
    key-value cache must fit). ``seed`` only seeds ``"sampled"``.
    """
    if tokenizer is None:
        raise MoescopeError("task accuracy needs the model's tokenizer; pass tokenizer= (or tasks=()).")
    if method == "teacher-forced":
        return teacher_forced_accuracy(
            model, tokenizer, tasks, n_prompts=n_prompts, samples=samples, batch_size=batch_size
        )
    if method == "sampled":
        return batched_sampled_accuracy(
            model, tokenizer, tasks, n_prompts=n_prompts, samples=samples, seed=seed, batch_size=batch_size
        )
    raise MoescopeError(
        f"unknown method {method!r} for the original's accuracy; choose one of {', '.join(METHODS)}."
    )


def measured_examples(tasks: tuple[str, ...] | list[Example], n_prompts: int) -> list[Example]:
    """The examples ``model_accuracy`` judges: each family's first ``n_prompts`` held-out
    prompts, or every line of a prompt file."""
    if isinstance(tasks, tuple):
        return [ex for task in tasks for ex in heldout(task, n_prompts)]
    return list(tasks)


def _budgets(tokenizer: Any, tasks: tuple[str, ...] | list[Example], examples: list[Example]) -> list[int]:
    """Each example's generation budget in ``model_accuracy``: its family's longest answer plus
    end-of-sequence, or for a prompt file the longest answer in tokens plus one."""
    if isinstance(tasks, tuple):
        return [max_answer_chars(ex.task) + 1 for ex in examples]
    budget = max(len(_answer_ids(tokenizer, ex)) for ex in examples) + 1
    return [budget] * len(examples)


def _answer_ids(tokenizer: Any, example: Example) -> list[int]:
    return tokenizer(example.answer, add_special_tokens=False)["input_ids"]


# --- teacher-forced --------------------------------------------------------------------------------


def teacher_forced_accuracy(
    model: PreTrainedModel,
    tokenizer: Any,
    tasks: tuple[str, ...] | list[Example],
    *,
    n_prompts: int = 100,
    samples: int = 4,
    batch_size: int | None = None,
) -> pd.DataFrame:
    """The accuracy frame from one forward of every prompt followed by its reference answer.

    The judge (:func:`~moescope.models.tasks.score`) accepts a completion whose text, cut at the
    first end-of-sequence, equals the answer but for surrounding whitespace, within the budget
    (the longest answer plus one token). Its answer tokens followed by end-of-sequence are one
    such completion, and the only one where no other token sequence decodes to the answer or to
    it with whitespace around: so for the toy tokenizer (one token per character, no whitespace)

    - ``sampled``: the mean over prompts of P(answer, then end-of-sequence) under temperature-1
      softmax sampling, exactly the sampled accuracy's expectation;
    - ``mixed``: the mean of ``1 - p**samples - (1 - p)**samples``, the expected share of
      prompts whose ``samples`` draws disagree;
    - ``greedy``: whether every one of those tokens is the argmax, exactly greedy's judgement.

    For another tokenizer the two accuracies are lower bounds (``mixed`` an approximation):
    another tokenization of the answer, or whitespace around it, is judged right too and not
    counted. An answer as long as
    the budget needs no end-of-sequence and is scored without one. Generation settings beyond
    temperature 1 (a repetition penalty in the checkpoint's generation config) are not applied.
    A prompt file's rows are greedy only, as ``model_accuracy`` gives them.
    """
    examples = measured_examples(tasks, n_prompts)
    budgets = _budgets(tokenizer, tasks, examples)
    eos = tokenizer.eos_token_id
    prompts = [tokenizer(ex.prompt)["input_ids"] for ex in examples]
    targets = []
    for ex, budget in zip(examples, budgets, strict=True):
        ids = _answer_ids(tokenizer, ex)
        targets.append([*ids, eos] if len(ids) < budget else ids)
    logp, greedy = answer_log_probs(model, prompts, targets, pad=_pad_id(tokenizer), batch_size=batch_size)
    if not isinstance(tasks, tuple):
        marks: dict[str, list[bool]] = {}
        for ex, right in zip(examples, greedy, strict=True):
            marks.setdefault(ex.task, []).append(right)
        return _greedy_frame({task: (len(m), sum(m) / len(m)) for task, m in marks.items()})
    results = []
    for task in tasks:
        rows = [i for i, ex in enumerate(examples) if ex.task == task]
        p = [math.exp(logp[i]) for i in rows]
        mixed = sum(1 - q**samples - (1 - q) ** samples for q in p) / len(p)
        results.append(
            TaskResult(task, len(rows), sum(greedy[i] for i in rows) / len(rows), sum(p) / len(p), mixed)
        )
    return TaskAccuracy(tuple(results), samples, 1.0, 0).to_frame()


def _greedy_frame(accuracy: dict[str, tuple[int, float]]) -> pd.DataFrame:
    """Greedy rows of ``task → (prompts, accuracy)``, as ``model_accuracy`` gives a prompt file's."""
    import pandas as pd

    rows = [(task, GREEDY, acc, math.nan, n) for task, (n, acc) in accuracy.items()]
    return pd.DataFrame(rows, columns=["task", "mode", "accuracy", "mixed", "n"])


def answer_log_probs(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    *,
    pad: int,
    batch_size: int | None = None,
) -> tuple[list[float], list[bool]]:
    """Per row, log P(``targets`` | ``prompts``) at temperature 1 and whether every target token
    is the argmax, from forwards of ``prompt + target[:-1]`` left-padded as ``generate`` pads
    (positions counted from each row's first token), ``batch_size`` rows each: by default as
    many as half the memory beside the largest layer holds (all, unless memory is short), since
    each forward of a layer-sequential model reads it whole.
    """
    n = len(prompts)
    size = batch_size or _rows_per_forward(
        model, n, max(map(len, prompts)) + max(map(len, targets)), max(map(len, targets))
    )
    logp: list[float] = []
    greedy: list[bool] = []
    model_was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, n, size):
                got = _batch_log_probs(model, prompts[i : i + size], targets[i : i + size], pad)
                logp += got[0]
                greedy += got[1]
    finally:
        model.train(model_was_training)
    return logp, greedy


def _rows_per_forward(model: PreTrainedModel, rows: int, width: int, keep: int) -> int:
    """Rows whose activations (:func:`~moescope.explore.sequential.forward_memory_per_row`) and kept
    logits (three float32 copies: logits, their float cast, the log-softmax) take at most
    :data:`~moescope.models.footprint.PASS_MEMORY_SHARE` of the memory beside the largest layer."""
    from moescope.explore.sequential import forward_memory_per_row
    from moescope.models.footprint import rows_beside_layer

    return min(rows, rows_beside_layer(model, forward_memory_per_row(model, seq_len=width, logits=keep)))


def _batch_log_probs(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad: int
) -> tuple[list[float], list[bool]]:
    rows = [list(p) + list(t[:-1]) for p, t in zip(prompts, targets, strict=True)]
    width, keep = max(len(r) for r in rows), max(len(t) for t in targets)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    inputs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}
    accepted = inspect.signature(model.forward).parameters
    if "position_ids" in accepted:  # as generate makes them
        inputs["position_ids"] = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    if "logits_to_keep" in accepted:
        inputs["logits_to_keep"] = keep
    inputs = {k: v.to(model.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    logits = model(**inputs).logits[:, -keep:].float()  # (rows, keep, vocab)
    logp = torch.log_softmax(logits, dim=-1).cpu()
    out_logp, out_greedy = [], []
    for i, target in enumerate(targets):
        own = logp[i, keep - len(target) :]  # (len(target), vocab): the positions predicting the target
        index = torch.tensor(list(target), dtype=torch.long)
        out_logp.append(float(own.gather(1, index[:, None]).sum()))
        out_greedy.append(bool((own.argmax(-1) == index).all()))
    return out_logp, out_greedy


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


# --- batched sampling ------------------------------------------------------------------------------


def batched_sampled_accuracy(
    model: PreTrainedModel,
    tokenizer: Any,
    tasks: tuple[str, ...] | list[Example],
    *,
    n_prompts: int = 100,
    samples: int = 4,
    seed: int = 0,
    batch_size: int | None = None,
) -> pd.DataFrame:
    """The accuracy frame by ``model_accuracy``'s own sampling, all tasks in one ``generate``.

    Greedy: one call over every prompt; sampled: one over every prompt ``samples`` times (pure
    temperature-1 sampling), ``batch_size`` rows a call if given. The budget is the longest
    task's; each row's completion is cut to its own task's budget before it is judged, so the
    judgement is ``model_accuracy``'s. The draws differ (one seeded stream for all tasks, not
    one per task), so the figure agrees with ``model_accuracy``'s within sampling noise. A
    prompt file is judged greedily, every line in one call.
    """
    if not isinstance(tasks, tuple):
        return _greedy_frame(greedy_accuracy(model, tokenizer, tasks, batch_size=batch_size or len(tasks)))
    examples = measured_examples(tasks, n_prompts)
    greedy = _judged(model, tokenizer, examples, batch_size, do_sample=False)
    repeated = [ex for ex in examples for _ in range(samples)]  # a prompt's samples stay adjacent
    devices = [model.device.index or 0] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        right = _judged(
            model, tokenizer, repeated, batch_size, do_sample=True, temperature=1.0, top_k=0, top_p=1.0
        )
    results = []
    for task in tasks:
        rows = [i for i, ex in enumerate(examples) if ex.task == task]
        per_prompt = [sum(right[i * samples : (i + 1) * samples]) for i in rows]
        mixed = sum(0 < c < samples for c in per_prompt) / len(rows)
        g = sum(greedy[i] for i in rows) / len(rows)
        results.append(TaskResult(task, len(rows), g, sum(per_prompt) / (len(rows) * samples), mixed))
    return TaskAccuracy(tuple(results), samples, 1.0, seed).to_frame()


def _judged(
    model: PreTrainedModel, tokenizer: Any, examples: list[Example], batch_size: int | None, **sampling: Any
) -> list[float]:
    """:func:`~moescope.models.tasks.score` of one completion per example, generated in calls of
    ``batch_size`` rows (all by default), each cut to its family's budget."""
    budgets = [max_answer_chars(ex.task) + 1 for ex in examples]
    size = batch_size or len(examples)
    marks: list[float] = []
    model_was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(examples), size):
                chunk, chunk_budgets = examples[i : i + size], budgets[i : i + size]
                prompts = [ex.prompt for ex in chunk]
                new = new_token_ids(model, tokenizer, prompts, max(chunk_budgets), sampling).cpu()
                for ex, row, budget in zip(chunk, new, chunk_budgets, strict=True):
                    marks.append(score(ex, decode_completions(tokenizer, row[None, :budget])[0]))
    finally:
        model.train(model_was_training)
    return marks
