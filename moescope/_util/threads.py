"""Thread limits for small numerical problems on busy CPUs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any


@contextmanager
def single_threaded() -> Iterator[None]:
    """One BLAS / OpenMP thread inside: per-layer problems (hundreds of experts) are too small
    to gain from threads, and on busy cores thread start-up and spin-waiting cost 10-20×."""
    controller = _thread_controller(len(sys.modules))
    if controller is None:
        yield
        return
    with controller.limit(limits=1):
        yield


@lru_cache(maxsize=1)
def _thread_controller(modules: int) -> Any:
    """threadpoolctl's controller, built again only when modules were imported since the last one.

    Finding the thread pools costs ~10 ms a time, so it is not done per call; but a controller
    knows only the libraries loaded when it was built, and scikit-learn and SciPy bring their
    own OpenMP and OpenBLAS on first import: one built before them left their pools at full
    size. An idle pool's threads spin after each call, on a busy machine at others' expense.
    """
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # comes with scikit-learn; without it, keep the library defaults
        return None
    return ThreadpoolController()
