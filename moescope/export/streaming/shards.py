"""Safetensors shards read and written a byte range at a time, so no tensor need be whole in memory.

The format (``huggingface/safetensors``): an 8-byte little-endian header length, a JSON header
``{key: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}`` padded with spaces to a
multiple of 8 bytes, then the tensor bytes. safetensors' own reader maps whole files, and every
page it touches counts toward the process's resident memory until the file is closed; plain
``readinto`` into a buffer the caller owns keeps the resident set at that buffer's size (the
clustering pass maps one tensor at a time instead, and drops its pages once used:
:class:`moescope.export.streaming.weight_view.MappedTensor`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from moescope.errors import ModelLoadError
from moescope.models.layer_weights import SAFETENSORS_DTYPES as _DTYPES  # the item size comes from torch
from moescope.models.loading import INDEX_FILE

SINGLE_FILE = "model.safetensors"
COPY_CHUNK = 16 << 20  # bytes moved per read: enough for full disk speed, small beside any model
PREFETCH_PIECE = 128 << 10  # bytes per readahead request: Linux's default readahead window


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a shard: where its bytes are, and what they hold."""

    key: str
    file: Path
    dtype: str  # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    offset: int  # position of the first byte in the file

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, _DTYPES[self.dtype])

    @property
    def itemsize(self) -> int:
        return self.torch_dtype.itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


def read_header(file: Path) -> tuple[list[StoredTensor], dict[str, str]]:
    """The tensors of one shard in file order, and its ``__metadata__``, checked against its size."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little") if size >= 8 else -1
        if not 0 < length <= size - 8:
            raise _corrupt(file, "the header length does not fit in the file")
        try:
            header = json.loads(handle.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _corrupt(file, "the header is not JSON") from None
    metadata = header.pop("__metadata__", None) or {}
    tensors = [_entry(file, key, value, 8 + length) for key, value in header.items()]
    tensors.sort(key=lambda t: t.offset)
    end = 8 + length
    for tensor in tensors:
        if tensor.offset != end:
            raise _corrupt(file, f"the bytes of {tensor.key} do not follow the previous tensor's")
        end += tensor.nbytes
    if end != size:
        raise _corrupt(file, f"the header describes {end} bytes and the file holds {size}")
    return tensors, metadata


def _entry(file: Path, key: str, value: Any, base: int) -> StoredTensor:
    try:
        dtype, shape, (begin, end) = (
            value["dtype"],
            tuple(int(d) for d in value["shape"]),
            value["data_offsets"],
        )
    except (KeyError, TypeError, ValueError):
        raise _corrupt(file, f"the header entry of {key} is malformed") from None
    if dtype not in _DTYPES:
        raise ModelLoadError(
            f"{file} stores {key} as {dtype}, which streaming export cannot copy; convert the checkpoint "
            f"to one of {', '.join(_DTYPES)}."
        )
    tensor = StoredTensor(key, file, dtype, shape, base + int(begin))
    if int(end) - int(begin) != tensor.nbytes:
        raise _corrupt(file, f"{key} spans {end - begin} bytes, not the {tensor.nbytes} its shape needs")
    return tensor


def _corrupt(file: Path, why: str) -> ModelLoadError:
    return ModelLoadError(f"{file} is corrupted or truncated ({why}); re-download or re-copy that file.")


class ShardReader:
    """Reads byte ranges of stored tensors into buffers the caller owns (one open file per shard)."""

    def __init__(self) -> None:
        self._files: dict[Path, Any] = {}
        self._chunk: bytearray | None = None

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    def read_into(self, tensor: StoredTensor, start: int, view: memoryview) -> None:
        """Fill ``view`` with the tensor's bytes from ``start`` on."""
        handle = self._handle(tensor.file)
        handle.seek(tensor.offset + start)
        done = 0
        while done < len(view):
            got = handle.readinto(view[done:])
            if not got:
                raise _corrupt(tensor.file, f"it ended inside {tensor.key}")
            done += got

    def prefetch(self, tensor: StoredTensor, ranges: list[tuple[int, int]]) -> None:
        """Ask the kernel to start reading these byte ranges into its page cache (no waiting).

        Linux reads at most one readahead window per ``WILLNEED`` (``force_page_cache_ra`` caps
        it; 128 KiB by default), so one call for a 300 MB layer fetches a few megabytes and the
        rest is read later, on demand. The advice is therefore given a window at a time.
        """
        if not hasattr(os, "posix_fadvise"):
            return
        fd = self._handle(tensor.file).fileno()
        for start, length in ranges:
            for piece in range(start, start + length, PREFETCH_PIECE):
                size = min(PREFETCH_PIECE, start + length - piece)
                os.posix_fadvise(fd, tensor.offset + piece, size, os.POSIX_FADV_WILLNEED)

    def _handle(self, file: Path) -> Any:
        handle = self._files.get(file)
        if handle is None:
            handle = self._files[file] = open(file, "rb", buffering=0)  # noqa: SIM115
            if hasattr(os, "posix_fadvise"):  # Linux; elsewhere the kernel's own readahead serves
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return handle

    def copy(
        self, tensor: StoredTensor, ranges: list[tuple[int, int]], write: Callable[[memoryview], None]
    ) -> None:
        """Pass ``(start, length)`` byte ranges of the tensor to ``write``, a chunk at a time."""
        if self._chunk is None:
            self._chunk = bytearray(COPY_CHUNK)
        chunk = memoryview(self._chunk)
        for start, length in ranges:
            while length:
                n = min(length, len(chunk))
                self.read_into(tensor, start, chunk[:n])
                write(chunk[:n])
                start, length = start + n, length - n


