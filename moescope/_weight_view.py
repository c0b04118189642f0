"""The weight view of one MoE layer from its stored bytes, computed while the bytes arrive.

:class:`LayerRead` reads a layer's expert tensors (router rows and biases included) into buffers
of a :class:`BufferPool` on a background thread, in file order; :func:`layer_vectors` sketches
each expert as soon as its bytes are in, so the disk and the CPU work at the same time. The
experts module is stood in for by the stored tensors — fused ones as they are, per-expert keys
joined on access — so :meth:`~moescope.arch.MoELayer.expert` reads every layout (GPT-OSS's
transposed, interleaved one included) exactly as on the loaded model, and the vectors equal
``embed_experts(model, "weights")``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from moescope._shards import COPY_CHUNK, ShardReader, StoredTensor
from moescope._threads import single_threaded
from moescope.embeddings import _expert_sketch, _Projector

if TYPE_CHECKING:
    from moescope._checkpoint import Checkpoint


class BufferPool:
    """Byte buffers for expert tensors, at most ``limit`` bytes of them (one layer's worth).

    A layer's read takes its buffers here and blocks while the pool is spent; buffers come back
    as soon as their bytes are no longer needed (a dropped expert at once, a kept one once
    written), so the next layer's read overlaps the last one's writes without the process ever
    holding more than one layer. Free buffers of another size are let go before a new one is
    made. A larger single tensor is still given a buffer when the pool holds nothing else.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.total = limit, 0
        self._free: dict[int, list[bytearray]] = defaultdict(list)
        self._changed = threading.Condition()
        self._closed = False

    def take(self, size: int) -> bytearray:
        with self._changed:
            while True:
                if self._closed:
                    raise RuntimeError("the pass stopped")
                if self._free[size]:
                    return self._free[size].pop()
                if self.total + size <= self.limit or self.total == 0:
                    self.total += size
                    return bytearray(size)
                other = next((n for n, free in self._free.items() if free), None)
                if other is not None:
                    self._free[other].pop()
                    self.total -= other
                else:
                    self._changed.wait()

    def give(self, buffer: bytearray) -> None:
        with self._changed:
            self._free[len(buffer)].append(buffer)
            self._changed.notify_all()

    def close(self) -> None:
        """Wake every waiting read with an error: the pass is over."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class LayerRead:
    """One MoE layer's expert tensors, read into buffers of ``pool`` on a background thread."""

    def __init__(self, checkpoint: Checkpoint, layer: int, pool: BufferPool) -> None:
        self.tensors = [checkpoint.by_key[key] for key in checkpoint.layer_keys[layer]]
        self.stored = {t.key: t for t in self.tensors}
        self.pool = pool
        self.buffers: dict[str, bytearray] = {}
        self._done = {t.key: -1 for t in self.tensors}  # bytes in; -1 until the buffer is taken
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="moescope-layer-read", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with ShardReader() as reader:
                for tensor in self.tensors:
                    buffer = self.pool.take(tensor.nbytes)
                    self._progress(tensor.key, 0, buffer)
                    view = memoryview(buffer)
                    for start in range(0, tensor.nbytes, COPY_CHUNK):
                        end = min(start + COPY_CHUNK, tensor.nbytes)
                        reader.read_into(tensor, start, view[start:end])
                        self._progress(tensor.key, end)
        except BaseException as exc:  # handed to the waiting thread, which raises it
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def _progress(self, key: str, done: int, buffer: bytearray | None = None) -> None:
        with self._changed:
            if buffer is not None:
                self.buffers[key] = buffer
            self._done[key] = done
            self._changed.notify_all()

    def wait(self, key: str, end: int | None = None) -> bytearray:
        """The buffer of ``key`` once its first ``end`` bytes (all by default) are in."""
        end = self.stored[key].nbytes if end is None else end
        with self._changed:
            while self._done[key] < end and self._error is None:
                self._changed.wait()
        if self._error is not None:
            raise self._error
        return self.buffers[key]

    def tensor(self, key: str, end: int | None = None) -> torch.Tensor:
        """``key``'s stored tensor, viewing its buffer once the first ``end`` bytes are in."""
        stored = self.stored[key]
        return torch.frombuffer(self.wait(key, end), dtype=stored.torch_dtype).view(stored.shape)

    def join(self) -> dict[str, bytearray]:
        """Every buffer, once all are read."""
        for tensor in self.tensors:
            self.wait(tensor.key)
        self._thread.join()
        return self.buffers


def layer_vectors(checkpoint: Checkpoint, layer: int, read: LayerRead, projector: _Projector) -> np.ndarray:
    """``(E, dim)`` weight-view vectors of one layer, as :func:`~moescope.embeddings.embed_experts`
    computes them, sketching each expert as soon as :class:`LayerRead` has its bytes."""
    experts = SimpleNamespace(**_expert_params(checkpoint, layer, read))
    view = replace(checkpoint.moe.layer(layer), block=SimpleNamespace(experts=experts))
    with torch.no_grad(), single_threaded():  # skinny products: threads only wait on a busy machine
        rows = [_expert_sketch(view, i, projector) for i in range(checkpoint.moe.num_experts)]
        return projector.to_dim("weights", np.stack(rows))  # a threaded BLAS call spins ~0.1 s after


def _expert_params(checkpoint: Checkpoint, layer: int, read: LayerRead) -> dict[str, Any]:
    """Experts-module parameter name → its rows by expert (:class:`_Rows` or :class:`_Stacked`)."""
    params: dict[str, Any] = {}
    pieces: dict[str, dict[tuple[int, int], str]] = defaultdict(dict)
    for tensor in read.tensors:
        entry = checkpoint.experts[tensor.key]
        if entry.param is None:
            continue
        if entry.expert is None:
            params[entry.param] = _Rows(tensor, read)
        else:
            pieces[entry.param][entry.expert, entry.part] = tensor.key
    params.update({name: _Stacked(parts, read) for name, parts in pieces.items()})
    return params


class _Rows:
    """A fused tensor being read: ``rows[i]`` waits for expert ``i``'s row, then returns it."""

    def __init__(self, stored: StoredTensor, read: LayerRead) -> None:
        self.key, self.read = stored.key, read
        self.row_bytes = stored.nbytes // stored.shape[0] if stored.shape and stored.shape[0] else 0

    def __getitem__(self, expert: int) -> torch.Tensor:
        return self.read.tensor(self.key, (expert + 1) * self.row_bytes)[expert]


class _Stacked:
    """Per-expert tensors read as the fused parameter: ``stacked[i]`` is expert ``i``'s parts
    concatenated, as transformers' ``MergeModulelist`` + ``Concatenate`` would store it.

    The parts are joined into one buffer reused for every expert, so ``stacked[i]`` is valid
    until ``stacked[i + 1]`` is asked for (sketching is done with an expert by then): a new
    block per expert meant fresh memory, and its page faults, every time.
    """

    def __init__(self, parts: dict[tuple[int, int], str], read: LayerRead) -> None:
        self.parts, self.read = parts, read
        self.count = 1 + max(part for _, part in parts)
        self._joined: torch.Tensor | None = None

    def __getitem__(self, expert: int) -> torch.Tensor:
        pieces = [self.read.tensor(self.parts[expert, part]) for part in range(self.count)]
        if self.count == 1:
            return pieces[0]
        if self._joined is None:
            self._joined = torch.empty(0, dtype=pieces[0].dtype)  # sized by the first cat
        return torch.cat(pieces, out=self._joined)
