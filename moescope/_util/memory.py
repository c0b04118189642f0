"""The process's memory: how much it may still use, and handing freed memory back to the system.

Shared by the streaming export (whether the in-memory export would fit) and the layer-sequential
calibration (whether one layer and one batch fit, and keeping its resident set at one layer).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from functools import cache
from pathlib import Path
from typing import Any


def available_memory() -> int:
    """Bytes this process can still use: the system's available memory, capped by a cgroup limit."""
    try:
        import psutil

        free = int(psutil.virtual_memory().available)
    except ImportError:
        free = _meminfo_available()
    return min(free, _cgroup_headroom())


def format_size(n: int) -> str:
    """Bytes as a message names them: ``"4.1 GB"``, ``"285.2 MB"``, ``"10.0 kB"``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e3:.1f} kB"


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_headroom() -> int:
    """Limit minus usage of this process's memory cgroup (v2, then v1); unlimited when unset."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit, usage = Path(limit_file).read_text().strip(), Path(usage_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            return max(int(limit) - int(usage), 0)
    return 1 << 62


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    glibc raises its mmap threshold each time a large block is freed, so later blocks of up to
    32 MB come from the heap, and a heap page stays resident after its block is freed. A pass
    that frees a layer's tensors and allocates the next layer's would otherwise keep growing
    its resident set by the fragments left between them.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(name).malloc_trim if name else None
    return None
