"""Calibration on the RL task's own data: the replay's prompts and the model's own sampled answers.

Which experts a pruned model keeps is decided by the tokens its routing statistics were taken
on (REAP found the calibration domain matters more than the method). The tokens RL trains on
are the replay's prompts followed by the policy's own completions sampled at temperature 1, so
that is what ``calibration="rl"`` routes: the replay's prompt stream
(:func:`moescope.models.prompts.prompt_stream`: the task suite, or the user's prompt file; with
the same seed the calibration prompts are the replay's first prompts), each prompt tokenized as
a rollout tokenizes it, then one completion the model samples for it (pure temperature
sampling, seeded, within the replay's budget of new tokens).

The result, :class:`RLCalibration`, is plain token ids: the routing pass reads its rows as it
reads any token ids, healing scores the completion tokens only (as it scores the answers of task
data) and, given the model, goes on sampling fresh rows of the same stream
(:func:`rl_pairs`), and :meth:`RLCalibration.record` is what the proxy's manifest says of it.

Example
-------
>>> from moescope.models.toy import load_toy
>>> model, tok = load_toy()
>>> data = sample_rl_calibration(model, tok, n_tokens=200, seed=0)
>>> data.n_tokens >= 200 and data.record()["completions"] == len(data.prompts)
True
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from moescope.errors import MoescopeError
from moescope.models.accuracy import TaskSpec, is_prompt_file
from moescope.models.prompts import answer_budget, prompt_stream
from moescope.models.resident import execution_device, read_per_forward

RL = "rl"
"""The ``calibration`` value that selects the replay's prompts plus the model's own completions."""

_BATCH = 128  # prompts per generate call; part of what a seed reproduces
Pair = tuple[tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class RLCalibration:
    """Replay prompts and one sampled completion each, as token ids.

    Attributes
    ----------
    prompts : the prompt token ids, as a rollout tokenizes them (special tokens included).
    completions : the sampled token ids, up to and including end-of-sequence (all
        ``max_new_tokens`` of them when the model never ended).
    seed, temperature, max_new_tokens : how they were sampled.
    source : the prompt source (``None``: the task suite; family names; a prompt file), or the
        rollouts file the rows were read from.
    eos_token_id : the tokenizer's end-of-sequence id, which ends a completion.
    rollouts : the completions were read from the user's rollouts (:func:`read_rollouts`), not
        sampled; healing then trains on these rows again rather than sampling more.
    """

    prompts: tuple[tuple[int, ...], ...]
    completions: tuple[tuple[int, ...], ...]
    seed: int
    temperature: float
    max_new_tokens: int
    source: TaskSpec = None
    eos_token_id: int | None = None
    rollouts: bool = False

    def __len__(self) -> int:
        return len(self.prompts)

    def rows(self) -> list[list[int]]:
        """``prompt + completion`` per prompt: the documents of the routing pass."""
        return [list(p) + list(c) for p, c in zip(self.prompts, self.completions, strict=True)]

    def pairs(self) -> list[Pair]:
        """``(prompt, completion)`` per prompt: healing scores the completion's tokens."""
        return list(zip(self.prompts, self.completions, strict=True))

    @property
    def n_tokens(self) -> int:
        return sum(len(p) + len(c) for p, c in zip(self.prompts, self.completions, strict=True))

    def record(self) -> dict[str, Any]:
        """What the manifest records of the calibration data (JSON values)."""
        completion_tokens = sum(len(c) for c in self.completions)
        ended = sum(bool(c) and c[-1] == self.eos_token_id for c in self.completions)
        if self.rollouts:
            given = {"source": "rollouts", "file": Path(str(self.source)).name, "sampled": False}
            return {**given, "prompts": len(self.prompts), "tokens": self.n_tokens, "truncated": 0}
        return {
            "source": RL,
            "prompt_source": _name(self.source),
            "prompts": len(self.prompts),
            "completions": len(self.completions),
            "tokens": self.n_tokens,
            "prompt_tokens": self.n_tokens - completion_tokens,
            "completion_tokens": completion_tokens,
            "truncated": len(self.completions) - ended,
            "sampled": True,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }

    def describe(self) -> str:
        """One line, as :func:`moescope.explore.calibration.describe_source` names data."""
        if self.rollouts:
            return f"rollouts of {Path(str(self.source)).name} ({len(self)} prompts, {self.n_tokens} tokens)"
        return f"RL prompts + own samples ({len(self)} prompts, {self.n_tokens} tokens, seed {self.seed})"


