"""The LM head run apart from the forward, a chunk of rows at a time.

A pass that keeps every position's logits (Taylor importance's likelihood, the held-out KL of
fidelity) holds ``rows × positions × vocabulary`` of them per forward: on a layer-sequential
model, whose forwards are as large as the rows' hidden states allow (each forward reads the
checkpoint), they would set the forward's size. There the forward stops where the LM head would
run (:func:`head_input`: the head's input, every row's last hidden states), and the pass runs the
head itself on a chunk of rows at a time (:func:`own_forward`, with the head's weights in memory),
so a chunk's logits are in memory at once. Only where the logits are the head's own output:
a model that scales or caps them after the head (:data:`AFTER_HEAD`) keeps the whole forward.
"""

from __future__ import annotations

from typing import Any

import torch

from moescope.errors import MoescopeError
from moescope.models.row_chunks import chunks_rows

# Config fields of models whose forward changes the logits after the head (GraniteMoE divides
# them, Cohere's multiply, Gemma-style models cap them): there the head alone is not the logits.
AFTER_HEAD = ("logits_scaling", "logit_scale", "final_logit_softcapping")


def head_runs_apart(model: Any) -> bool:
    """Whether a pass on ``model`` runs its LM head apart, a chunk of rows at a time: a model
    whose decoder layers run rows in chunks (layer-sequential) and whose logits are the head's
    output."""
    text = model.config.get_text_config()
    after_head = any(getattr(text, name, None) not in (None, 1, 1.0) for name in AFTER_HEAD)
    return chunks_rows(model) and not after_head


class _HeadReached(Exception):
    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


def head_input(model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    """``(rows, T, H)``: what ``model``'s LM head would read of ``inputs``, the forward stopped
    before the head runs (and before its weights are read). Hooks on the decoder stack have run."""

    def stop(_: Any, args: tuple[Any, ...]) -> None:
        raise _HeadReached(args[0])

    handle = model.get_output_embeddings().register_forward_pre_hook(stop)
    try:
        model(**{"use_cache": False, **inputs})  # a cache would keep each layer's keys, whole
    except _HeadReached as reached:
        return reached.hidden
    finally:
        handle.remove()
    raise MoescopeError(f"{type(model).__name__}'s forward never ran its LM head; measure it in memory.")


def head_rows(model: Any, width: int, per_entry: int) -> int:
    """Rows of ``width`` positions per chunk of a head run apart, each position holding
    ``per_entry`` bytes per vocabulary entry: as many as fit beside a layer within the memory the
    model's chunks are sized by (:func:`~moescope.models.footprint.chunk_memory`)."""
    from moescope.models.footprint import chunk_memory, rows_beside_layer

    vocab = model.config.get_text_config().vocab_size
    return rows_beside_layer(model, per_entry * width * vocab, available=chunk_memory(model))


def own_forward(module: torch.nn.Module) -> Any:
    """``module``'s forward without accelerate's hook, which would read its weights again: call
    it with them in memory (:func:`~moescope.models.resident.resident`)."""
    return getattr(module, "_old_forward", module.forward)
