"""Comparing replay traces, and launching ``moescope`` under torchrun, for the multi-process tests."""

from __future__ import annotations

import math
import os
import subprocess
import sys

from moescope.replay.trainer import TIMING_KEYS


def finish(process: subprocess.Popen, timeout: int = 300) -> tuple[str, str]:
    out, err = process.communicate(timeout=timeout)
    return out, err


def torchrun(*args: str, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node NPROC -m moescope ARGS`` on a free port, one thread a process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
         "-m", "moescope", *args],
        capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


def same_trace(a, b, rel: float = 0.0) -> None:
    """Step records equal (timing aside); with ``rel``, floats within that relative tolerance."""
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps, strict=True):
        assert set(x) == set(y)
        for key in x:
            if key not in TIMING_KEYS:
                close(x[key], y[key], rel, f"step {x['step']} {key}")


def close(x, y, rel: float, where: str) -> None:
    """``x`` and ``y`` equal, floats within ``rel`` (exactly when 0), NaN equal to NaN, recursively."""
    if isinstance(x, list):
        assert isinstance(y, list) and len(x) == len(y), where
        for u, v in zip(x, y, strict=True):
            close(u, v, rel, where)
    elif isinstance(x, dict):
        assert isinstance(y, dict) and set(x) == set(y), where
        for k in x:
            close(x[k], y[k], rel, where)
    elif isinstance(x, float) and rel:
        assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-7) or (math.isnan(x) and math.isnan(y)), (
            where,
            x,
            y,
        )
    else:
        assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), (where, x, y)