def sample_rl_calibration(
    model: Any,
    tokenizer: Any,
    *,
    n_tokens: int,
    seed: int = 0,
    prompts: TaskSpec = None,
    temperature: float = 1.0,
) -> RLCalibration:
    """Replay prompts and the model's own completions, until they hold at least ``n_tokens`` tokens.

    Parameters
    ----------
    model, tokenizer : a causal LM and its tokenizer (end-of-sequence defined).
    n_tokens : tokens wanted, prompts and completions together (the calibration budget).
    seed : the prompt stream's seed (the replay's ``seed``) and the sampling seed: the same seed
        gives the same rows.
    prompts : the replay's prompts: the task suite (``None``), some of its families, or a
        ``.jsonl`` prompt file (see :func:`moescope.models.prompts.prompt_stream`).
    temperature : sampling temperature (the replay's default, 1).
    """
    pairs: list[Pair] = []
    total = 0
    group = None
    if read_per_forward(model):  # sample no more chunks at once than the budget can take
        group = min(
            chunks_per_pass(model, answer_budget(prompts)),
            _chunks_at_most(tokenizer, prompts, seed, n_tokens),
        )
    for chunk in _chunks(model, tokenizer, prompts, seed, temperature, first=0, group=group):
        pairs += chunk
        total += sum(len(p) + len(c) for p, c in chunk)
        if total >= n_tokens:  # whole chunks only, so that rl_pairs can go on from here
            break
    return RLCalibration(
        tuple(p for p, _ in pairs),
        tuple(c for _, c in pairs),
        seed,
        temperature,
        answer_budget(prompts),
        prompts,
        tokenizer.eos_token_id,
    )


def _chunks_at_most(tokenizer: Any, source: TaskSpec, seed: int, n_tokens: int) -> int:
    """Chunks that surely reach ``n_tokens``: each pair holds its prompt and at least one
    sampled token (end-of-sequence)."""
    stream, total, count = prompt_stream(source, seed=seed), 0, 0
    while total < n_tokens and (texts := [ex.prompt for ex in itertools.islice(stream, _BATCH)]):
        total += sum(len(row) + 1 for row in tokenizer(texts, add_special_tokens=True)["input_ids"])
        count += 1
    return max(count, 1)