@dataclass(frozen=True)
class OutTensor:
    """One tensor of the output, planned before any byte is written."""

    key: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * getattr(torch, _DTYPES[self.dtype]).itemsize


def plan_shards(tensors: list[OutTensor], max_shard_size: int) -> list[list[OutTensor]]:
    """Split tensors, in order, into shards of at most ``max_shard_size`` bytes (a larger tensor
    gets a shard of its own), as ``save_pretrained`` does."""
    shards: list[list[OutTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    """``model.safetensors`` alone, else ``model-0000i-of-0000n.safetensors`` with an index."""
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def header_bytes(tensors: list[OutTensor], metadata: dict[str, str]) -> bytes:
    """Length prefix and JSON header of a shard holding ``tensors`` in this order."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for tensor in tensors:
        header[tensor.key] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensor bytes start 8-byte aligned, as safetensors writes them
    return len(text).to_bytes(8, "little") + text


class ShardWriter:
    """Writes planned tensors, in plan order, into shards of a directory, then the index.

    Headers are known before the bytes, so each shard is written front to back in one pass and
    holds nothing in memory.
    """

    def __init__(
        self, directory: Path, tensors: list[OutTensor], max_shard_size: int, metadata: dict[str, str]
    ) -> None:
        self.directory, self.metadata = directory, metadata
        self.shards = plan_shards(tensors, max_shard_size)
        self.names = shard_names(len(self.shards))
        self._order = iter([(i, t) for i, shard in enumerate(self.shards) for t in shard])
        self._shard, self._handle, self._count = -1, None, 0

    @contextmanager
    def tensor(self, key: str) -> Iterator[Callable[[memoryview], None]]:
        """Yield a ``write(bytes)`` for the next planned tensor, which must be ``key``."""
        index, planned = next(self._order, (None, None))
        if planned is None or planned.key != key:
            raise RuntimeError(f"wrote {key} where the plan has {planned and planned.key}")
        if index != self._shard:
            self._open(index)
        start = self._count
        yield self._write
        if self._count - start != planned.nbytes:
            raise RuntimeError(f"{key}: wrote {self._count - start} bytes of {planned.nbytes}")

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_shard()  # after a failure too; the caller removes the half-written directory

    def _open(self, index: int) -> None:
        self._close_shard()
        self._shard = index
        self._handle = open(self.directory / self.names[index], "wb", buffering=0)  # noqa: SIM115
        _write_all(self._handle, memoryview(header_bytes(self.shards[index], self.metadata)))

    def _write(self, data: memoryview) -> None:
        _write_all(self._handle, data)
        self._count += len(data)

    def _close_shard(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def close(self) -> dict[str, str]:
        """Finish the last shard and write the index when there are several; returns the weight map."""
        if next(self._order, None) is not None:
            raise RuntimeError("the export stopped before every planned tensor was written")
        self._close_shard()
        weight_map = {t.key: name for name, shard in zip(self.names, self.shards, strict=True) for t in shard}
        if len(self.shards) > 1:
            tensors = [t for shard in self.shards for t in shard]
            index = {
                "metadata": {
                    "total_parameters": sum(math.prod(t.shape) for t in tensors),
                    "total_size": sum(t.nbytes for t in tensors),
                },
                "weight_map": dict(sorted(weight_map.items())),
            }
            (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        return weight_map


def _write_all(handle: Any, data: memoryview) -> None:
    done = 0
    while done < len(data):  # an unbuffered write may take less than it is given
        done += handle.write(data[done:])


class Readahead:
    """Asks the kernel for byte ranges ahead of their use, from a background thread.

    ``reads[i]`` are the ``(tensor, ranges)`` step ``i`` of a pass will read. The thread keeps
    at most ``ahead`` bytes requested past the step the pass is at (:meth:`at`), so the disk
    works while the pass computes and writes; what it fetches sits in the page cache, which the
    kernel reclaims at will, not in this process's memory.
    """

    def __init__(self, reads: list[list[tuple[StoredTensor, list[tuple[int, int]]]]], ahead: int) -> None:
        self.reads, self.ahead = reads, ahead
        sizes = [sum(length for _, ranges in step for _, length in ranges) for step in reads]
        self.starts = [0, *itertools.accumulate(sizes)]
        self._step, self._stop = 0, False
        self._moved = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="moescope-readahead", daemon=True)
        self._thread.start()

    def at(self, step: int) -> None:
        """The pass is about to run ``step``."""
        with self._moved:
            self._step = step
            self._moved.notify()

    def close(self) -> None:
        with self._moved:
            self._stop = True
            self._moved.notify()
        self._thread.join()

    def _run(self) -> None:
        with ShardReader() as reader:
            for step, reads in enumerate(self.reads):
                with self._moved:
                    while not self._stop and self.starts[step] - self.starts[self._step] > self.ahead:
                        self._moved.wait()
                    if self._stop:
                        return
                for tensor, ranges in reads:
                    with contextlib.suppress(OSError):  # advice only: a failure costs speed, not data
                        reader.prefetch(tensor, ranges)
