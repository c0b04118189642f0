"""The one read of a streaming export: planned outputs written in source order, shard by shard.

:func:`plan_outputs` lists the proxy's tensors before any byte moves (so every shard header is
known up front); :class:`Pass` then hands them, in that order, to a writing thread. When the
selection is known, each output is a byte range copy. Under clustering, a layer is mapped,
sketched and clustered the first time one of its outputs is due, and its kept experts are
written from the mapping. The mapped tensors hold a budget of one layer's size: a dropped
expert's share goes to the next layer at once, a kept one's once written, so the next layer is
sketched while the last one is written, and the pass never holds more than one layer of experts
resident. A :class:`~moescope.export.streaming.shards.Readahead` keeps the disk busy ahead of both, so the
mapped bytes are read from the page cache.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import ExpertEmbeddings, _Projector, model_facts
from moescope.explore.selection import Selection
from moescope.export.streaming.checkpoint import Checkpoint
from moescope.export.streaming.keys import ExpertKey
from moescope.export.streaming.shards import OutTensor, Readahead, ShardReader, ShardWriter, StoredTensor
from moescope.export.streaming.weight_view import LayerRead, MappedTensor, MemoryBudget, layer_vectors

EMBED_DIM = 64  # embed_experts' default: the streamed vectors equal embed_experts(model, "weights")
READ_AHEAD = 512 << 20  # bytes the disk may read ahead of the pass (page cache, not process memory)

Reads = list[tuple[StoredTensor, list[tuple[int, int]]]]


@dataclass(frozen=True)
class Output:
    """One output tensor and where its bytes come from: ``source`` (copied, or sliced along
    ``entry.axis``), or, for a per-expert key, the ``slot``-th kept expert of ``entry.layer``."""

    out: OutTensor
    source: str = ""
    entry: ExpertKey | None = None
    slot: int = -1


def plan_outputs(checkpoint: Checkpoint, keep: int, chosen: Selection | None) -> list[Output]:
    """Output tensors in source order. A per-expert output takes the place of its kept expert
    when the selection is known (the pass reads forward), else of the expert with its slot's
    id (it is then written from memory, where its place costs nothing)."""
    if chosen is not None:
        order = {entry.layer: {e: slot for slot, e in enumerate(entry.kept)} for entry in chosen.layers}
    else:
        order = {layer: {e: e for e in range(keep)} for layer in checkpoint.moe.moe_indices}
    per = checkpoint.moe.num_experts  # a fused tensor has one slice, or one block of rows (DBRX), each
    outputs = []
    for tensor in checkpoint.tensors:
        entry = checkpoint.experts.get(tensor.key)
        if entry is None:
            outputs.append(Output(OutTensor(tensor.key, tensor.dtype, tensor.shape), tensor.key))
        elif entry.expert is None:
            shape = tuple(n // per * keep if axis == entry.axis else n for axis, n in enumerate(tensor.shape))
            outputs.append(Output(OutTensor(tensor.key, tensor.dtype, shape), tensor.key, entry))
        elif entry.expert in order[entry.layer]:
            slot = order[entry.layer][entry.expert]
            out = OutTensor(entry.template.format(slot), tensor.dtype, tensor.shape)
            outputs.append(Output(out, entry=entry, slot=slot))
    return outputs


def expert_ranges(
    tensor: StoredTensor, axis: int, kept: tuple[int, ...], num_experts: int
) -> list[tuple[int, int]]:
    """``(start, length)`` byte ranges of the kept slices along ``axis`` (one slice, or one block
    of slices, per expert), adjacent ones merged."""
    outer = int(np.prod(tensor.shape[:axis], dtype=np.int64))
    count = tensor.shape[axis]
    block = count // num_experts
    inner = int(np.prod(tensor.shape[axis + 1 :], dtype=np.int64)) * tensor.itemsize
    ranges: list[tuple[int, int]] = []
    for row in range(outer):
        for expert in kept:
            start = (row * count + expert * block) * inner
            if ranges and sum(ranges[-1]) == start:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + block * inner)
            else:
                ranges.append((start, block * inner))
    return ranges


class _Writes:
    """The pass's writes, in plan order, on a thread of their own.

    The pass hands each output over (its stored source and byte ranges, and the mapping holding
    them when its layer was clustered) and goes on: it clusters the next layer while this thread
    writes the last one's kept experts and copies the tensors in between. A mapping is released
    once written, which is what lets the next layer's sketching proceed.
    """

    def __init__(self, writer: ShardWriter, bar: Any) -> None:
        self.writer, self.bar = writer, bar
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="moescope-writes", daemon=True)
        self._thread.start()

    def put(
        self, out: OutTensor, tensor: StoredTensor, ranges: list[tuple[int, int]], held: MappedTensor | None
    ) -> None:
        if self._error is not None:
            raise self._error
        self._jobs.put((out, tensor, ranges, held))

    def finish(self) -> None:
        """Wait for every write; raise the first failure."""
        self._jobs.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Skip what is still queued (its mappings are still released) and stop."""
        if self._error is None:
            self._error = RuntimeError("the pass stopped")
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        with ShardReader() as reader:
            while (job := self._jobs.get()) is not None:
                out, tensor, ranges, held = job
                try:
                    if self._error is None:
                        self._write(reader, out, tensor, ranges, held)
                except BaseException as exc:  # raised in the pass at its next hand-over
                    self._error = exc
                finally:
                    if held is not None:
                        held.release()

    def _write(
        self,
        reader: ShardReader,
        out: OutTensor,
        tensor: StoredTensor,
        ranges: list[tuple[int, int]],
        held: MappedTensor | None,
    ) -> None:
        with self.writer.tensor(out.key) as write:
            if held is None:
                reader.copy(tensor, ranges, write)
            else:
                for start, length in ranges:
                    write(held.view[start : start + length])
        self.bar.update(out.nbytes)


