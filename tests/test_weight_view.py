"""The clustering pass's view of stored experts: mapped where they lie, one layer resident."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from moescope.errors import ModelLoadError
from moescope.export.streaming.shards import StoredTensor
from moescope.export.streaming.weight_view import LayerRead, MappedTensor, MemoryBudget, ShardSpan, _Joined


def test_the_budget_holds_one_layer_and_lets_the_next_in_as_tensors_are_released() -> None:
    """A take waits while the budget is spent and goes on when bytes come back; one tensor
    larger than the whole budget still goes in alone; closing wakes a waiting take with an error."""
    budget = MemoryBudget(limit=300)
    budget.take(100)
    budget.take(200)
    taken: list[int] = []
    waiting = threading.Thread(target=lambda: (budget.take(100), taken.append(100)))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and not taken  # 100 more would pass the limit
    budget.give(100)
    waiting.join(5)
    assert taken and budget.total == 300
    budget.give(200)
    budget.give(100)
    budget.take(1000)  # larger than the limit, with nothing else held
    assert budget.total == 1000
    errors: list[BaseException] = []

    def take_more() -> None:
        try:
            budget.take(100)
        except RuntimeError as exc:
            errors.append(exc)

    blocked = threading.Thread(target=take_more)
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()
    budget.close()
    blocked.join(5)
    assert errors and not blocked.is_alive()


def _rss_file() -> int:
    """Bytes of mapped files resident in this process (Linux's ``RssFile``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("/proc/self/status has no RssFile line")


def _blob(path: Path, size: int, offset: int) -> StoredTensor:
    """A file holding ``size`` counting bytes after ``offset`` bytes of padding, as one tensor."""
    data = torch.arange(size, dtype=torch.int64).remainder(251).to(torch.uint8)
    path.write_bytes(bytes(offset) + data.numpy().tobytes())
    return StoredTensor("blob", path, "U8", (size,), offset)


def test_a_mapped_tensor_reads_its_bytes_and_leaves_resident_memory_when_released(tmp_path: Path) -> None:
    size = 64 << 20
    stored = _blob(tmp_path / "shard", size, offset=4096 + 8)  # not page aligned, like safetensors data
    budget = MemoryBudget(limit=size)
    before = _rss_file()
    mapped = MappedTensor(stored, ShardSpan(stored.file, stored.offset, stored.offset + size, "blob"), budget)
    values = mapped.tensor()
    assert budget.total == size
    assert torch.equal(values, torch.arange(size, dtype=torch.int64).remainder(251).to(torch.uint8))
    assert _rss_file() - before > size // 2  # the pages are the process's while mapped and read
    mapped.release()
    assert _rss_file() - before < size // 8  # ... and no longer once released
    assert budget.total == 0
    assert int(values[-1]) == (size - 1) % 251  # a view still reads the file: the cache kept it


def test_a_shard_shorter_than_its_header_says_is_refused_before_it_is_mapped(tmp_path: Path) -> None:
    """Reading past the end of a mapped file would kill the process (SIGBUS), not raise."""
    stored = _blob(tmp_path / "shard", 4096, offset=8)
    with open(stored.file, "r+b") as handle:
        handle.truncate(1000)
    with pytest.raises(ModelLoadError, match="truncated"):
        ShardSpan(stored.file, stored.offset, stored.offset + stored.nbytes, stored.key)


def test_a_fused_gate_up_split_back_into_its_halves_is_the_stored_parts() -> None:
    """Per-expert gate and up stand for the fused tensor; splitting it on the joined axis gives
    them back uncopied, any other use joins them as the loaded model's tensor."""
    gate, up = torch.randn(4, 3), torch.randn(4, 3)
    joined = _Joined([gate, up], lambda pieces: torch.cat(pieces))
    halves = joined.chunk(2, dim=0)
    assert halves[0].data_ptr() == gate.data_ptr() and halves[1].data_ptr() == up.data_ptr()
    fused = torch.cat([gate, up])
    for got, want in zip(joined.chunk(2, dim=1), fused.chunk(2, dim=1), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(joined[:, 0::2], fused[:, 0::2])
    assert torch.equal(joined.T, fused.T) and joined.shape == fused.shape


def test_a_layer_of_thousands_of_tensors_is_mapped_with_one_file_per_shard(tmp_path: Path) -> None:
    """Each mapping holds a file descriptor; one per tensor would pass the usual limit of 1,024
    open files on a layer of 384 experts x 3 projections (Kimi-K2's)."""
    count, size = 1200, 4096 + 8
    file = tmp_path / "shard"
    file.write_bytes(bytes(8 + count * size))
    tensors = [StoredTensor(f"t{i}", file, "U8", (size,), 8 + i * size) for i in range(count)]
    checkpoint = SimpleNamespace(by_key={t.key: t for t in tensors}, layer_keys={0: [t.key for t in tensors]})
    open_files = len(os.listdir("/proc/self/fd"))
    read = LayerRead(checkpoint, 0, MemoryBudget(limit=count * size))
    assert all(int(read.tensor(t.key).sum()) == 0 for t in tensors)
    assert len(os.listdir("/proc/self/fd")) - open_files <= 1
    read.release()
