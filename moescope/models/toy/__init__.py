"""The embedded toy model: a small Qwen3-MoE that solves the task suite often but not always.

It ships inside the package (``moescope/models/toy/checkpoint/``, a standard Hugging Face checkpoint
of a few MB), so every tour, test and demo runs offline without training. ``toy_card.json``
beside the weights holds the recipe and the measured accuracy; ``python -m moescope.models.toy.build``
regenerates the checkpoint.

Example
-------
>>> from moescope.models.toy import load_toy, toy_card
>>> model, tok = load_toy()
>>> sorted(toy_card()["accuracy"]["results"][0])
['greedy', 'mixed', 'n', 'sampled', 'task']
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.io import replace_dir
from moescope.errors import MoescopeError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["CARD_NAME", "load_toy", "toy_card", "toy_path", "write_toy"]

CARD_NAME = "toy_card.json"
_CHECKPOINT = Path(__file__).parent / "checkpoint"


def toy_path() -> Path:
    """Directory of the packaged toy checkpoint; loadable by ``AutoModelForCausalLM.from_pretrained``.

    Raises
    ------
    MoescopeError
        If the checkpoint is missing from this installation.
    """
    if not (_CHECKPOINT / "model.safetensors").is_file():
        raise MoescopeError(
            f"The toy checkpoint is missing from {_CHECKPOINT}; reinstall moescope or rebuild it with "
            f"`python -m moescope.models.toy.build --out {_CHECKPOINT} --overwrite`."
        )
    return _CHECKPOINT


def toy_card() -> dict[str, Any]:
    """The toy's card: recipe, measured accuracy, expert load, wall time and versions."""
    return json.loads((toy_path() / CARD_NAME).read_text())


def load_toy(dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Load the toy model (eval mode) and its tokenizer.

    Parameters
    ----------
    dtype : torch.dtype, optional
        Weight dtype; ``torch.float32`` (the stored precision) by default.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = toy_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def write_toy(out: str | Path, *, overwrite: bool = False) -> Path:
    """Copy the toy checkpoint to ``out`` and return that path.

    Raises
    ------
    MoescopeError
        If ``out`` exists and is not empty, unless ``overwrite``.
    """
    src = toy_path()

    def fill(tmp: Path) -> None:
        shutil.copytree(src, tmp, dirs_exist_ok=True)

    return replace_dir(Path(out), fill, overwrite=overwrite)
