"""The cyclic garbage collector held off while a log's records are built.

Reading a long log allocates a few container objects per record (a dict of metrics, a row, a
tuple of matched values), hundreds of thousands in all, none of them in a reference cycle.
CPython's collector runs every few hundred such allocations and, as the records survive, walks
the ever larger older generations again: on a log of a hundred thousand records that is a fifth
of the read, collecting nothing. Held off for the read, the collector runs as usual after it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def held_off() -> Iterator[None]:
    """The block run with automatic collection off, and back on after it if it was on before."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