def rl_pairs(data: RLCalibration, model: Any, tokenizer: Any, *, rows: int | None = None) -> Iterator[Pair]:
    """Endless ``(prompt, completion)`` pairs: those of ``data``, then fresh ones sampled from
    ``model`` further along the same stream (healing trains on new rows, never the same again).

    ``rows``: how many rows the caller draws between two pauses (a healing round's), so that
    a model read from disk at every forward samples no more than that at once, where memory
    would hold more (:func:`chunks_per_pass`): toy-v3 under 4 MB sampled 7,936 rows a pass
    for healing rounds of 1,600, and a proxy passing after six rounds left 7,000 of them unused.
    """
    if data.rollouts:  # the user's own rows: no stream to sample further along
        yield from itertools.cycle(data.pairs())
        return
    yield from data.pairs()
    first = len(data) // _BATCH
    group = None
    if rows is not None and read_per_forward(model):
        group = min(chunks_per_pass(model, answer_budget(data.source)), max(1, -(-rows // _BATCH)))
    sampled = _chunks(model, tokenizer, data.source, data.seed, data.temperature, first=first, group=group)
    for chunk in sampled:
        yield from chunk


def read_rollouts(path: str | Path, tokenizer: Any) -> RLCalibration:
    """The user's own rollouts as RL calibration: a ``.jsonl`` of ``{"prompt", "completion"}``
    lines, as a rollout engine dumps them (the completion is the sampled text, without the
    prompt). Prompts are tokenized as a rollout tokenizes them, completions as continuations
    ending in end-of-sequence; nothing is sampled, so the model is not run for them.
    """
    path = Path(path)
    prompts, completions = [], []
    eos = getattr(tokenizer, "eos_token_id", None)
    for prompt, completion in _rollout_texts(path):
        prompts.append(tuple(tokenizer(prompt, add_special_tokens=True)["input_ids"]))
        tail = tokenizer(completion, add_special_tokens=False)["input_ids"]
        completions.append(tuple(tail) + ((eos,) if eos is not None else ()))
    budget = max(len(c) for c in completions)
    return RLCalibration(tuple(prompts), tuple(completions), 0, 1.0, budget, str(path), eos, rollouts=True)


def check_rollouts(path: str | Path) -> None:
    """Read every line of a rollouts file without a tokenizer, so a line without a completion
    (or a file without lines) is one sentence before any model is read."""
    _rollout_texts(Path(path))


def _rollout_texts(path: Path) -> list[tuple[str, str]]:
    """``(prompt, completion)`` of every non-blank line, each refused in one sentence where it
    lacks either string."""
    from moescope._util.io import json_line

    pairs = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            record = json_line(line, f"{path.name}:{number}")
            prompt, completion = (
                record.get(k) if isinstance(record, dict) else None for k in ("prompt", "completion")
            )
            if not isinstance(prompt, str) or not isinstance(completion, str):
                raise MoescopeError(
                    f"{path.name}:{number} has no 'prompt' and 'completion' strings; a rollouts file "
                    'holds one {"prompt", "completion"} object per line.'
                )
            pairs.append((prompt, completion))
    if not pairs:
        raise MoescopeError(f'{path.name} holds no rollouts; write one {{"prompt", "completion"}} per line.')
    return pairs


def is_rollouts_file(source: Any) -> bool:
    """Whether ``source`` names a ``.jsonl`` whose first record has a ``"completion"``."""
    import json

    if not isinstance(source, str | Path) or Path(source).suffix.lower() not in (".jsonl", ".ndjson"):
        return False
    try:
        with Path(source).open(encoding="utf-8", errors="replace") as f:
            first = next((line for line in f if line.strip()), "")
        record = json.loads(first) if first else None
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(record, dict) and "completion" in record


def _chunks(
    model: Any,
    tokenizer: Any,
    source: TaskSpec,
    seed: int,
    temperature: float,
    *,
    first: int,
    group: int | None = None,
) -> Iterator[list[Pair]]:
    """Chunks of :data:`_BATCH` sampled pairs of the prompt stream, from chunk ``first`` on,
    ``group`` chunks to a ``generate`` call (default: one, or as many as memory holds where
    every forward reads the model from disk: :func:`chunks_per_pass`). Each chunk draws with
    its own seed, so grouping changes what is sampled only by the float noise of a larger batch."""
    if tokenizer is None or tokenizer.eos_token_id is None:
        raise MoescopeError(
            "calibration 'rl' samples the model's own answers and needs its tokenizer with an "
            "end-of-sequence token; save the tokenizer with the model, or pass --calibration tasks."
        )
    budget = answer_budget(source)
    group = group or chunks_per_pass(model, budget)
    stream = itertools.islice(prompt_stream(source, seed=seed), first * _BATCH, None)
    for start in itertools.count(first, group):
        texts = [ex.prompt for ex in itertools.islice(stream, _BATCH * group)]
        ids = [tuple(row) for row in tokenizer(texts, add_special_tokens=True)["input_ids"]]
        seeds = [_chunk_seed(seed, start + i) for i in range(-(-len(ids) // _BATCH))]
        sampled = _sample(model, tokenizer, ids, budget, temperature, seeds)
        for i in range(0, len(ids), _BATCH):
            yield list(zip(ids[i : i + _BATCH], sampled[i : i + _BATCH], strict=True))


def chunks_per_pass(model: Any, budget: int, *, prompt_tokens: int = 64, available: int | None = None) -> int:
    """Chunks of prompts sampled in one ``generate``: one for a model in memory (each chunk its
    own call, as a seed has always reproduced), else as many as half the memory beside its
    largest layer holds (each generated token reads every layer from disk once per call)."""
    from moescope.models.footprint import generation_rows

    if not read_per_forward(model):
        return 1
    return max(1, generation_rows(model, prompt_tokens + budget, available=available) // _BATCH)


def _name(source: TaskSpec) -> str | list[str]:
    if is_prompt_file(source):
        return Path(source).name  # type: ignore[arg-type]
    return "task suite" if source is None or isinstance(source, str) or not source else list(source)


def _chunk_seed(seed: int, chunk: int) -> int:
    return zlib.crc32(f"moescope-rl-calibration:{seed}:{chunk}".encode())


def _sample(
    model: Any,
    tokenizer: Any,
    prompts: list[tuple[int, ...]],
    budget: int,
    temperature: float,
    seeds: list[int],
) -> list[tuple[int, ...]]:
    """One completion per prompt (left-padded batch), cut after end-of-sequence; the rows of
    chunk ``i`` (:data:`_BATCH` prompts each) drawn with ``seeds[i]``. One chunk draws from
    the global generator, as it always has; several draw each with its own
    (:class:`_ChunkDraws`), the same draws as one chunk per call."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    device = execution_device(model)
    rows = [torch.tensor(p, dtype=torch.long) for p in prompts]
    ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad, padding_side="left")
    mask = torch.nn.utils.rnn.pad_sequence(
        [torch.ones_like(r) for r in rows], batch_first=True, padding_side="left"
    )
    was_training = model.training
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=devices):  # leaves the caller's stream as is
            torch.manual_seed(seeds[0])
            ids, mask = ids.to(device), mask.to(device)
            if len(seeds) == 1:
                options = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=budget,
                    pad_token_id=pad,
                    eos_token_id=eos,
                    **options,
                )
                new = out[:, ids.shape[1] :]
            else:
                new = _generate_dropping_ended(
                    model, ids, mask, budget, _ChunkDraws(seeds, temperature, len(rows)), pad, eos
                )
    finally:
        model.train(was_training)
    return [_until_eos(row, eos) for row in new.tolist()]


_SEGMENT = 4  # tokens generated between two looks for rows that have ended


def _generate_dropping_ended(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    budget: int,
    draws: _ChunkDraws,
    pad: int,
    eos: int,
) -> torch.Tensor:
    """``(rows, budget)`` new tokens of several chunks sampled together, generated
    :data:`_SEGMENT` tokens at a time: after each segment the rows that have ended leave the
    batch, their key/value cache with them, so each token costs what the rows still sampling
    cost. One ``generate`` ran every row to the budget: each of the toy's chunks of 128 rows
    holds one that runs to it (13 tokens, against 7 on average). The draws do not change: each chunk
    still draws for all its rows (:class:`_ChunkDraws`)."""
    from transformers import LogitsProcessorList

    new = torch.full((ids.shape[0], budget), pad, dtype=ids.dtype, device=ids.device)
    cache, done = None, 0
    while done < budget and len(draws.live):
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            cache=cache,
            max_new_tokens=min(_SEGMENT, budget - done),
            pad_token_id=pad,
            eos_token_id=eos,
            do_sample=False,
            logits_processor=LogitsProcessorList([draws]),
            return_dict_in_generate=True,
        )
        step = out.sequences[:, ids.shape[1] :]
        new[draws.live, done : done + step.shape[1]] = step
        done += step.shape[1]
        going = ~(step == eos).any(dim=1)  # rows ended before this segment have left already
        ids = out.sequences[going]
        mask = torch.cat([mask, mask.new_ones(step.shape)], dim=1)[going]
        cache = out.cache
        if not bool(going.all()):
            _keep_rows(cache, going.nonzero()[:, 0])
        draws.live = draws.live[going.to(draws.live.device)]
    return new


def _keep_rows(cache: Any, rows: torch.Tensor) -> None:
    """Keep ``rows`` of a ``generate`` cache. transformers selects a batch's rows per cache layer
    with ``reorder_cache``, which every layer kind implements (linear attention's states
    included, where ``batch_select_indices`` keeps the keys and values alone); a model's own
    cache class that selects its rows itself (MiniMax's linear-attention cache) is asked instead."""
    from transformers.cache_utils import Cache

    if type(cache).batch_select_indices is not Cache.batch_select_indices:
        cache.batch_select_indices(rows)
    else:
        cache.reorder_cache(rows)


class _ChunkDraws:
    """A logits processor that samples each chunk's rows itself, at ``temperature``, with a
    generator seeded as that chunk alone would seed the global one, and leaves only the drawn
    token possible: greedy decoding then emits it. ``generate`` draws with
    ``multinomial(softmax(scores / T))``, one call per step over the batch, so each chunk's
    draws here are those it would make alone. Rows that have left the batch (``live``: the
    rows still in it, by their index in the first batch) are drawn for all the same, from a
    uniform distribution: a draw of one sample consumes the generator by the shape alone (an
    exponential per entry), so the rows left keep their draws."""

    def __init__(self, seeds: list[int], temperature: float, rows: int) -> None:
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.temperature = temperature
        self.rows = rows
        self.live = torch.arange(rows)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scaled = scores if self.temperature == 1.0 else scores / self.temperature
        probs = torch.softmax(scaled, dim=-1).cpu()
        drawn = torch.empty((len(self.live), 1), dtype=torch.long)
        chunk = self.live // _BATCH  # in order: rows leave the batch, they never move in it
        for i in chunk.unique().tolist():  # a chunk whose rows have all left draws no more
            at = (chunk == i).nonzero()[:, 0]
            first = i * _BATCH
            rows = self.live[at] - first
            every = probs.new_full((min(_BATCH, self.rows - first), probs.shape[1]), 1.0 / probs.shape[1])
            every[rows] = probs[at]
            drawn[at] = torch.multinomial(every, 1, generator=self.generators[i])[rows]
        return torch.full_like(scores, -torch.inf).scatter_(1, drawn.to(scores.device), 0.0)


def _until_eos(row: list[int], eos: int) -> tuple[int, ...]:
    return tuple(row[: row.index(eos) + 1]) if eos in row else tuple(row)
