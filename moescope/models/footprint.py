"""What a model's forward passes hold in memory, estimated before any runs: its largest decoder
layer, one forward's activations, one generated row's key/value cache. The layer-sequential
passes (:mod:`moescope.explore.sequential`) and the batched sampling of own completions
(:mod:`moescope.explore.rl_data`) size their batches by them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PASS_MEMORY_SHARE = 0.5  # of the memory beside one layer, what a batch's activations may take


def rows_beside_layer(
    model: PreTrainedModel, per_row: int, *, available: int | None = None, layer: int | None = None
) -> int:
    """Rows of ``per_row`` bytes that :data:`PASS_MEMORY_SHARE` of the memory beside the largest
    decoder layer holds (``available``: bytes free, default what the device the model computes
    on has free; ``layer``: that layer's bytes, where the caller knows them); at least one."""
    from moescope.models.device import free_memory

    free = free_memory(model) if available is None else available
    layer = largest_layer_bytes(model) if layer is None else layer
    room = PASS_MEMORY_SHARE * (free - layer)
    return max(1, int(max(room, 0) // per_row))


def chunk_memory(model: PreTrainedModel) -> int | None:
    """The bytes a chunk of rows' transient activations may be sized within on ``model``: the
    bound it was read under (:func:`~moescope.explore.sequential.layer_sequential`'s
    ``available``, an export's ``--max-memory`` less the proxy it holds), ``None`` for what is
    free. A forward's rows, whose hidden states are small beside a layer and set how often the
    checkpoint is read, are sized by what is free (:mod:`moescope.models.row_chunks`)."""
    return getattr(model, "_pass_memory", None)


def generation_rows(model: PreTrainedModel, tokens: int, *, available: int | None = None) -> int:
    """Rows one ``generate`` call may hold (:func:`rows_beside_layer`), each with its key/value
    cache of ``tokens`` positions (:func:`kv_cache_bytes`) and one forward's activations."""
    config = model.config
    per_row = kv_cache_bytes(config, tokens) + activation_bytes(
        config, n_tokens=tokens, batch_size=1, seq_len=tokens
    )
    return rows_beside_layer(model, per_row, available=available)


def kv_cache_bytes(config: Any, tokens: int) -> int:
    """A generous bound of one row's key/value cache, in float32: keys and values of every
    attention head of every layer at ``tokens`` positions (latent-attention models cache
    full heads in transformers too)."""
    text = config.get_text_config()
    heads = _attention_heads(text)
    head_dim = (
        max(int(getattr(text, name, 0) or 0) for name in ("head_dim", "qk_head_dim", "v_head_dim"))
        or text.hidden_size // heads
    )
    return 4 * 2 * text.num_hidden_layers * heads * head_dim * tokens


def largest_layer_bytes(model: PreTrainedModel) -> int:
    """Bytes of the largest decoder layer's weights and buffers, in the dtypes they load in."""
    from itertools import chain

    from moescope.models.view import decoder_layers

    return max(
        sum(t.numel() * t.element_size() for t in chain(layer.parameters(), layer.buffers()))
        for layer in decoder_layers(model)
    )


def activation_bytes(
    config: Any, *, n_tokens: int, batch_size: int, seq_len: int, backward: bool = False
) -> int:
    """A generous estimate of one forward's activations, in float32: two dozen hidden-sized
    vectors per token (residual stream, norms, attention projections, the routed experts' inputs
    and outputs), the eager attention scores and their softmax (rows × heads × length²), and the
    last position's logits.

    With ``backward`` (Taylor importance: a backward follows, each layer run again from its
    input), every decoder layer's input is kept until the backward, one layer's activations are
    held twice (its forward run again, and their gradients), and every position's logits four
    times (the logits, their log-softmax, and the gradients of both).
    """
    text = config.get_text_config()
    tokens = min(n_tokens, batch_size * seq_len)
    rows = min(batch_size, -(-tokens // seq_len))
    layer = layer_activation_bytes(config, rows=rows, seq_len=seq_len, tokens=tokens)
    if not backward:
        return layer + 4 * rows * text.vocab_size
    inputs = text.num_hidden_layers * tokens * text.hidden_size
    return 2 * layer + 4 * (inputs + 4 * tokens * text.vocab_size)


def layer_activation_bytes(config: Any, *, rows: int, seq_len: int, tokens: int | None = None) -> int:
    """An estimate, in float32, of what one decoder layer's forward holds at once for ``rows``
    rows of ``seq_len`` positions (``tokens`` of them real, default all): two dozen
    hidden-sized vectors per token and the eager attention scores and their softmax. Generous
    for attention and a few routed experts, short for many fine-grained ones and for linear
    attention's reference kernels: a layer-sequential pass's chunks take the larger of it and a
    measured row (:mod:`moescope.models.row_chunks`)."""
    text = config.get_text_config()
    tokens = rows * seq_len if tokens is None else tokens
    scores = 2 * rows * _attention_heads(text) * seq_len**2
    return 4 * (24 * tokens * text.hidden_size + scores)


def row_state_bytes(config: Any, *, seq_len: int, backward: bool = False) -> int:
    """What one row of ``seq_len`` positions holds through a forward whose decoder layers run the
    rows in chunks (:mod:`moescope.models.row_chunks`), in float32: its hidden states in and out
    of the layer running, the chunks' outputs and their join, and, with ``backward``, every
    decoder layer's input, kept for the backward. Logits are the caller's to add."""
    text = config.get_text_config()
    kept = 4 + (text.num_hidden_layers if backward else 0)
    return 4 * kept * seq_len * text.hidden_size


def _attention_heads(config: Any) -> int:
    """The most attention heads of any layer (transformers' heterogeneous configs keep them per layer)."""
    layers = getattr(config, "per_layer_config", None) or [config]
    return max(int(getattr(layer, "num_attention_heads", None) or 1) for layer in layers)
