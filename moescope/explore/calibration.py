"""Calibration data for routing statistics: the RL task's own data, the task suite, a text or
JSONL file, or token tensors.

Every source becomes a stream of token-id rows (one document each, split into windows of at
most ``seq_len``), batched with right padding and an attention mask, and cut so that exactly
``n_tokens`` real tokens are produced (fewer only when a finite source runs out). Right padding
leaves the real tokens' outputs of a causal model unchanged, and the mask tells the routing
observer which rows of the flattened ``(B*T, H)`` states to count.

Example
-------
>>> import torch
>>> batch = next(calibration_batches(torch.arange(3, 13).view(2, 5), None, n_tokens=7,
...                                  batch_size=4, seq_len=8))
>>> batch["attention_mask"].sum().item(), batch["input_ids"].shape
(7, torch.Size([2, 5]))
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from moescope._util.io import json_line
from moescope.errors import MoescopeError
from moescope.explore.rl_data import RL, RLCalibration, is_rollouts_file, read_rollouts, sample_rl_calibration
from moescope.models.accuracy import TaskSpec
from moescope.models.tasks import TASK_FAMILIES, make_examples

TASKS = "tasks"
"""The ``data`` value that selects the toy task suite (:mod:`moescope.models.tasks`)."""
SOURCES = (RL, TASKS)
"""The named calibration sources; anything else named is a ``.txt`` / ``.jsonl`` file."""

_TOKENIZE_CHUNK = 256  # texts per tokenizer call: batched calls are much faster than one by one
_RANDOM_ROW = 64  # tokens per row of the random stand-in for the task suite
_FIRST_ID = 3  # below this, ids are special tokens (padding, start, end) in the models moescope reads


def calibration_data(
    model: Any,
    tokenizer: Any,
    source: Any = TASKS,
    *,
    n_tokens: int = 64 * _RANDOM_ROW,
    seed: int = 0,
    prompts: TaskSpec = None,
) -> Any:
    """The data a named source stands for, or ``source`` itself.

    ``"rl"`` becomes the replay's prompts with the model's own sampled completions
    (:func:`~moescope.explore.rl_data.sample_rl_calibration`, ``n_tokens`` of them). The named
    sources are text, and a checkpoint saved without a tokenizer (a test model) cannot read
    them: there they become seeded random token ids, which still route through every expert,
    so the calibration pass, healing and fidelity run on such a model too. Any other source
    passes through unchanged: a text file without a tokenizer is refused by
    :func:`calibration_batches` rather than silently replaced.

    Parameters
    ----------
    model : the model the data is for; its ``config.vocab_size`` bounds the random ids.
    tokenizer : the model's tokenizer, or ``None``.
    source : ``"rl"``, ``"tasks"``, a text or JSONL path, or token ids (see :func:`calibration_batches`).
    n_tokens : tokens of the RL data, or random ids drawn in rows of 64 (rounded up to whole rows).
    seed : seed of the prompts and samples, or of the random ids: the same seed gives the same data.
    prompts : the replay's prompts that ``"rl"`` samples from: the task suite (``None``), some of
        its families, or a ``.jsonl`` prompt file.

    Returns
    -------
    ``source``, an :class:`~moescope.explore.rl_data.RLCalibration`, or a LongTensor
    ``(ceil(n_tokens / 64), 64)`` of ids in ``[3, vocab_size)``.

    Example
    -------
    >>> from moescope.models.zoo import tiny
    >>> calibration_data(tiny("mixtral"), None, "rl", n_tokens=100, seed=0).shape
    torch.Size([2, 64])
    """
    if is_rollouts_file(source) and tokenizer is not None:
        return read_rollouts(source, tokenizer)  # the user's own rollouts: nothing is sampled
    if not _is_named(source):
        return source
    if tokenizer is None:
        rows = max(1, -(-n_tokens // _RANDOM_ROW))
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(_FIRST_ID, model.config.vocab_size, (rows, _RANDOM_ROW), generator=generator)
    if source == RL:
        return sample_rl_calibration(model, tokenizer, n_tokens=n_tokens, seed=seed, prompts=prompts)
    return source


def _is_named(source: Any) -> bool:
    return isinstance(source, str) and source in SOURCES


def check_source(source: Any) -> None:
    """Refuse, in a second and before any model loads, a calibration file that is missing or
    holds no usable text (every line empty or blank); named sources and token ids pass."""
    if not isinstance(source, str | Path) or _is_named(source):
        return
    if not any(text.strip() for text in _file_texts(Path(source))):
        raise _no_text(describe_source(source))


def _no_text(source: str) -> MoescopeError:
    return MoescopeError(f"The calibration data ({source}) holds no text; give at least one non-empty line.")


def check_budget(n_tokens: int, batch_size: int, seq_len: int) -> None:
    """Refuse a non-positive token budget, batch size or sequence length in one sentence."""
    for name, value, example in (
        ("n_tokens", n_tokens, 20_000),
        ("batch_size", batch_size, 16),
        ("seq_len", seq_len, 128),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise MoescopeError(
                f"{name} must be a positive whole number, not {value!r}; pass one such as {example}."
            )


def describe_source(data: Any, seed: int = 0) -> str:
    """One line saying what the calibration data was, stored in :class:`RoutingStats.source`."""
    if isinstance(data, RLCalibration):
        return data.describe()
    if isinstance(data, str) and data == TASKS:
        return f"task suite (seed {seed})"
    if isinstance(data, str | Path):
        return f"file {Path(data).name}"
    rows = len(data) if isinstance(data, list | tuple) or torch.is_tensor(data) else "?"
    return f"token tensors ({rows} rows)"


def calibration_record(data: Any, source: str) -> dict[str, Any]:
    """What a manifest says of calibration data made from ``source``: the RL data's counts, else
    the source and a description of the data."""
    if isinstance(data, RLCalibration):
        return data.record()
    return {"source": source, "data": describe_source(data)}


def calibration_batches(
    data: Any,
    tokenizer: Any,
    *,
    n_tokens: int,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of calibration tokens holding ``n_tokens`` real tokens in all.

    Parameters
    ----------
    data : ``"tasks"`` (prompt + answer of the task suite, families interleaved), a path to a
        ``.jsonl`` file (one object per line with a ``"text"`` field, or ``"prompt"`` and
        ``"answer"``) or to any other text file (one document per non-empty line), or token ids:
        a LongTensor ``(B, T)`` / ``(T,)`` or a list of them, each row one document, taken as is
        (every id counts: strip padding first), or an
        :class:`~moescope.explore.rl_data.RLCalibration` (prompt + completion per row).
    tokenizer : a Hugging Face tokenizer; needed for text sources, unused for token ids.
    n_tokens, batch_size, seq_len : token budget (padding excluded), rows per batch, longest row.
    seed : task-suite seed.

    Returns
    -------
    An iterator of ``{"input_ids": (b, t) int64, "attention_mask": (b, t) int64}``. The input is
    checked before the first batch: a bad budget, a missing file or one without text raises
    :class:`~moescope.errors.MoescopeError` at once.
    """
    check_budget(n_tokens, batch_size, seq_len)
    rows = _windows(_documents(data, tokenizer, seed), seq_len)
    first = next(rows, None)
    if first is None:
        raise _no_text(describe_source(data, seed))
    pad = getattr(tokenizer, "pad_token_id", None) or 0
    return _batches(itertools.chain([first], rows), n_tokens, batch_size, pad)


