"""Routing statistics: one calibration pass with forward hooks, aggregated into :class:`RoutingStats`.

:func:`collect_routing` runs token batches through a model inside :func:`observe_routing`,
which hooks every MoE layer found by :func:`moescope.models.view.adapt` and keeps running sums only
(float64 / int64), never activations: memory is ``O(layers × experts × (experts + hidden))``
however long the pass.

What is recorded per MoE layer (padding tokens excluded through the attention mask):

- the top-k experts each token chose, taken from the model's own router output (Llama 4's
  router returns ``(scores, logits)``; its choice is re-taken with the router's own ``topk``);
- the router's per-token distribution over experts (see :attr:`RoutingStats.prob_mass`), its
  entropy, and the largest raw router logit;
- REAP-style saliency: over the routed slots, gate weight × ‖expert output‖₂;
- the routed context: per expert, the sum of gate weight × the MoE block's input over its routed
  slots, and the sum of those gate weights (their ratio is :attr:`RoutingStats.routed_context`).

Saliency costs no extra expert compute where transformers' fused ``grouped_mm`` /
``batched_mm`` experts run (the default): the observer installs a pass-through
``post_expert_norm`` on the experts module, which those implementations call on the per-slot
expert outputs they already computed, and reads the norms there. Elsewhere (the ``eager``
loop, GPU-only kernels, Llama 4's dense experts) it recomputes each routed expert on the
tokens routed to it only, through :meth:`moescope.models.view.MoELayer.expert_forward`.

Example
-------
>>> from moescope.models.zoo import tiny
>>> import torch
>>> stats = collect_routing(tiny("mixtral"), torch.randint(3, 128, (4, 16)), n_tokens=64, progress=False)
>>> stats.counts.sum(axis=1).tolist() == [64 * stats.top_k] * len(stats.layers)
True
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_batches, describe_source
from moescope.explore.observer import RoutingObserver
from moescope.explore.routing_sums import ENTROPY_BINS
from moescope.explore.stats import RoutingStats
from moescope.models.resident import execution_device
from moescope.models.row_chunks import real_lengths, trailing_padding
from moescope.models.view import adapt

__all__ = [
    "ENTROPY_BINS",
    "RoutingObserver",
    "RoutingStats",
    "calibration_batches",
    "collect_routing",
    "observe_routing",
]


@contextmanager
def observe_routing(model: Any) -> Iterator[RoutingObserver]:
    """Hook every MoE layer of ``model`` for the duration of the ``with`` block.

    Every forward pass inside the block (any batch shape, ``generate`` included) adds to the
    observer's sums; padding is read from the ``attention_mask`` the model receives. The hooks
    and the saliency tap are removed on exit, also when the block raises. With gradient
    checkpointing the recomputed forward would be counted twice: observe without it.

    Example
    -------
    >>> from moescope.models.zoo import tiny
    >>> model = tiny("qwen3_moe")
    >>> with observe_routing(model) as obs:
    ...     _ = model(torch.randint(3, 128, (2, 8)))
    >>> obs.stats().n_tokens
    16
    """
    observer = RoutingObserver(adapt(model))
    try:
        observer._install()
        yield observer
    finally:
        observer._remove()


def collect_routing(
    model: Any,
    data: Any,
    *,
    tokenizer: Any = None,
    n_tokens: int = 20_000,
    batch_size: int = 16,
    seq_len: int = 128,
    progress: bool = True,
    seed: int = 0,
) -> RoutingStats:
    """Run a calibration pass and return its :class:`RoutingStats`.

    Parameters
    ----------
    model : a supported transformers MoE causal LM (see :func:`moescope.models.view.adapt`).
    data : ``"tasks"``, a ``.txt`` / ``.jsonl`` path, token ids, or an
        :class:`~moescope.explore.rl_data.RLCalibration` (the RL task's prompts with the model's
        own samples, an export's default ``"rl"`` source; see :func:`calibration_batches`).
    tokenizer : needed for text data.
    n_tokens : token budget, padding excluded (fewer when a finite source runs out).
    batch_size, seq_len : rows per forward pass and longest row.
    progress : show a tqdm progress bar.
    seed : task-suite seed.

    The model runs in eval mode under ``torch.no_grad()``; its training flag is restored after.
    A layer-sequential model's layers run each chunk of a batch's rows on their real positions
    alone (:func:`~moescope.models.row_chunks.trailing_padding`): the padding is not counted anyway.
    """
    from tqdm.auto import tqdm

    batches = calibration_batches(
        data, tokenizer, n_tokens=n_tokens, batch_size=batch_size, seq_len=seq_len, seed=seed
    )
    extra = _forward_kwargs(model)
    vocab = model.get_input_embeddings().num_embeddings
    device = execution_device(model)
    was_training = model.training
    model.eval()
    try:
        with (
            torch.no_grad(),
            observe_routing(model) as observer,
            tqdm(total=n_tokens, unit="tok", desc="routing", disable=not progress) as bar,
        ):
            for batch in batches:
                _check_ids(batch["input_ids"], vocab)
                with trailing_padding(real_lengths(batch["attention_mask"])):  # padding is left out anyway
                    model(**{name: t.to(device) for name, t in batch.items()}, **extra)
                bar.update(int(batch["attention_mask"].sum()))
    finally:
        model.train(was_training)
    return observer.stats(source=describe_source(data, seed))


def _forward_kwargs(model: Any) -> dict[str, Any]:
    """No KV cache, and logits of the last position only: the LM head is not what is measured."""
    params = inspect.signature(model.forward).parameters
    extra: dict[str, Any] = {"use_cache": False} if "use_cache" in params else {}
    if "logits_to_keep" in params:
        extra["logits_to_keep"] = 1
    return extra


def _check_ids(ids: torch.Tensor, vocab: int) -> None:
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise MoescopeError(
            f"Token id {bad} is outside the model's vocabulary of {vocab} ids; tokenize with the model's "
            "own tokenizer."
        )
