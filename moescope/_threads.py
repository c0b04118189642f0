"""Thread limits for small numerical problems on busy CPUs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any


@contextmanager
def single_threaded() -> Iterator[None]:
    """One BLAS / OpenMP thread inside: per-layer problems (hundreds of experts) are too small
    to gain from threads, and on busy cores thread start-up and spin-waiting cost 10-20×."""
    controller = _thread_controller()
    if controller is None:
        yield
        return
    with controller.limit(limits=1):
        yield


@cache
def _thread_controller() -> Any:
    """threadpoolctl's controller, built once: finding the thread pools costs ~10 ms a time."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # comes with scikit-learn; without it, keep the library defaults
        return None
    return ThreadpoolController()
