"""Offline distillation: the original's next-token distributions on the healing batches, computed once.

Healing (:mod:`moescope.export.healing`) minimises ``KL(original ‖ proxy)`` at the scored
positions of every batch. A checkpoint larger than memory runs a decoder layer at a time
(:func:`~moescope.explore.sequential.layer_sequential`), and each of its forwards reads every layer
from the shards again: as the teacher of every step it would read the checkpoint once a step. A
:class:`TeacherCache` holds instead, for a finite list of healing batches fixed in advance, the
original's top-``k`` next-token log-probabilities and their token ids at every scored position,
with the log of the probability left outside them (the *rest*). It is computed in as few
forwards as memory allows (the batches' rows packed into forwards of as many rows as half the
memory beside a layer holds, the LM head run on the scored positions alone) and saved with
safetensors beside its provenance (the model's config hash, ``k``, the batches' digest), so a
cache made of another model, another ``k`` or other batches is refused. An export healing in
rounds toward a capability target computes it a round of batches at a time, as healing reaches
them (:class:`TeacherRounds`): one read per round, and no forward on batches it never trains on.

The loss against a cache (:func:`distillation_loss`) is the KL of the two distributions
coarsened to ``k + 1`` outcomes, the teacher's top-``k`` tokens and the rest: the full KL when
``k`` covers the vocabulary, and otherwise a lower bound of it that still asks the proxy to leave
the teacher's tail mass outside the top ``k``. Renormalising the top ``k`` instead, or dropping
the tail, pushes the proxy to put all its mass on them. ``bench/teacher_tail.py`` heals the toys
60 steps against their top 1, 2 and 4 of 44 tokens (toy: top 1, rest against renormalised only):
the rest bucket's held-out KL after was the nearest to healing against the full teacher, or
tied, in three of the four comparisons (toy-v3, top 2: 0.1072 against 0.1046, renormalised
0.1075, dropped 0.1084; toy, top 1: 0.1765 against 0.1782, renormalised 0.1931), the toys' top
two tokens holding nearly all the mass.

Example
-------
>>> from moescope.models.toy import load_toy
>>> from moescope.export.healing import healing_batches
>>> model, tok = load_toy()
>>> batches = healing_batches("tasks", tok, steps=2, batch_size=4)
>>> cache = build_teacher_cache(model, batches, k=8)
>>> len(cache), cache.log_probs.shape[1], cache.forwards
(2, 8, 1)
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moescope._util.io import write_atomic
from moescope.errors import MoescopeError
from moescope.export.fidelity.agreement import Batch, evaluating, kl_loss, scored_log_probs
from moescope.models.resident import execution_device
from moescope.models.row_chunks import real_lengths, trailing_padding
from moescope.provenance import config_hash

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "TOP_K",
    "TeacherCache",
    "TeacherRounds",
    "build_teacher_cache",
    "distillation_loss",
    "teacher_cache",
]

TOP_K = 64
"""Next tokens kept per scored position unless told otherwise: 8 bytes each on disk, so a
152k-token vocabulary is cached at 1/2,400 of its size; a model's next-token mass rarely spreads
over more."""

FORMAT = "moescope.teacher_cache/1"
_FIELDS = ("input_ids", "attention_mask", "scored")
_CACHED = ("log_probs", "token_ids", "log_rest")


@dataclass(frozen=True, eq=False)
class TeacherCache:
    """The original's top-``k`` next-token distributions at the scored positions of fixed batches.

    Attributes
    ----------
    batches : the healing batches, in order, as :func:`~moescope.export.healing.healing_batches`
        draws them (``input_ids``, ``attention_mask``, ``scored``, each ``(B, T)``).
    log_probs : ``(N, min(k, V))`` float32: at each of the N scored positions of every batch in
        turn (row-major within a batch), the original's largest next-token log-probabilities,
        descending.
    token_ids : ``(N, min(k, V))`` int64: their tokens.
    log_rest : ``(N,)`` float32: the log of the probability of every other token (``-inf`` when
        ``k`` covers the vocabulary ``V``).
    offsets : ``(len(batches) + 1,)`` int64: batch ``i``'s positions are ``offsets[i]:offsets[i+1]``.
    config_hash : the original's :func:`~moescope.provenance.config_hash`.
    k : the top-``k`` asked for.
    forwards : how many forwards of the original computed it (each reads every layer once).
    """

    batches: tuple[Batch, ...]
    log_probs: torch.Tensor
    token_ids: torch.Tensor
    log_rest: torch.Tensor
    offsets: torch.Tensor
    config_hash: str
    k: int
    forwards: int
    _index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {batch_key(b): i for i, b in enumerate(self.batches)})

    def __len__(self) -> int:
        return len(self.batches)

    def __contains__(self, batch: object) -> bool:
        return isinstance(batch, dict) and batch_key(batch) in self._index

    @property
    def digest(self) -> str:
        """:func:`batches_digest` of the cached batches."""
        return _digest(self._index)

    def teacher(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_probs, token_ids, log_rest)`` of ``batch``'s scored positions, as cached."""
        i = self._index.get(batch_key(batch))
        if i is None:
            raise MoescopeError(
                "this batch is not in the teacher cache; heal on the cache's own batches "
                "(cache.batches), or build the cache from the batches healing draws (healing_batches)."
            )
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.log_probs[lo:hi], self.token_ids[lo:hi], self.log_rest[lo:hi]

    def check(
        self, *, config: Any = None, batches: Sequence[Batch] | None = None, k: int | None = None
    ) -> None:
        """Refuse this cache unless it was made of ``config``'s model, ``batches`` and ``k``
        (each checked when given; ``config`` a model config or its hash)."""
        if config is not None and not isinstance(config, str):
            config = config_hash(config)
        expected = {
            "config hash": config,
            "batches digest": None if batches is None else batches_digest(batches),
            "k": k,
        }
        held = {"config hash": self.config_hash, "batches digest": self.digest, "k": self.k}
        for name, value in expected.items():
            if value is not None and value != held[name]:
                raise MoescopeError(
                    f"the teacher cache was made with {name} {held[name]}, not {value}: it belongs to "
                    "another model, other batches or another k; build it again (build_teacher_cache)."
                )

    def save(self, path: str | Path) -> Path:
        """Write the cache to ``path`` (safetensors, provenance in its metadata), atomically."""
        from safetensors.torch import save

        tensors = {
            "log_probs": self.log_probs,
            "token_ids": self.token_ids.to(torch.int32),  # half the bytes; every vocabulary fits
            "log_rest": self.log_rest,
            "offsets": self.offsets,
            "batch.shapes": torch.tensor([list(b["input_ids"].shape) for b in self.batches]),
        }
        for name in _FIELDS:
            tensors[f"batch.{name}"] = torch.cat([b[name].flatten() for b in self.batches])
        metadata = {
            "format": FORMAT,
            "config_hash": self.config_hash,
            "k": str(self.k),
            "digest": self.digest,
            "forwards": str(self.forwards),
        }
        return write_atomic(path, save({n: t.contiguous() for n, t in tensors.items()}, metadata=metadata))

    @classmethod
    def load(cls, path: str | Path, **expected: Any) -> TeacherCache:
        """The cache saved at ``path``, checked against ``expected`` (:meth:`check`'s ``config``,
        ``batches``, ``k``); a file changed since it was written is refused too."""
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        if metadata.get("format") != FORMAT:
            raise MoescopeError(f"{path} is no moescope teacher cache; build one with build_teacher_cache.")
        cache = cls(
            batches=tuple(_split_batches(tensors)),
            log_probs=tensors["log_probs"],
            token_ids=tensors["token_ids"].long(),
            log_rest=tensors["log_rest"],
            offsets=tensors["offsets"],
            config_hash=metadata["config_hash"],
            k=int(metadata["k"]),
            forwards=int(metadata["forwards"]),
        )
        if cache.digest != metadata["digest"]:
            raise MoescopeError(f"{path}'s batches do not match its recorded digest; build the cache again.")
        cache.check(**expected)
        return cache


