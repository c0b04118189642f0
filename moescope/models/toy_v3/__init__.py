"""The embedded toy-v3 model: a small DeepSeek-V3 built like today's large MoEs.

A stock ``DeepseekV3ForCausalLM`` with 64 fine-grained routed experts in each of its 4 layers,
top-6, 4 shared experts (one always-on MLP 4 × a routed expert's width), sigmoid routing with a
selection-only correction bias, group-limited top-k (4 groups, the best 3 eligible) and
Multi-head Latent Attention, balanced without an auxiliary loss. It is trained on the same task
suite and tokenizer as the toy (:mod:`moescope.models.toy`), so what a proxy keeps can be measured
on the kind of model users bring, not only on a top-2-of-32 toy. The checkpoint and its card
ship in ``checkpoint/``; ``python -m moescope.models.toy_v3.build`` regenerates them. Everywhere
moescope takes a model, ``"toy-v3"`` names it; ``moescope toy --name toy-v3 --out DIR`` writes a
copy (:mod:`moescope.models.embedded`).

Example
-------
>>> from moescope.models.toy_v3 import load_toy_v3, toy_v3_card
>>> model, tok = load_toy_v3()
>>> type(model).__name__, toy_v3_card()["recipe"]["num_experts_per_tok"]
('DeepseekV3ForCausalLM', 6)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.models.embedded import embedded_card, embedded_path, load_embedded

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["NAME", "load_toy_v3", "toy_v3_card", "toy_v3_path"]

NAME = "toy-v3"


def toy_v3_path() -> Path:
    """Directory of the packaged toy-v3 checkpoint (a :class:`~moescope.errors.MoescopeError` if missing)."""
    return embedded_path(NAME)


def toy_v3_card() -> dict[str, Any]:
    """toy-v3's card: recipe, measured accuracy, expert load, wall time and versions."""
    return embedded_card(NAME)


def load_toy_v3(dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Load toy-v3 (eval mode) and its tokenizer; ``dtype`` defaults to float32 (as stored)."""
    return load_embedded(NAME, dtype)
