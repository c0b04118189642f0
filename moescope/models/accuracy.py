"""Task accuracy of one model: the toy task suite, or a user's prompt set.

The toy suite is scored by :func:`moescope.models.evaluation.evaluate_tasks` (greedy and sampled). A
real model is judged on the user's own prompts instead: JSON Lines, one object per line with a
``"prompt"`` and an ``"answer"`` string and, optionally, a ``"task"`` string that groups lines
into rows (the file's stem otherwise), scored by greedy exact match, surrounding whitespace
aside (:func:`moescope.models.tasks.score`).

Every result is a frame in the form of :meth:`moescope.models.evaluation.TaskAccuracy.to_frame`:
``task, mode, accuracy, mixed, n``.

Example
-------
>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "sums.jsonl"
>>> _ = path.write_text('{"prompt": "1+1=", "answer": "2"}\\n')
>>> load_prompts(path)[0].answer
'2'
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moescope.errors import MoescopeError
from moescope.models.embedded import EMBEDDED, embedded_path
from moescope.models.evaluation import GREEDY, decode_completions, evaluate_tasks
from moescope.models.tasks import TASK_FAMILIES, Example, check_tasks, family_names, score
from moescope.provenance import config_hash

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedModel

TaskSpec = None | str | Path | Sequence[str]
"""``None`` (the task suite for an embedded model, else none), ``"toy"`` (the task suite), family
names (``()``: none; a string ``"add2,add3"`` as well) or a
``.jsonl`` path of prompts and answers."""

_SHAPE = 'one {"prompt": "...", "answer": "..."} object per line'


def load_prompts(path: str | Path) -> list[Example]:
    """Read a prompt set; any malformed line fails with one sentence naming the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise MoescopeError(
            f"Prompt file {path} does not exist; pass a .jsonl file with {_SHAPE}, "
            f"or task families of the suite ({','.join(TASK_FAMILIES)})."
        )
    examples = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                examples.append(_example(line, f"{path.name}:{number}", path.stem))
    if not examples:
        raise MoescopeError(f"Prompt file {path} holds no prompts; write {_SHAPE}.")
    return examples


def _example(line: str, where: str, default_task: str) -> Example:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise MoescopeError(f"{where} is not valid JSON ({err.msg}); write {_SHAPE}.") from None
    if not isinstance(record, dict):
        raise MoescopeError(f"{where} holds a JSON {type(record).__name__}, not an object; write {_SHAPE}.")
    for key in ("prompt", "answer"):
        if not isinstance(record.get(key), str):
            raise MoescopeError(f"{where} has no {key!r} string; write {_SHAPE}.")
    task = record.get("task", default_task)
    if not isinstance(task, str) or not task:
        raise MoescopeError(f"{where} has a 'task' that is not a non-empty string; fix it or leave it out.")
    return Example(task, record["prompt"], record["answer"])


def greedy_accuracy(
    model: Any, tokenizer: Any, examples: Sequence[Example], *, batch_size: int = 32
) -> dict[str, tuple[int, float]]:
    """``task → (prompts, share answered exactly)`` under greedy decoding.

    The budget is the longest answer in tokens plus one for end-of-sequence, so an answer
    that runs on stays wrong.
    """
    answers = [tokenizer(ex.answer, add_special_tokens=False)["input_ids"] for ex in examples]
    budget = max(len(ids) for ids in answers) + 1
    right: dict[str, list[float]] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(examples), batch_size):
                chunk = examples[i : i + batch_size]
                for ex, text in zip(chunk, _complete(model, tokenizer, chunk, budget), strict=True):
                    right.setdefault(ex.task, []).append(score(ex, text))
    finally:
        model.train(was_training)
    return {task: (len(marks), sum(marks) / len(marks)) for task, marks in right.items()}


def _complete(model: Any, tokenizer: Any, examples: Sequence[Example], budget: int) -> list[str]:
    """Greedy completions of left-padded prompts; padded by hand, since many tokenizers have no
    pad token (end-of-sequence stands in, and decoding stops at it anyway)."""
    rows = [tokenizer(ex.prompt)["input_ids"] for ex in examples]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    out = model.generate(
        input_ids=ids.to(model.device),
        attention_mask=mask.to(model.device),
        max_new_tokens=budget,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
    )
    return decode_completions(tokenizer, out[:, width:])


# --- which tasks, and one model's accuracy on them -------------------------------------------------


@cache
def _embedded_hashes() -> frozenset[str]:
    from transformers import AutoConfig

    hashes = set()
    for name in EMBEDDED:
        try:
            path = embedded_path(name)
        except MoescopeError:  # not in this installation, so no model at hand is it
            continue
        hashes.add(config_hash(AutoConfig.from_pretrained(path)))
    return frozenset(hashes)


def is_embedded_model(model: PreTrainedModel) -> bool:
    """True for an embedded model, toy or toy-v3 (by config hash): the task suite is what it was
    trained on."""
    return config_hash(model.config) in _embedded_hashes()


def resolve_tasks(tasks: TaskSpec, original: PreTrainedModel) -> tuple[str, ...] | list[Example] | None:
    """Family names, the examples of a prompt file, or ``None`` for no task; checked before any
    model runs, so a malformed file fails in a second."""
    if tasks is None:
        tasks = "toy" if is_embedded_model(original) else ()
    return check_task_spec(tasks)


def named_families(tasks: TaskSpec) -> TaskSpec:
    """``tasks``, with a string of family names (``"add2,add3"``, as a flag gives it) read as
    those families rather than as a file."""
    names = family_names(tasks) if isinstance(tasks, str) else None
    return names or tasks


def is_prompt_file(source: TaskSpec) -> bool:
    """Whether ``source`` names a prompt file rather than the task suite (``None``, ``"toy"`` or
    family names)."""
    source = named_families(source)
    return isinstance(source, Path) or (isinstance(source, str) and source != "toy")


def check_task_spec(tasks: TaskSpec) -> tuple[str, ...] | list[Example] | None:
    """:func:`resolve_tasks` for a spec that names its tasks (not ``None``), needing no model:
    run before a model loads, a missing or malformed prompt file fails in a second."""
    tasks = named_families(tasks)
    if tasks is None:
        return None
    if is_prompt_file(tasks):
        return load_prompts(tasks)
    if tasks == "toy":
        return TASK_FAMILIES
    return check_tasks(tasks) if len(tasks) else None


def model_accuracy(
    model: PreTrainedModel,
    tokenizer: Any,
    tasks: tuple[str, ...] | list[Example],
    *,
    n_prompts: int = 100,
    samples: int = 4,
    seed: int = 0,
) -> pd.DataFrame:
    """``task, mode, accuracy, mixed, n`` of one model on resolved ``tasks`` (:func:`resolve_tasks`)."""
    import pandas as pd

    if tokenizer is None:
        raise MoescopeError("task accuracy needs the model's tokenizer; pass tokenizer= (or tasks=()).")
    if isinstance(tasks, tuple):
        return evaluate_tasks(model, tokenizer, tasks, n=n_prompts, samples=samples, seed=seed).to_frame()
    rows = [
        (task, GREEDY, acc, math.nan, n)
        for task, (n, acc) in greedy_accuracy(model, tokenizer, tasks).items()
    ]
    return pd.DataFrame(rows, columns=["task", "mode", "accuracy", "mixed", "n"])