def _split_batches(tensors: dict[str, torch.Tensor]) -> Iterator[Batch]:
    """The saved batches, cut back from their flattened concatenations."""
    shapes = tensors["batch.shapes"].tolist()
    sizes = [rows * width for rows, width in shapes]
    parts = {name: tensors[f"batch.{name}"].split(sizes) for name in _FIELDS}
    for i, shape in enumerate(shapes):
        yield {name: parts[name][i].reshape(shape) for name in _FIELDS}


# --- identity of batches ---------------------------------------------------------------------------


def batch_key(batch: Batch) -> str:
    """SHA-256 of a batch's tensors (names, dtypes, shapes and values)."""
    digest = hashlib.sha256()
    for name, tensor in _complete(batch).items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def _complete(batch: Batch) -> Batch:
    """The batch's :data:`_FIELDS`; every real token scored where it does not say (calibration text)."""
    scored = batch.get("scored", batch["attention_mask"].bool())
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "scored": scored}


def batches_digest(batches: Iterable[Batch]) -> str:
    """SHA-256 of the batches' :func:`batch_key` in order: which batches, and in what order."""
    return _digest(batch_key(b) for b in batches)


def _digest(keys: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()


# --- computing it ----------------------------------------------------------------------------------


def teacher_cache(
    original: PreTrainedModel, batches: Sequence[Batch], path: str | Path, *, k: int = TOP_K, **options: Any
) -> TeacherCache:
    """The cache at ``path`` when it was made of ``original``'s config, ``batches`` and ``k``;
    else :func:`build_teacher_cache` (``options``: its ``rows``, ``available``), saved there."""
    if Path(path).is_file():
        try:
            return TeacherCache.load(path, config=original.config, batches=batches, k=k)
        except MoescopeError:
            pass  # stale or damaged: made again below, and replaced
    cache = build_teacher_cache(original, batches, k=k, **options)
    cache.save(path)
    return cache


def build_teacher_cache(
    original: PreTrainedModel,
    batches: Iterable[Batch],
    *,
    k: int = TOP_K,
    rows: int | None = None,
    available: int | None = None,
) -> TeacherCache:
    """The top-``k`` next-token distributions of ``original`` (in memory or layer-sequential) at
    the scored positions of ``batches``, computed in forwards of ``rows`` rows taken across the
    batches in order (default :func:`forward_rows` of ``available`` bytes, default what is free)."""
    batches = tuple(_complete(b) for b in batches)
    if not batches or k < 1:
        raise MoescopeError("a teacher cache needs at least one batch and k ≥ 1.")
    width = max(b["input_ids"].shape[1] for b in batches)
    rows = rows or forward_rows(original, width, available=available)
    top, forwards = [], 0
    with evaluating(original):
        for chunk in _chunks(_rows(batches), rows):
            top.append(_top_k(original, chunk, k))
            forwards += 1
    log_probs, token_ids, log_rest = (torch.cat(parts) for parts in zip(*top, strict=True))
    counts = [int(_next_scored(b).sum()) for b in batches]
    offsets = torch.tensor([0, *itertools.accumulate(counts)])
    return TeacherCache(
        batches, log_probs, token_ids, log_rest, offsets, config_hash(original.config), k, forwards
    )


def forward_rows(model: PreTrainedModel, width: int, *, available: int | None = None) -> int:
    """Rows of ``width`` tokens per forward: as many as half the memory beside the largest
    decoder layer holds, counting a forward's activations (a row's hidden states where the
    layers run rows in chunks, :mod:`moescope.models.row_chunks`) and its logits at every position."""
    from moescope.explore.sequential import forward_memory_per_row
    from moescope.models.footprint import rows_beside_layer

    per_row = forward_memory_per_row(model, seq_len=width, logits=width)
    return rows_beside_layer(model, per_row, available=available)


class TeacherRounds:
    """The original's teacher distributions on the healing batches, computed a round of batches
    at a time when healing first reaches them, in as few forwards as memory allows each.

    A capability-targeted export heals in rounds until the proxy passes, often well short of
    its budget; computed at once for the whole budget, the cache ran the original on every
    batch the budget draws (and sampled the completions of RL data for all of them): toy-v3 at
    1/4 passes after 300 of its 400 steps, a quarter of that work spent on batches never
    trained on, and a proxy that passes after one round left seven eighths. Here healing draws its
    batches from :meth:`__iter__`, and :meth:`teacher` computes the next ``size`` batches'
    distributions the first time it meets one it lacks, one read per round where each forward
    reads the checkpoint: the original runs on the batches an in-memory export runs it on.
    """

    def __init__(
        self, original: PreTrainedModel, batches: Iterable[Batch], *, steps: int, size: int, k: int = TOP_K
    ) -> None:
        self.original, self.size, self.k = original, max(1, size), k
        self._stream = itertools.islice(batches, steps)  # the budget's batches, drawn as needed
        self._drawn: list[Batch] = []
        self.cache: TeacherCache | None = None

    def __iter__(self) -> Iterator[Batch]:
        """The healing batches in order, the same each time, drawn from the stream when first reached."""
        for i in itertools.count():
            if i == len(self._drawn) and (batch := next(self._stream, None)) is not None:
                self._drawn.append(batch)
            if i == len(self._drawn):
                return
            yield self._drawn[i]

    def teacher(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`TeacherCache.teacher`, the next round computed first where ``batch`` is not in it."""
        done = len(self.cache) if self.cache is not None else 0
        if self.cache is None or batch not in self.cache:
            self.upto(done + self.size)
        assert self.cache is not None
        return self.cache.teacher(batch)

    def upto(self, steps: int) -> TeacherCache:
        """The cache of the first ``steps`` batches at least (fewer where the stream ends), the
        ones it lacks computed together."""
        done = len(self.cache) if self.cache is not None else 0
        wanted = list(itertools.islice(iter(self), steps))[done:]
        if wanted:
            part = build_teacher_cache(self.original, wanted, k=self.k)
            self.cache = part if self.cache is None else _joined(self.cache, part)
        if self.cache is None:
            raise MoescopeError("a teacher cache needs at least one batch and k ≥ 1.")
        return self.cache


def _joined(first: TeacherCache, then: TeacherCache) -> TeacherCache:
    """One cache of ``first``'s batches followed by ``then``'s."""
    offsets = torch.cat([first.offsets, then.offsets[1:] + first.offsets[-1]])
    tensors = (torch.cat([getattr(first, name), getattr(then, name)]) for name in _CACHED)
    batches, forwards = first.batches + then.batches, first.forwards + then.forwards
    return TeacherCache(batches, *tensors, offsets, first.config_hash, first.k, forwards)


Row = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _rows(batches: Iterable[Batch]) -> Iterator[Row]:
    """Every row of every batch in turn: ``(input_ids, attention_mask, next_scored)``."""
    for batch in batches:
        yield from zip(batch["input_ids"], batch["attention_mask"], _next_scored(batch), strict=True)


def _next_scored(batch: Batch) -> torch.Tensor:
    """``(B, T)``: the positions whose next token is scored (the last never is)."""
    scored = batch["scored"].bool()
    return torch.cat([scored[:, 1:], torch.zeros_like(scored[:, :1])], dim=1)


def _chunks(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


def _top_k(model: PreTrainedModel, rows: list[Row], k: int) -> tuple[torch.Tensor, ...]:
    """``(log_probs, token_ids, log_rest)`` at the scored positions of ``rows``, in one forward:
    the rows right-padded to the longest (causal attention: a real token never sees the padding),
    longest first, so that a layer-sequential model's chunks run on their rows' real positions
    alone (:func:`~moescope.models.row_chunks.trailing_padding`); the results in ``rows``' order."""
    width = max(ids.shape[0] for ids, _, _ in rows)
    ids, mask, keep = (
        torch.stack([torch.nn.functional.pad(row[i], (0, width - row[i].shape[0])) for row in rows])
        for i in range(3)
    )
    lengths = real_lengths(mask)
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])
    ids, mask, keep = ids[order], mask[order], keep[order]
    with trailing_padding([lengths[j] for j in order]):
        logits = _head_at(model, {"input_ids": ids, "attention_mask": mask}, keep)
    log_p = torch.log_softmax(logits.float(), -1)
    top, token_ids = log_p.topk(min(k, log_p.shape[-1]), dim=-1)
    log_rest = torch.logsumexp(log_p.scatter(-1, token_ids, -torch.inf), dim=-1)
    # the scored positions, row-major in the sorted rows, put in the order of the rows' own
    row, column = keep.nonzero(as_tuple=True)
    back = torch.argsort(torch.tensor(order)[row] * width + column)
    return top.cpu()[back], token_ids.cpu()[back], log_rest.cpu()[back]


