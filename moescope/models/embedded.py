"""The embedded models: the names moescope accepts in place of a checkpoint directory.

Each embedded model is a subpackage of :mod:`moescope.models` that ships a standard Hugging Face
checkpoint in ``checkpoint/`` (with the card :data:`CARD_NAME`: recipe, measured accuracy,
expert load, versions) and a ``build`` module that regenerates it. :data:`EMBEDDED` is the one
table from name to subpackage, so loading, the command line, cost and task accuracy accept every
embedded model by name without an ``if`` per model.

- ``toy``: a Qwen3-MoE, 32 routed experts, top-2, softmax routing (:mod:`moescope.models.toy`).
- ``toy-v3``: a DeepSeek-V3, 64 fine-grained routed experts, top-6, 4 shared experts, sigmoid
  routing with a correction bias and grouped top-k (:mod:`moescope.models.toy_v3`).

Example
-------
>>> embedded_path("toy-v3").name, is_embedded("toy"), is_embedded("toy.json")
('checkpoint', True, False)
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

__all__ = [
    "CARD_NAME",
    "EMBEDDED",
    "embedded_card",
    "embedded_path",
    "is_embedded",
    "load_embedded",
    "write_embedded",
]

CARD_NAME = "toy_card.json"
"""The card beside each embedded checkpoint (the same name for every embedded model)."""

EMBEDDED: dict[str, str] = {"toy": "toy", "toy-v3": "toy_v3"}
"""Embedded model name → its subpackage of :mod:`moescope.models`."""

_MODELS_DIR = Path(__file__).parent


def is_embedded(model: object) -> bool:
    """True when ``model`` (a string or path) names an embedded model."""
    return isinstance(model, str | Path) and str(model) in EMBEDDED


def _package(name: str) -> str:
    if name not in EMBEDDED:
        raise MoescopeError(
            f"{name!r} is not an embedded model; choose one of {', '.join(EMBEDDED)} or pass a checkpoint "
            "directory."
        )
    return EMBEDDED[name]


def embedded_path(name: str) -> Path:
    """Directory of the packaged checkpoint ``name``; loadable by ``AutoModelForCausalLM``.

    Raises
    ------
    MoescopeError
        For an unknown name, or a checkpoint missing from this installation.
    """
    package = _package(name)
    directory = _MODELS_DIR / package / "checkpoint"
    if not (directory / "model.safetensors").is_file():
        raise MoescopeError(
            f"The {name} checkpoint is missing from {directory}; reinstall moescope or rebuild it with "
            f"`python -m moescope.models.{package}.build --out {directory} --overwrite`."
        )
    return directory


def embedded_card(name: str) -> dict[str, Any]:
    """The card of ``name``: recipe, measured accuracy, expert load, wall time and versions."""
    return json.loads((embedded_path(name) / CARD_NAME).read_text())


def load_embedded(name: str, dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Load the embedded model ``name`` (eval mode) and its tokenizer.

    Parameters
    ----------
    name : one of :data:`EMBEDDED`.
    dtype : weight dtype; ``torch.float32`` (the stored precision) by default.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_path(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def write_embedded(name: str, out: str | Path, *, overwrite: bool = False) -> Path:
    """Copy the checkpoint of ``name`` to ``out`` and return that path.

    Raises
    ------
    MoescopeError
        If ``out`` exists and is not empty, unless ``overwrite``.
    """
    src = embedded_path(name)

    def fill(tmp: Path) -> None:
        shutil.copytree(src, tmp, dirs_exist_ok=True)

    return replace_dir(Path(out), fill, overwrite=overwrite)
