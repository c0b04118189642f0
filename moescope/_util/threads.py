"""Thread limits for small numerical problems on busy CPUs, and a pool for CPU-bound passes."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from functools import lru_cache
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
HELPER_NICENESS = 5  # map_on_cores' helper threads yield to every other (Linux nice steps)


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


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), at most torch's thread count, which
    follows ``OMP_NUM_THREADS`` and ``torch.set_num_threads``: a user who asked for one thread
    gets one."""
    import torch

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, torch.get_num_threads()))


def map_on_cores(function: Callable[[T], R], items: Iterable[T], workers: int) -> list[R]:
    """``[function(item) for item in items]`` on the calling thread and ``workers - 1`` helper
    threads, one BLAS / OpenMP thread each (call it inside :func:`single_threaded`).

    Torch releases the GIL inside its kernels, so threads running one small product each use
    several cores, where one thread running each product on several would spend most of its
    time starting and joining them. Items are handed out one at a time, so a busy core takes
    fewer of them instead of holding up the rest, and no thread spins waiting for another.
    The helpers run at a lower priority (:func:`_helper`): they take what is idle, never the
    core a pass's readahead or writer needs, so the calling thread's pace is the worst case.
    """
    items = list(items)
    workers = min(workers, len(items))
    if workers <= 1:
        return [function(item) for item in items]
    results: list[Any] = [None] * len(items)
    order, handing = iter(range(len(items))), threading.Lock()

    def drain() -> None:
        while True:
            with handing:
                i = next(order, None)
            if i is None:
                return
            try:
                results[i] = function(items[i])
            except BaseException:
                with handing:  # the others stop after their current item
                    for _ in order:
                        pass
                raise

    with ThreadPoolExecutor(workers - 1, thread_name_prefix="moescope-cores", initializer=_helper) as pool:
        helpers = [pool.submit(drain) for _ in range(workers - 1)]
        drain()
        for helper in helpers:
            helper.result()
    return results


def _helper() -> None:
    """One OpenMP thread, at a lower priority than the process's other threads.

    A new thread's OpenMP thread count is the process default, not the caller's limit (it is
    per thread); torch sets it on the thread's first parallel call, so that goes first. The
    priority (Linux's nice, per thread) lets the threads that keep the disk busy (a pass's
    readahead and writer) and other programs take a core the moment they need it.
    """
    import torch

    torch.get_num_threads()  # torch's per-thread set-up, which would undo the limit below
    controller = _thread_controller(len(sys.modules))
    if controller is not None:
        controller.select(user_api="openmp").limit(limits=1)  # this thread's, kept until it ends
    with suppress(AttributeError, OSError):  # not on Linux: one priority for all
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + HELPER_NICENESS)


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
