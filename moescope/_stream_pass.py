"""The one read of a streaming export: planned outputs written in source order, shard by shard.

:func:`plan_outputs` lists the proxy's tensors before any byte moves (so every shard header is
known up front); :class:`Pass` then writes them in that order. When the selection is known,
each output is a byte range copy. Under clustering, a layer is read (on a background thread),
sketched and clustered the first time one of its outputs is due, and its kept experts are
written from memory; its buffers are then refilled by the next layer's read, so the pass holds
one layer of experts at a time. A :class:`~moescope._shards.Readahead` keeps the disk busy
ahead of both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from moescope._checkpoint import Checkpoint
from moescope._checkpoint_keys import ExpertKey
from moescope._shards import OutTensor, Readahead, ShardReader, ShardWriter, StoredTensor
from moescope._weight_view import LayerRead, layer_vectors
from moescope.clustering import Selection, select_experts
from moescope.embeddings import ExpertEmbeddings, _Projector, model_facts

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
    outputs = []
    for tensor in checkpoint.tensors:
        entry = checkpoint.experts.get(tensor.key)
        if entry is None:
            outputs.append(Output(OutTensor(tensor.key, tensor.dtype, tensor.shape), tensor.key))
        elif entry.expert is None:
            shape = tuple(keep if axis == entry.axis else n for axis, n in enumerate(tensor.shape))
            outputs.append(Output(OutTensor(tensor.key, tensor.dtype, shape), tensor.key, entry))
        elif entry.expert in order[entry.layer]:
            slot = order[entry.layer][entry.expert]
            out = OutTensor(entry.template.format(slot), tensor.dtype, tensor.shape)
            outputs.append(Output(out, entry=entry, slot=slot))
    return outputs


def expert_ranges(tensor: StoredTensor, axis: int, kept: tuple[int, ...]) -> list[tuple[int, int]]:
    """``(start, length)`` byte ranges of the kept slices along ``axis``, adjacent ones merged."""
    outer = int(np.prod(tensor.shape[:axis], dtype=np.int64))
    inner = int(np.prod(tensor.shape[axis + 1 :], dtype=np.int64)) * tensor.itemsize
    count = tensor.shape[axis]
    ranges: list[tuple[int, int]] = []
    for row in range(outer):
        for expert in kept:
            start = (row * count + expert) * inner
            if ranges and sum(ranges[-1]) == start:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + inner)
            else:
                ranges.append((start, inner))
    return ranges


class Pass:
    """Writes planned outputs in order, choosing each layer's experts when the selection is not
    given (``chosen=None``: clustering the weight view)."""

    def __init__(
        self, checkpoint: Checkpoint, keep: int, chosen: Selection | None, seed: int, allow_top_k: bool
    ) -> None:
        self.checkpoint, self.keep, self.chosen = checkpoint, keep, chosen
        self.seed, self.allow_top_k = seed, allow_top_k
        self.kept = {} if chosen is None else {entry.layer: entry.kept for entry in chosen.layers}
        self.held: dict[str, bytearray] = {}  # the expert tensors of the layer read last
        self.clustered: dict[int, Selection] = {}
        self.vectors: dict[int, np.ndarray] = {}
        self.projector = _Projector(seed, EMBED_DIM)

    def run(self, outputs: list[Output], work: Path, shard_bytes: int, bar: Any) -> None:
        """Write every output into shards of ``work``, then the index."""
        reads = self._disk_reads(outputs)
        layer_bytes = max((sum(t.nbytes for t, _ in step) for step in reads), default=0)
        readahead = Readahead(reads, max(READ_AHEAD, 2 * layer_bytes))  # a whole layer ahead, at least
        metadata = self.checkpoint.metadata
        try:
            with (
                ShardReader() as reader,
                ShardWriter(work, [o.out for o in outputs], shard_bytes, metadata) as writer,
            ):
                for step, output in enumerate(outputs):
                    readahead.at(step)
                    self._write(output, reader, writer)
                    bar.update(output.out.nbytes)
                writer.close()
        finally:
            readahead.close()

    def _source(self, output: Output, kept: tuple[int, ...]) -> tuple[StoredTensor, list[tuple[int, int]]]:
        """The stored tensor an output comes from, and its byte ranges."""
        entry = output.entry
        tensor = self.checkpoint.by_key[output.source or entry.template.format(kept[output.slot])]
        if entry is None or entry.axis is None:
            return tensor, [(0, tensor.nbytes)]
        return tensor, expert_ranges(tensor, entry.axis, kept)

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

    def _write(self, output: Output, reader: ShardReader, writer: ShardWriter) -> None:
        kept = self._kept(output.entry.layer) if output.entry is not None else ()
        tensor, ranges = self._source(output, kept)
        with writer.tensor(output.out.key) as write:
            held = self.held.get(tensor.key)
            if held is None:
                reader.copy(tensor, ranges, write)
            else:
                for start, length in ranges:
                    write(memoryview(held)[start : start + length])

    def _kept(self, layer: int) -> tuple[int, ...]:
        if layer not in self.kept:
            self._cluster(layer)
        return self.kept[layer]

    def _cluster(self, layer: int) -> None:
        read = LayerRead(self.checkpoint, layer, spare=self.held)  # refills the last layer's buffers
        self.held = {}
        vectors = layer_vectors(self.checkpoint, layer, read, self.projector)
        self.held = read.join()
        facts = {**model_facts(self.checkpoint.moe), "layers": (layer,)}
        emb = ExpertEmbeddings(view="weights", seed=self.seed, vectors=vectors[None], **facts)
        one = select_experts(emb, self.keep, method="cluster", seed=self.seed, allow_top_k=self.allow_top_k)
        self.vectors[layer], self.clustered[layer], self.kept[layer] = vectors, one, one.layers[0].kept

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
