"""The weight view of one MoE layer from its stored bytes, computed while the bytes arrive.

:class:`LayerRead` reads a layer's expert tensors (router rows and biases included) into memory
on a background thread, in file order; :func:`layer_vectors` sketches each expert as soon as its
bytes are in, so the disk and the CPU work at the same time. The experts module is stood in for
by the stored tensors — fused ones as they are, per-expert keys joined on access — so
:meth:`~moescope.arch.MoELayer.expert` reads every layout (GPT-OSS's transposed, interleaved one
included) exactly as on the loaded model, and the vectors equal
``embed_experts(model, "weights")``.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from moescope._shards import COPY_CHUNK, ShardReader
from moescope._threads import single_threaded
from moescope.embeddings import _expert_sketch, _Projector

if TYPE_CHECKING:
    from moescope._checkpoint import Checkpoint


class LayerRead:
    """One MoE layer's expert tensors, read into memory on a background thread.

    ``spare`` buffers (the previous layer's, of the same sizes) are filled again rather than
    allocated, so a pass holds one layer's worth of buffers however many layers it reads.
    """

    def __init__(self, checkpoint: Checkpoint, layer: int, spare: dict[str, bytearray] | None = None) -> None:
        self.tensors = [checkpoint.by_key[key] for key in checkpoint.layer_keys[layer]]
        pool: dict[int, list[bytearray]] = defaultdict(list)
        for buffer in (spare or {}).values():
            pool[len(buffer)].append(buffer)
        self.buffers = {
            t.key: pool[t.nbytes].pop() if pool[t.nbytes] else bytearray(t.nbytes) for t in self.tensors
        }
        pool.clear()  # buffers of other sizes go now, before this layer is read
        self._done = dict.fromkeys(self.buffers, 0)
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, name="moescope-layer-read", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with ShardReader() as reader:
                for tensor in self.tensors:
                    view = memoryview(self.buffers[tensor.key])
                    for start in range(0, tensor.nbytes, COPY_CHUNK):
                        end = min(start + COPY_CHUNK, tensor.nbytes)
                        reader.read_into(tensor, start, view[start:end])
                        with self._changed:
                            self._done[tensor.key] = end
                            self._changed.notify_all()
        except BaseException as exc:  # handed to the waiting thread, which raises it
            with self._changed:
                self._error = exc
                self._changed.notify_all()

    def wait(self, key: str, end: int | None = None) -> None:
        """Block until the first ``end`` bytes of ``key`` (all by default) are in memory."""
        end = len(self.buffers[key]) if end is None else end
        with self._changed:
            while self._done[key] < end and self._error is None:
                self._changed.wait()
        if self._error is not None:
            raise self._error

    def join(self) -> dict[str, bytearray]:
        """Every buffer, once all are read."""
        for key in self.buffers:
            self.wait(key)
        self._thread.join()
        return self.buffers


def layer_vectors(checkpoint: Checkpoint, layer: int, read: LayerRead, projector: _Projector) -> np.ndarray:
    """``(E, dim)`` weight-view vectors of one layer, as :func:`~moescope.embeddings.embed_experts`
    computes them, sketching each expert as soon as :class:`LayerRead` has its bytes."""
    experts = SimpleNamespace(**_expert_params(checkpoint, layer, read))
    view = replace(checkpoint.moe.layer(layer), block=SimpleNamespace(experts=experts))
    with torch.no_grad(), single_threaded():  # skinny products: threads only wait on a busy machine
        rows = [_expert_sketch(view, i, projector) for i in range(checkpoint.moe.num_experts)]
    return projector.to_dim("weights", np.stack(rows))


def _expert_params(checkpoint: Checkpoint, layer: int, read: LayerRead) -> dict[str, Any]:
    """Experts-module parameter name → its rows by expert (:class:`_Rows` or :class:`_Stacked`)."""
    params: dict[str, Any] = {}
    pieces: dict[str, dict[tuple[int, int], tuple[str, torch.Tensor]]] = defaultdict(dict)
    for tensor in read.tensors:
        entry = checkpoint.experts[tensor.key]
        if entry.param is None:
            continue
        value = torch.frombuffer(read.buffers[tensor.key], dtype=tensor.torch_dtype).view(tensor.shape)
        if entry.expert is None:
            params[entry.param] = _Rows(value, lambda end, key=tensor.key: read.wait(key, end))
        else:
            pieces[entry.param][entry.expert, entry.part] = (tensor.key, value)
    params.update({name: _Stacked(parts, read.wait) for name, parts in pieces.items()})
    return params


class _Rows:
    """A fused tensor being read: ``rows[i]`` waits for expert ``i``'s row, then returns it."""

    def __init__(self, tensor: torch.Tensor, wait: Callable[[int], None]) -> None:
        self.tensor, self.wait = tensor, wait
        self.row_bytes = tensor[0].numel() * tensor.element_size() if len(tensor) else 0

    def __getitem__(self, expert: int) -> torch.Tensor:
        self.wait((expert + 1) * self.row_bytes)
        return self.tensor[expert]


class _Stacked:
    """Per-expert tensors read as the fused parameter: ``stacked[i]`` is expert ``i``'s parts
    concatenated, as transformers' ``MergeModulelist`` + ``Concatenate`` would store it."""

    def __init__(self, parts: dict[tuple[int, int], tuple[str, torch.Tensor]], wait: Callable) -> None:
        self.parts, self.wait = parts, wait
        self.count = 1 + max(part for _, part in parts)

    def __getitem__(self, expert: int) -> torch.Tensor:
        pieces = []
        for part in range(self.count):
            key, tensor = self.parts[expert, part]
            self.wait(key)
            pieces.append(tensor)
        return pieces[0] if self.count == 1 else torch.cat(pieces)