def _head_at(model: PreTrainedModel, inputs: Batch, keep: torch.Tensor) -> torch.Tensor:
    """``(N, V)`` logits at the ``keep`` positions alone: the LM head sees only their hidden
    states (whatever the model does to its logits after the head still applies)."""
    device = execution_device(model)
    head = model.get_output_embeddings()

    def gather(_: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        return (hidden[keep.to(hidden.device)].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        inputs = {name: tensor.to(device) for name, tensor in inputs.items()}
        return model(**inputs, use_cache=False).logits[0]
    finally:
        handle.remove()


# --- the loss --------------------------------------------------------------------------------------


def distillation_loss(
    teacher: PreTrainedModel | TeacherCache | TeacherRounds,
    proxy: PreTrainedModel,
    batch: Batch,
    part: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Mean next-token ``KL(teacher ‖ proxy)`` over the batch's scored positions, gradients
    through the proxy only: :func:`~moescope.export.fidelity.agreement.kl_loss` against a model,
    the coarsened KL (top ``k`` and the rest) against a cache (or its :class:`TeacherRounds`).

    ``part=(rank, world)``: this process's contiguous share of the batch's rows, its KL summed
    and divided by the scored positions of the *whole* batch (a cache only), so the losses of
    all processes add up to the whole batch's and sharded gradients summed over processes are
    the one-process gradient."""
    if isinstance(teacher, torch.nn.Module):
        if part is not None:
            raise MoescopeError("a batch is split over processes only against a teacher cache.")
        return kl_loss(teacher, proxy, batch)
    log_p, token_ids, log_rest = teacher.teacher(batch)
    if part is None:
        log_q = scored_log_probs(proxy, batch).to(log_p.device)
        return coarse_kl(log_p, token_ids, log_rest, log_q).mean()
    rows, positions = row_share(batch, *part)
    share = {name: tensor[rows] for name, tensor in batch.items()}
    log_q = scored_log_probs(proxy, share).to(log_p.device)
    kl = coarse_kl(log_p[positions], token_ids[positions], log_rest[positions], log_q)
    return kl.sum() / max(len(log_p), 1)


def row_share(batch: Batch, rank: int, world: int) -> tuple[slice, slice]:
    """Process ``rank``'s contiguous rows of ``batch`` out of ``world``, and the slice of the
    batch's scored positions (row-major, as cached) they hold. The rows must split evenly."""
    n = batch["input_ids"].shape[0]
    if n % world:
        raise MoescopeError(
            f"a batch of {n} rows does not split evenly over {world} processes; "
            f"use a batch size that is a multiple of {world}."
        )
    lo, hi = rank * n // world, (rank + 1) * n // world
    per_row = _next_scored(batch).sum(1)
    start, stop = int(per_row[:lo].sum()), int(per_row[:hi].sum())
    return slice(lo, hi), slice(start, stop)


def coarse_kl(
    log_p: torch.Tensor, token_ids: torch.Tensor, log_rest: torch.Tensor, log_q: torch.Tensor
) -> torch.Tensor:
    """``(N,)`` ``KL(p ‖ q)`` over ``k + 1`` outcomes: the teacher's top-``k`` tokens
    (``log_p``, ``token_ids``: ``(N, k)``) and all others (``log_rest``: ``(N,)``), against the
    proxy's full ``(N, V)`` log-probabilities ``log_q``."""
    top = (log_p.exp() * (log_p - log_q.gather(-1, token_ids))).sum(-1)
    # A finite fill, not -inf: with nothing outside the top k the logsumexp's gradient stays finite.
    outside = torch.logsumexp(log_q.scatter(-1, token_ids, torch.finfo(log_q.dtype).min), dim=-1)
    p_rest = log_rest.exp()
    return top + torch.xlogy(p_rest, p_rest) - p_rest * outside