def _documents(data: Any, tokenizer: Any, seed: int) -> Iterator[list[int]]:
    if isinstance(data, RLCalibration):
        return iter(data.rows())
    if isinstance(data, str) and data == RL:
        raise MoescopeError(
            "calibration 'rl' is sampled from the model, which this pass is not given; make it with "
            "calibration_data(model, tokenizer, 'rl') and pass the result."
        )
    if torch.is_tensor(data) or (isinstance(data, list | tuple) and data and not isinstance(data[0], str)):
        return _tensor_rows(data)
    if isinstance(data, str | Path):
        texts = _task_texts(seed) if data == TASKS else _file_texts(Path(data))
        if tokenizer is None:
            raise MoescopeError(
                "Text calibration data needs a tokenizer; pass the model's own with tokenizer=."
            )
        return _tokenize(texts, tokenizer)
    raise MoescopeError(
        f"Calibration data of type {type(data).__name__} is not understood; pass 'tasks', a .txt/.jsonl "
        "path, or a LongTensor of token ids."
    )


def _tensor_rows(data: Any) -> Iterator[list[int]]:
    tensors = [data] if torch.is_tensor(data) else [torch.as_tensor(d) for d in data]
    for t in tensors:
        if t.is_floating_point() or t.dim() not in (1, 2):
            raise MoescopeError(
                f"Token tensors must hold integer ids of shape (B, T) or (T,), not {t.dtype} "
                f"{tuple(t.shape)}; tokenize the text first."
            )
        yield from (row.tolist() for row in t.reshape(-1, t.shape[-1]) if row.numel())


