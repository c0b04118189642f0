"""The embedded toy model: a small Qwen3-MoE that solves the task suite often but not always.

It ships inside the package (``moescope/models/toy/checkpoint/``, a standard Hugging Face checkpoint
of a few MB), so every tour, test and demo runs offline without training. ``toy_card.json``
beside the weights holds the recipe and the measured accuracy; ``python -m moescope.models.toy.build``
regenerates the checkpoint. The functions here are :mod:`moescope.models.embedded`'s for the
name ``"toy"``.

Example
-------
>>> from moescope.models.toy import load_toy, toy_card
>>> model, tok = load_toy()
>>> sorted(toy_card()["accuracy"]["results"][0])
['greedy', 'mixed', 'n', 'sampled', 'task']
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.models.embedded import CARD_NAME, embedded_card, embedded_path, load_embedded, write_embedded

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["CARD_NAME", "NAME", "load_toy", "toy_card", "toy_path", "write_toy"]

NAME = "toy"


def toy_path() -> Path:
    """Directory of the packaged toy checkpoint; loadable by ``AutoModelForCausalLM.from_pretrained``.

    Raises
    ------
    MoescopeError
        If the checkpoint is missing from this installation.
    """
    return embedded_path(NAME)


def toy_card() -> dict[str, Any]:
    """The toy's card: recipe, measured accuracy, expert load, wall time and versions."""
    return embedded_card(NAME)


def load_toy(dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Load the toy model (eval mode) and its tokenizer; ``dtype`` defaults to float32 (as stored)."""
    return load_embedded(NAME, dtype)


def write_toy(out: str | Path, *, overwrite: bool = False) -> Path:
    """Copy the toy checkpoint to ``out`` and return that path.

    Raises
    ------
    MoescopeError
        If ``out`` exists and is not empty, unless ``overwrite``.
    """
    return write_embedded(NAME, out, overwrite=overwrite)
