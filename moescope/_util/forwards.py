"""Wrapping a module's ``forward`` for the length of a ``with`` block, and putting it back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from torch import nn

Wrap = Callable[[Callable], Callable]


@contextmanager
def patched_forwards(patches: Iterable[tuple[nn.Module, Wrap]]) -> Iterator[None]:
    """Each module's ``forward`` replaced by ``wrap(original forward)`` while active. On exit the
    module is as it was: an instance ``forward`` is put back, a class one uncovered again."""
    saved = []
    try:
        for module, wrap in patches:
            original, own = module.forward, "forward" in module.__dict__
            module.forward = wrap(original)
            saved.append((module, original, own))
        yield
    finally:
        for module, original, own in reversed(saved):
            if own:
                module.forward = original
            else:
                del module.forward