class Pass:
    """Writes planned outputs in order, choosing each layer's experts when the selection is not
    given (``chosen=None``: clustering the weight view)."""

    def __init__(
        self, checkpoint: Checkpoint, keep: int, chosen: Selection | None, seed: int, allow_top_k: bool
    ) -> None:
        self.checkpoint, self.keep, self.chosen = checkpoint, keep, chosen
        self.seed, self.allow_top_k = seed, allow_top_k
        self.kept = {} if chosen is None else {entry.layer: entry.kept for entry in chosen.layers}
        self.held: dict[str, MappedTensor] = {}  # kept tensors of the layer mapped last, not yet handed over
        self.budget = MemoryBudget(checkpoint.layer_bytes)
        self.clustered: dict[int, Selection] = {}
        self.vectors: dict[int, np.ndarray] = {}
        self.projector = _Projector(seed, EMBED_DIM)

    def run(self, outputs: list[Output], work: Path, shard_bytes: int, bar: Any) -> None:
        """Write every output into shards of ``work``, then the index."""
        ahead = max(READ_AHEAD, 2 * self.checkpoint.layer_bytes)  # a whole layer ahead, at least
        readahead = Readahead(self._disk_reads(outputs), ahead)
        metadata = self.checkpoint.metadata
        try:
            with ShardWriter(work, [o.out for o in outputs], shard_bytes, metadata) as writer:
                writes = _Writes(writer, bar)
                try:
                    for step, output in enumerate(outputs):
                        readahead.at(step)
                        kept = self._kept(output.entry.layer) if output.entry is not None else ()
                        tensor, ranges = self._source(output, kept)
                        writes.put(output.out, tensor, ranges, self.held.pop(tensor.key, None))
                except BaseException:
                    writes.abort()
                    raise
                writes.finish()
                writer.close()
        finally:
            self.budget.close()
            for mapped in self.held.values():
                mapped.release()
            readahead.close()

    def _source(self, output: Output, kept: tuple[int, ...]) -> tuple[StoredTensor, list[tuple[int, int]]]:
        """The stored tensor an output comes from, and its byte ranges."""
        entry = output.entry
        tensor = self.checkpoint.by_key[output.source or entry.template.format(kept[output.slot])]
        if entry is None or entry.axis is None:
            return tensor, [(0, tensor.nbytes)]
        return tensor, expert_ranges(tensor, entry.axis, kept, self.checkpoint.moe.num_experts)

    def _disk_reads(self, outputs: list[Output]) -> list[Reads]:
        """What each step reads from disk: its source, or, under clustering, the whole layer at
        the layer's first output and nothing at the others (they come from memory)."""
        reads, first = [], set()
        for output in outputs:
            layer = output.entry.layer if output.entry is not None else None
            if layer is None or layer in self.kept:
                reads.append([self._source(output, self.kept.get(layer, ()))])
            elif layer not in first:
                first.add(layer)
                tensors = [self.checkpoint.by_key[key] for key in self.checkpoint.layer_keys[layer]]
                reads.append([(tensor, [(0, tensor.nbytes)]) for tensor in tensors])
            else:
                reads.append([])
        return reads

    def _kept(self, layer: int) -> tuple[int, ...]:
        if layer not in self.kept:
            self._cluster(layer)
        return self.kept[layer]

    def _cluster(self, layer: int) -> None:
        """Map, sketch and cluster one layer; hold its kept tensors for their outputs."""
        for mapped in self.held.values():  # a layer mapped earlier: its outputs still due are copied
            mapped.release()
        read = LayerRead(self.checkpoint, layer, self.budget)
        self.held = read.mapped  # every tensor mapped so far, released by run() should the pass fail
        vectors = layer_vectors(self.checkpoint, layer, read, self.projector)
        read.join()
        facts = {**model_facts(self.checkpoint.moe), "layers": (layer,)}
        emb = ExpertEmbeddings(view="weights", seed=self.seed, vectors=vectors[None], **facts)
        one = select_experts(emb, self.keep, method="cluster", seed=self.seed, allow_top_k=self.allow_top_k)
        self.vectors[layer], self.clustered[layer], self.kept[layer] = vectors, one, one.layers[0].kept
        for key in list(self.held):
            expert = self.checkpoint.experts[key].expert
            if expert is not None and expert not in self.kept[layer]:
                self.held.pop(key).release()  # a dropped expert: its share goes to the next layer now

    def selection(self) -> Selection:
        """The selection written: the given one, or the layers clustered during the pass."""
        if self.chosen is not None:
            return self.chosen
        layers = self.checkpoint.moe.moe_indices
        first = self.clustered[layers[0]]
        return replace(first, layers=tuple(self.clustered[layer].layers[0] for layer in layers))

    def embeddings(self) -> ExpertEmbeddings | None:
        """The weight-view vectors clustered during the pass (``None`` when none were)."""
        if self.chosen is not None:
            return None
        vectors = np.stack([self.vectors[layer] for layer in self.checkpoint.moe.moe_indices])
        facts = model_facts(self.checkpoint.moe)
        return ExpertEmbeddings(view="weights", seed=self.seed, vectors=vectors, **facts)