def _task_texts(seed: int) -> Iterator[str]:
    """``prompt + answer`` of every family in turn, endless (chunks double, so work stays linear)."""
    done, n = 0, 64
    while True:
        drawn = [make_examples(task, n, seed=seed) for task in TASK_FAMILIES]
        for i in range(done, n):
            yield from (examples[i].prompt + examples[i].answer for examples in drawn)
        done, n = n, 2 * n


def _file_texts(path: Path) -> Iterator[str]:
    if not path.is_file():
        raise MoescopeError(f"Calibration file {path} does not exist; check the path, or pass data='tasks'.")
    jsonl = path.suffix.lower() in (".jsonl", ".ndjson")
    return _jsonl_texts(path) if jsonl else _text_lines(path)


def _text_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        yield from (line.strip() for line in f if line.strip())


def _jsonl_texts(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield _record_text(line, f"{path.name}:{number}")


def _record_text(line: str, where: str) -> str:
    record = json_line(line, where)
    if isinstance(record, dict) and isinstance(record.get("text"), str):
        return record["text"]
    prompt = record.get("prompt") if isinstance(record, dict) else None
    for key in ("answer", "completion"):
        answer = record.get(key) if isinstance(record, dict) else None
        if isinstance(prompt, str) and isinstance(answer, str):
            return prompt + answer
    raise MoescopeError(
        f"{where} has no 'text' string (nor 'prompt' with 'answer' or 'completion'); add one to every line."
    )


def _tokenize(texts: Iterable[str], tokenizer: Any) -> Iterator[list[int]]:
    it = iter(texts)
    while chunk := list(itertools.islice(it, _TOKENIZE_CHUNK)):
        yield from tokenizer(chunk)["input_ids"]


def _windows(docs: Iterable[list[int]], seq_len: int) -> Iterator[list[int]]:
    """Documents longer than ``seq_len`` become consecutive windows (no token is dropped)."""
    for doc in docs:
        yield from (doc[i : i + seq_len] for i in range(0, len(doc), seq_len))


def _batches(
    rows: Iterator[list[int]], n_tokens: int, batch_size: int, pad: int
) -> Iterator[dict[str, torch.Tensor]]:
    left = n_tokens
    while left > 0:
        batch = []
        for row in itertools.islice(rows, batch_size):
            batch.append(row[:left])
            left -= len(batch[-1])
            if left == 0:
                break
        if not batch:
            return
        yield _pad_right(batch, pad)


def _pad_right(rows: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def pad_scored(rows: Sequence[tuple[Sequence[int], Sequence[int]]], pad: int) -> dict[str, torch.Tensor]:
    """One right-padded batch of ``(context, scored)`` token rows: ``scored`` marks the second part."""
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask, scored = torch.zeros_like(ids), torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (prompt, answer) in enumerate(rows):
        ids[i, : len(prompt) + len(answer)] = torch.tensor([*prompt, *answer], dtype=torch.long)
        mask[i, : len(prompt) + len(answer)] = 1
        scored[i, len(prompt) : len(prompt) + len(answer)] = True
    return {"input_ids": ids, "attention_mask": mask, "scored": scored}
