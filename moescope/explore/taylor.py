"""Expert Taylor importance (selection method ``taylor``): how much taking one routed expert away
changes the likelihood of what the policy generates, to first order, from one backward pass.

Every routed expert's output in every MoE layer is scaled by a multiplier ``m[s, e]`` per
calibration sequence ``s``, equal to 1, so the forward pass is the model's own. Then
``g[s, e] = ∂ log p(scored tokens of s) / ∂ m[s, e]`` is the first-order change of that
sequence's log-likelihood when expert ``e``'s routed output is taken away (``m = 0``; the whole
network after the layer sees it). An expert's importance is ``Σ_s |g[s, e]|``: the first-order
Taylor criterion of pruning (Molchanov et al., 2017) with the expert as the unit and the
sequence as the sample. A proxy keeps the experts with the largest sums.

Why absolute values and not squares (the Fisher information along the same direction): squares
weigh the largest per-sequence effects most. Calibrated as the CLI calibrates by default (20,000
tokens of every task family), the squared sum kept 0.30 of the toy's accuracy at keep 1/4 and the
absolute sum 0.92 (seed 0); calibrated on the replay's two families (4,000 tokens) both kept
about the same (toy-v3 at 1/4, 3 seeds: 0.63 and 0.62).

Why besides REAP's saliency (gate weight × ‖expert output‖): that measures the size of an
expert's output on every token, prompt tokens included; this measures its effect on what the
policy generates (the scored completion; the prompt is context), through the rest of the network
(the documentation's *Selection methods* page has the figures).

Cost: one forward and one backward pass per batch with the parameters frozen (gradients reach
the multipliers only). Loaded whole, the model needs room for one batch's activations beside
it, as for healing. Loaded a decoder layer at a time
(:func:`~moescope.explore.sequential.layer_sequential`, or
:func:`~moescope.explore.sequential.taylor_importance_sequential` from a path), the backward
would keep every layer's weights (autograd saves what each product's gradient needs), so there
each decoder layer runs its rows in chunks under activation checkpointing
(:mod:`moescope.models.row_chunks`): the forward keeps a layer's input only, and the backward
reads the layer once more and runs each chunk again from its input before its gradients; one
layer's weights are in memory at a time and the sums are the same. Each chunk runs on its rows'
real positions alone (:func:`~moescope.models.row_chunks.trailing_padding`; the likelihood reads
no padded one), so a chunk of short rows holds more of them: toy-v3 under 4 MB ran its 1,152
calibration rows a row a chunk, each padded to the longest's 31 positions. The LM head then runs in
chunks of rows too (:func:`head_runs_apart`), so a batch holds every layer's input but not every
position's logits, and one batch can hold many rows: each batch reads every layer twice.
Llama 4 scales each expert's *input* by its routing score, where scaling the score does not take
the expert away: refused there.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_batches, pad_scored
from moescope.explore.rl_data import RLCalibration
from moescope.models.lm_head import head_input, head_rows, head_runs_apart, own_forward
from moescope.models.resident import execution_device, resident
from moescope.models.row_chunks import (
    chunk_width,
    layers_read_for_backward,
    read_again_for_backward,
    real_lengths,
    row_offset,
    trailing_padding,
)
from moescope.models.view import MoEModel, adapt
from moescope.provenance import config_hash

_WEIGHTS = ("hidden_states", "top_k_index", "top_k_weights")  # the experts module's call


@dataclass(frozen=True)
class TaylorImportance:
    """Per MoE layer and routed expert, ``Σ_s |∂ log p(scored tokens of s) / ∂ m[s, e]|``.

    Attributes
    ----------
    layers : decoder-layer indices of the MoE layers, the rows of ``sums``.
    num_experts, config_hash : the model measured.
    sums : ``(L, E)`` float64; 0 for an expert no scored sequence routed to.
    sequences, tokens : calibration rows and scored tokens the sums are over.
    """

    layers: tuple[int, ...]
    num_experts: int
    config_hash: str
    sums: np.ndarray
    sequences: int
    tokens: int

    def layer_index(self, layer: int) -> int:
        """Row of ``sums`` for decoder layer ``layer``."""
        return self.layers.index(layer)


def supports_taylor(moe: MoEModel) -> bool:
    """Whether the multiplier takes an expert away: the block scales expert *outputs*."""
    return moe.spec.combine == "output"


def taylor_importance(
    model: Any,
    data: Any,
    *,
    tokenizer: Any = None,
    n_tokens: int = 20_000,
    batch_size: int = 16,
    seq_len: int = 128,
    seed: int = 0,
    progress: bool = False,
) -> TaylorImportance:
    """Expert Taylor importance of ``model`` over calibration ``data`` (see the module docstring).

    Parameters
    ----------
    model : a supported transformers MoE causal LM (not Llama 4, see the module docstring).
    data : an :class:`~moescope.explore.rl_data.RLCalibration` (every row once, its sampled
        completion scored, the prompt read as context), or anything
        :func:`~moescope.explore.calibration.calibration_batches` reads (``n_tokens`` of it,
        every token after a row's first scored).
    tokenizer, n_tokens, batch_size, seq_len, seed : as for
        :func:`~moescope.explore.routing.collect_routing`.
    progress : show a tqdm progress bar.

    The model runs in eval mode with its parameters' ``requires_grad`` off; both are restored. A
    model whose decoder layers are read when used (layer-sequential) is run a layer at a time in
    the backward too (see the module docstring): each batch reads every layer twice, however
    many chunks of rows its layers run.
    """
    from tqdm.auto import tqdm

    moe = adapt(model)
    if not supports_taylor(moe):
        raise MoescopeError(
            f"the taylor selection scales each expert's routed output, and {moe.spec.model_type} "
            "scales the expert input instead; choose --method reap or paper for this model."
        )
    batches = _scored_batches(data, tokenizer, n_tokens, batch_size, seq_len, seed)
    sums = torch.zeros(len(moe.layers), moe.num_experts, dtype=torch.float64)
    sequences = tokens = 0
    device = execution_device(model)
    dtype = torch.promote_types(next(model.parameters()).dtype, torch.float32)
    with _frozen(model):
        for batch in tqdm(batches, desc="taylor", unit="batch", disable=not progress):
            batch = {name: t.to(device) for name, t in batch.items()}
            for row, grad in enumerate(_scale_gradients(model, moe, batch, dtype)):
                if grad is not None:
                    sums[row] += grad.double().abs().sum(0).cpu()
            sequences += len(batch["input_ids"])
            tokens += int(batch["scored"][:, 1:].sum())
    if tokens == 0:
        raise MoescopeError("the calibration data holds no scored token; give rows of two tokens or more.")
    return TaylorImportance(
        layers=tuple(layer.index for layer in moe.layers),
        num_experts=moe.num_experts,
        config_hash=config_hash(moe.config),
        sums=sums.numpy(),
        sequences=sequences,
        tokens=tokens,
    )


def _scored_batches(
    data: Any, tokenizer: Any, n_tokens: int, batch_size: int, seq_len: int, seed: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Right-padded batches with ``scored``: RL completions, else every real token. RL rows are
    batched in order of length, longest first: each row's sum is its own, so the order changes
    no figure, and rows of one length waste no position on padding (the toy-v3 calibration's
    1,152 rows of 10 to 31 tokens: 1.62 positions per real token in batches of 16 as sampled,
    1.01 sorted); a layer-sequential model's batch, which takes many, runs its chunks of
    shorter rows on their own positions (:func:`~moescope.models.row_chunks.trailing_padding`)."""
    if isinstance(data, RLCalibration):
        pairs = sorted(data.pairs(), key=lambda pair: len(pair[0]) + len(pair[1]))[::-1]
        pad = getattr(tokenizer, "pad_token_id", None) or 0
        yield from (pad_scored(pairs[i : i + batch_size], pad) for i in range(0, len(pairs), batch_size))
        return
    batches = calibration_batches(
        data, tokenizer, n_tokens=n_tokens, batch_size=batch_size, seq_len=seq_len, seed=seed
    )
    for batch in batches:
        yield {**batch, "scored": batch["attention_mask"].bool()}


def _scale_gradients(
    model: Any, moe: MoEModel, batch: dict[str, torch.Tensor], dtype: torch.dtype
) -> tuple[torch.Tensor | None, ...]:
    """Per MoE layer, ``(rows, E)``: ``∂ log p(scored tokens of the row) / ∂ m[row, e]`` of one
    batch (None for a layer no scored token depends on).

    The multipliers stay on the experts through the backward: a layer run again from its input
    (layer-sequential) must compute what its forward computed.
    """
    rows, width = batch["input_ids"].shape
    scales = [
        torch.ones(rows, moe.num_experts, device=batch["input_ids"].device, dtype=dtype, requires_grad=True)
        for _ in moe.layers
    ]
    extra = (
        {"use_cache": False} if _takes(model.forward, "use_cache") else {}
    )  # a layer run again would write twice
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], **extra}
    ids, scored = batch["input_ids"], batch["scored"]
    lengths = real_lengths(batch["attention_mask"])  # the likelihood reads no padded position
    with _scaled_experts(moe, scales, width), layers_read_for_backward(), trailing_padding(lengths):
        if not head_runs_apart(model):
            return torch.autograd.grad(
                _log_likelihood(model(**inputs).logits, ids, scored, dtype), scales, allow_unused=True
            )
        head = model.get_output_embeddings()
        hidden = head_input(model, inputs)
        with resident(head):  # read once for the forward's chunks, once more for the backward's
            likelihood = read_again_for_backward(
                head, hidden, lambda h: _chunked_likelihood(model, own_forward(head), h, ids, scored, dtype)
            )
        return torch.autograd.grad(likelihood, scales, allow_unused=True)


