"""The weight view of one MoE layer from its stored bytes, sketched where the bytes lie.

:class:`LayerRead` maps a layer's expert tensors (router rows and biases included) from their
shards: sketching reads them straight from the kernel's page cache, which a readahead keeps
filled ahead of the pass, so no byte is copied into the process first. Each mapped tensor takes
its size from a :class:`MemoryBudget` of one layer, and gives it back when released, which drops
its pages from the process's resident memory. The experts module is stood in for by the stored
tensors — fused ones as they are, per-expert keys joined on access — so
:meth:`~moescope.models.view.MoELayer.expert` reads every layout (GPT-OSS's transposed, interleaved one
included) exactly as on the loaded model, and the vectors equal ``embed_experts(model, "weights")``.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from moescope._util.threads import usable_cores
from moescope.explore.embeddings import _Projector, weight_vectors
from moescope.export.streaming.shards import StoredTensor, _corrupt

if TYPE_CHECKING:
    from moescope.export.streaming.checkpoint import Checkpoint


class MemoryBudget:
    """Bytes of mapped expert tensors the pass may hold resident at once (one layer's worth).

    A layer's tensors take their size here as they are mapped, waiting while the budget is
    spent; they give it back when released (a dropped expert at once, a kept one once written),
    so the next layer is sketched while the last one is written without the process ever holding
    more than one layer. A single tensor larger than the budget is still let in when nothing
    else is held.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.total = limit, 0
        self._changed = threading.Condition()
        self._closed = False

    def take(self, size: int) -> None:
        with self._changed:
            while not self._closed and self.total and self.total + size > self.limit:
                self._changed.wait()
            if self._closed:
                raise RuntimeError("the pass stopped")
            self.total += size

    def give(self, size: int) -> None:
        with self._changed:
            self.total -= size
            self._changed.notify_all()

    def close(self) -> None:
        """Wake every waiting take with an error: the pass is over."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class ShardSpan:
    """A byte span of one shard, mapped read-only: a layer's tensors in that file.

    One mapping per layer and shard, not per tensor: each mapping holds a file descriptor
    until it goes, and a layer can have thousands of per-expert tensors (more than the usual
    limit of 1,024 open files). The shard's size is checked first: reading past the end of a
    mapped file kills the process instead of raising. The mapping goes when the last view of it
    does.
    """

    def __init__(self, file: Path, start: int, end: int, name: str) -> None:
        self.base = start - start % mmap.ALLOCATIONGRANULARITY
        with open(file, "rb") as handle:
            if os.fstat(handle.fileno()).st_size < end:
                raise _corrupt(file, f"it ended inside {name}")
            # a private mapping is writable, so torch views it without a warning; nothing writes
            self._map = mmap.mmap(handle.fileno(), end - self.base, offset=self.base, access=mmap.ACCESS_COPY)
        _advise(self._map, "MADV_SEQUENTIAL")

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The bytes at ``offset`` (a position in the file), where they lie."""
        return memoryview(self._map)[offset - self.base : offset - self.base + nbytes]

    def drop(self, offset: int, nbytes: int) -> None:
        """Take these bytes' pages out of the process (the kernel keeps its cache). Pages shared
        with a neighbour still in use go too; nothing is written here, so touching them again
        only maps them back in from the file."""
        first = (offset - self.base) // mmap.PAGESIZE * mmap.PAGESIZE
        if nbytes:
            _advise(self._map, "MADV_DONTNEED", first, offset - self.base + nbytes - first)


class MappedTensor:
    """A stored tensor's bytes in a :class:`ShardSpan`, holding its size of the budget.

    ``view`` reads them from the page cache where they lie; :meth:`release` drops their pages
    from the process and returns their size to the budget.
    """

    def __init__(self, tensor: StoredTensor, span: ShardSpan, budget: MemoryBudget) -> None:
        self.stored, self.span, self._budget = tensor, span, budget
        budget.take(tensor.nbytes)
        self.view = span.view(tensor.offset, tensor.nbytes)
        self._released = False

    def tensor(self) -> torch.Tensor:
        return torch.frombuffer(self.view, dtype=self.stored.torch_dtype).view(self.stored.shape)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.span.drop(self.stored.offset, self.stored.nbytes)
            self._budget.give(self.stored.nbytes)


def _advise(mapped: mmap.mmap, advice: str, *where: int) -> None:
    """``madvise`` where the platform has it (Linux, macOS). Without ``MADV_DONTNEED`` a
    released tensor's pages stay resident until its mapping goes, with the layer."""
    if hasattr(mmap, advice) and hasattr(mapped, "madvise"):
        mapped.madvise(getattr(mmap, advice), *where)


class LayerRead:
    """One MoE layer's expert tensors, each mapped on first use (:class:`MappedTensor`)."""

    def __init__(self, checkpoint: Checkpoint, layer: int, budget: MemoryBudget) -> None:
        self.tensors = [checkpoint.by_key[key] for key in checkpoint.layer_keys[layer]]
        self.stored = {t.key: t for t in self.tensors}
        self.budget = budget
        self.mapped: dict[str, MappedTensor] = {}
        self._spans: dict[Path, ShardSpan] = {}
        self._mapping = threading.Lock()  # experts are sketched on several threads

    def tensor(self, key: str) -> torch.Tensor:
        """``key``'s stored tensor, viewed where its bytes lie."""
        return self._map(key).tensor()

    def _map(self, key: str) -> MappedTensor:
        """Mapped once, whichever thread asks first: a second mapping would take the budget twice."""
        with self._mapping:
            if key not in self.mapped:
                stored = self.stored[key]
                self.mapped[key] = MappedTensor(stored, self._span(stored.file), self.budget)
            return self.mapped[key]

    def _span(self, file: Path) -> ShardSpan:
        """The mapping of this layer's tensors in ``file``, made on first use."""
        if file not in self._spans:
            tensors = [t for t in self.tensors if t.file == file]
            last = max(tensors, key=lambda t: t.offset + t.nbytes)
            start = min(t.offset for t in tensors)
            self._spans[file] = ShardSpan(file, start, last.offset + last.nbytes, last.key)
        return self._spans[file]

    def join(self) -> dict[str, MappedTensor]:
        """Every tensor of the layer, mapped (those sketching did not touch too)."""
        for tensor in self.tensors:
            self._map(tensor.key)
        return self.mapped

    def release(self) -> None:
        """Drop every tensor mapped so far from resident memory."""
        for mapped in self.mapped.values():
            mapped.release()


def layer_vectors(checkpoint: Checkpoint, layer: int, read: LayerRead, projector: _Projector) -> np.ndarray:
    """``(E, dim)`` weight-view vectors of one layer, as :func:`~moescope.explore.embeddings.embed_experts`
    computes them, from the layer's mapped tensors.

    The experts are sketched on every core the process may use, one BLAS thread each, the
    extra threads at a lower priority than the readahead and the writer (see
    :func:`~moescope._util.threads.map_on_cores`): where the CPU has no bfloat16 products the
    upcast sketch costs about as much CPU as the kernel spends reading the layer, and on one
    core it held the pass up (2.0× the read floor on a 2-core AVX2 EPYC, against 1.5× now:
    bench/export.py). Each expert's sketch does not depend on the thread that computes it, so
    the vectors are those of one thread.
    """
    original = checkpoint.moe.layer(layer)
    experts = SimpleNamespace(**_expert_params(checkpoint, layer, read))
    if original.spec.expert_params:  # DBRX's tensors live on experts.mlp
        experts = SimpleNamespace(**{original.spec.expert_params: experts})
    router = original.spec.router.split(".")[0]  # its rows give the expert count (meta device)
    block = {original.spec.experts: experts, router: getattr(original.block, router)}
    view = replace(original, block=SimpleNamespace(**block))
    return weight_vectors(view, projector, workers=usable_cores())


def _expert_params(checkpoint: Checkpoint, layer: int, read: LayerRead) -> dict[str, Any]:
    """Experts-module parameter name → its rows by expert (:class:`_Rows` or :class:`_Stacked`)."""
    params: dict[str, Any] = {}
    pieces: dict[str, dict[tuple[int, int], str]] = defaultdict(dict)
    for tensor in read.tensors:
        entry = checkpoint.experts[tensor.key]
        if entry.param is None:
            continue
        if entry.expert is None:
            params[entry.param] = (_Interleaved if entry.interleaved else _Rows)(tensor, read)
        else:
            pieces[entry.param][entry.expert, entry.part] = tensor.key
    params.update({name: _Stacked(parts, read) for name, parts in pieces.items()})
    return params


class _Rows:
    """A fused tensor: ``rows[i]`` is expert ``i``'s row."""

    def __init__(self, stored: StoredTensor, read: LayerRead) -> None:
        self.key, self.read = stored.key, read

    def __getitem__(self, expert: int) -> torch.Tensor:
        return self.read.tensor(self.key)[expert]

    def unflatten(self, dim: int, sizes: tuple[int, ...]) -> torch.Tensor:
        """The tensor with ``dim`` split (DBRX's ``[E·I, H]`` read as ``[E, I, H]``)."""
        return self.read.tensor(self.key).unflatten(dim, sizes)


class _Interleaved(_Rows):
    """A fused gate/up tensor stored with each expert's gate and up rows interleaved (Inkling 2's
    ``w13_weight``): ``rows[i]`` is expert ``i``'s gate rows then up rows, as loading reorders
    them, given as a :class:`_Joined` of the two strided halves (copied only if used whole)."""

    def __getitem__(self, expert: int) -> _Joined:
        rows = super().__getitem__(expert)
        return _Joined([rows[0::2], rows[1::2]], torch.cat)


class _Stacked:
    """Per-expert tensors read as the fused parameter: ``stacked[i]`` is expert ``i``'s parts
    concatenated, as transformers' ``MergeModulelist`` + ``Concatenate`` would store it (a
    :class:`_Joined`, which copies them only when it must)."""

    def __init__(self, parts: dict[tuple[int, int], str], read: LayerRead) -> None:
        self.parts, self.read = parts, read
        self.count = 1 + max(part for _, part in parts)
        self._local = threading.local()  # one block per sketching thread

    def __getitem__(self, expert: int) -> torch.Tensor | _Joined:
        pieces = [self.read.tensor(self.parts[expert, part]) for part in range(self.count)]
        return pieces[0] if self.count == 1 else _Joined(pieces, self._join)

    def _join(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """The pieces concatenated into one block reused for every expert this thread sketches
        (fresh memory per expert meant its page faults every time)."""
        joined = getattr(self._local, "joined", None)
        if joined is None:
            joined = self._local.joined = torch.empty(0, dtype=pieces[0].dtype)  # sized by the first cat
        return torch.cat(pieces, out=joined)


class _Joined:
    """Tensors standing for their concatenation along the first axis, joined only when used.

    :meth:`~moescope.models.view.MoELayer.expert` splits a fused gate/up straight back into its halves
    (``chunk(2, dim=0)``), which here returns the stored parts themselves: joining them first
    copied every expert's gate and up, as long as sketching them took. Any other use joins them
    with ``join``, into a block :class:`_Stacked` reuses for every expert a thread sketches
    (``stacked[i]`` is then valid until that thread's next one; it is done with ``i`` by then).
    """

    def __init__(
        self, pieces: list[torch.Tensor], join: Callable[[list[torch.Tensor]], torch.Tensor]
    ) -> None:
        self.pieces, self.join = pieces, join

    def chunk(self, chunks: int, dim: int = 0) -> tuple[torch.Tensor, ...]:
        if dim == 0 and chunks == len(self.pieces) and len({p.shape for p in self.pieces}) == 1:
            return tuple(self.pieces)
        return self.joined().chunk(chunks, dim)

    def joined(self) -> torch.Tensor:
        return self.join(self.pieces)

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.joined()[index]

    def __getattr__(self, name: str) -> Any:  # .T, .shape, ...: the joined tensor's
        return getattr(self.joined(), name)
