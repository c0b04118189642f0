"""What a block of torch work really allocates at its peak, measured where the device tells.

A layer-sequential pass sizes its chunks of rows by one row's activations
(:mod:`moescope.models.row_chunks`). The estimate of :func:`~moescope.models.footprint.
layer_activation_bytes` (two dozen hidden-sized vectors a token) holds for attention and a few
routed experts, but measured on the tiny models it is short by 10-20 % for fine-grained experts
(toy-v3, Llama 4), 5x for a Mamba layer and 100x for Qwen3-Next's gated delta rule on the CPU,
whose reference kernels hold a chunk's matrices: sized by it, a chunk outgrows ``--max-memory``.
Measured here: on a GPU by the caching allocator's peak, on the CPU by the C heap's bytes in use
(glibc's ``mallinfo2``) after each operator; elsewhere nothing is measured.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class Peak:
    """The most bytes a block held beyond what was in use when it began (``None``: not measured)."""

    bytes: int | None = None


def measurable(device: torch.device) -> bool:
    """Whether :func:`peak_allocation` measures work on ``device``."""
    return device.type == "cuda" or (device.type == "cpu" and _mallinfo2() is not None)


@contextlib.contextmanager
def peak_allocation(device: torch.device) -> Iterator[Peak]:
    """The peak bytes the block allocates on ``device`` (:class:`Peak`, filled when it ends)."""
    peak = Peak()
    if device.type == "cuda":
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield peak
        peak.bytes = max(0, torch.cuda.max_memory_allocated(device) - start)
    elif device.type == "cpu" and _mallinfo2() is not None:
        with _HeapPeak() as mode:
            yield peak
        peak.bytes = mode.peak
    else:
        yield peak


def _heap_in_use() -> int:
    info = _mallinfo2()()
    return int(info.uordblks + info.hblkhd)  # the heap's blocks in use, and those mapped apart


class _HeapPeak(TorchDispatchMode):
    """Reads the C heap after every operator the block runs: the tensors torch allocates on the
    CPU come from it."""

    def __enter__(self) -> _HeapPeak:
        self.start, self.peak = _heap_in_use(), 0
        return super().__enter__()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, _heap_in_use() - self.start)
        return out


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@cache
def _mallinfo2() -> Any:
    """glibc's ``mallinfo2`` (2.33 and later), or ``None``."""
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError):
        function = ctypes.CDLL(name).mallinfo2 if name else None
        if function is not None:
            function.restype = _MallInfo2
        return function
    return None