def _log_likelihood(
    logits: torch.Tensor, ids: torch.Tensor, scored: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``Σ log p(next token)`` over the scored positions of ``(rows, T, V)`` logits."""
    log_p = torch.log_softmax(logits[:, :-1].to(dtype), dim=-1)
    picked = log_p.gather(-1, ids[:, 1:, None])[..., 0]
    return (picked * scored[:, 1:].to(dtype)).sum()


def _chunked_likelihood(
    model: Any,
    head: Any,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    scored: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """:func:`_log_likelihood` of ``head(hidden)``, a chunk of rows at a time, each chunk run
    again in the backward (activation checkpointing): a chunk's logits at a time in memory."""
    from torch.utils.checkpoint import checkpoint

    rows, width = ids.shape
    size = head_rows(model, width, 16)  # logits, log-softmax and the gradients of both

    def chunk(part: torch.Tensor, part_ids: torch.Tensor, part_scored: torch.Tensor) -> torch.Tensor:
        return _log_likelihood(head(part), part_ids, part_scored, dtype)

    parts = [slice(start, start + size) for start in range(0, rows, size)]
    return sum(
        checkpoint(chunk, hidden[part], ids[part], scored[part], use_reentrant=False) for part in parts
    )


def _takes(function: Any, name: str) -> bool:
    """Whether ``function`` takes a keyword ``name``, itself or through ``**kwargs`` (some models'
    forwards pass ``use_cache`` on that way, and create a cache when it is not given)."""
    params = inspect.signature(function).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


@contextmanager
def _frozen(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode, no parameter gradients, gradients on: restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    was_training = model.training
    try:
        model.eval().requires_grad_(False)
        with torch.enable_grad():
            yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)


@contextmanager
def _scaled_experts(moe: MoEModel, scales: list[torch.Tensor], width: int) -> Iterator[None]:
    """Every MoE layer's routing weights times ``scales[layer][sequence, expert]``."""
    handles = [
        layer.experts.register_forward_pre_hook(_scaling_hook(scale, width), with_kwargs=True)
        for layer, scale in zip(moe.layers, scales, strict=True)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _scaling_hook(scale: torch.Tensor, width: int) -> Any:
    def hook(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        values = [*args, *(kwargs[name] for name in _WEIGHTS[len(args) :] if name in kwargs)]
        index, weights = values[1], values[2]
        sequence = torch.arange(index.shape[0], device=index.device) // chunk_width(width) + row_offset()
        scaled = weights * scale[sequence[:, None], index].to(weights.dtype)
        if len(args) > 2:
            return (*args[:2], scaled, *args[3:]), kwargs
        return args, {**kwargs, _WEIGHTS[2]: scaled}

    return hook
