"""Routing statistics: one calibration pass with forward hooks, aggregated into :class:`RoutingStats`.

:func:`collect_routing` runs token batches through a model inside :func:`observe_routing`,
which hooks every MoE layer found by :func:`moescope.models.arch.adapt` and keeps running sums only
(float64 / int64), never activations: memory is ``O(layers × experts²)`` however long the pass.

What is recorded per MoE layer (padding tokens excluded through the attention mask):

- the top-k experts each token chose, taken from the model's own router output (Llama 4's
  router returns ``(scores, logits)``; its choice is re-taken with the router's own ``topk``);
- the router's per-token distribution over experts (see :attr:`RoutingStats.prob_mass`), its
  entropy, and the largest raw router logit;
- REAP-style saliency: over the routed slots, gate weight × ‖expert output‖₂.

Saliency costs no extra expert compute where transformers' fused ``grouped_mm`` /
``batched_mm`` experts run (the default): the observer installs a pass-through
``post_expert_norm`` on the experts module, which those implementations call on the per-slot
expert outputs they already computed, and reads the norms there. Elsewhere (the ``eager``
loop, GPU-only kernels, Llama 4's dense experts) it recomputes each routed expert on the
tokens routed to it only, through :meth:`moescope.models.arch.MoELayer.expert_forward`.

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
import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from moescope import schema
from moescope._util.io import write_atomic
from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_batches, describe_source
from moescope.explore.observer import RoutingObserver
from moescope.explore.routing_sums import ENTROPY_BINS
from moescope.models.arch import adapt

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd


__all__ = [
    "ENTROPY_BINS",
    "RoutingObserver",
    "RoutingStats",
    "calibration_batches",
    "collect_routing",
    "observe_routing",
]

_KIND = "moescope.routing_stats"


@dataclass(frozen=True, eq=False)
class RoutingStats:
    """Routing statistics of one calibration pass; ``L`` MoE layers, ``E`` routed experts.

    Attributes
    ----------
    model_type, config_hash, source : the model (see :func:`moescope.provenance.config_hash`)
        and a description of the calibration data.
    layers : decoder positions of the MoE layers in the original model (row order).
    num_experts, top_k : routed experts per layer and experts chosen per token.
    n_tokens : tokens through the model, padding excluded.
    passes : ``(L,)`` int64 times each layer routes every token: 1, or more in a looped span of
        layers (Inkling 2 Loop runs layers again with the same modules). Every sum below counts
        each pass; ``routed_tokens = n_tokens × passes``.
    counts : ``(L, E)`` int64 routed slots per expert; each row sums to ``routed_tokens * top_k``.
    prob_mass : ``(L, E)`` float64 summed per-token routing distribution; each row sums to
        ``routed_tokens``. Softmax routers (also DeepSeek-V2, PhiMoE): the softmax probabilities.
        Sigmoid routers (DeepSeek-V3, GLM-4-MoE, MiniMax-M2, LFM2...): the sigmoid scores divided
        by their sum over experts; the selection-only correction bias is left out. Logit-top-k
        routers (GPT-OSS, Granite, Llama 4), whose gates only see the chosen logits: the softmax
        of all logits, i.e. the distribution their top-k gate is a renormalized slice of.
    coactivation : ``(L, E, E)`` int64 tokens that chose both ``i`` and ``j``; diagonal = counts.
    saliency_sum : ``(L, E)`` float64 sum over routed slots of gate weight × ‖expert output‖₂;
        the gate weight is the one the model applies (after renormalization and scaling), the
        expert output is before that weight (for Llama 4, on the unscaled input).
    entropy_sum, entropy_sq_sum : ``(L,)`` float64 sums of per-token entropy (nats) of that
        distribution, and of its square.
    entropy_hist : ``(L, ENTROPY_BINS)`` int64 token counts per entropy bin.
    entropy_edges : ``(ENTROPY_BINS + 1,)`` bin edges, ``0`` to ``ln E``.
    max_logit : ``(L,)`` largest raw router logit; ``expert_max_logit`` ``(L, E)`` per expert
        (``-inf`` for an expert never scored).
    """

    model_type: str
    config_hash: str
    source: str
    layers: tuple[int, ...]
    num_experts: int
    top_k: int
    n_tokens: int
    counts: np.ndarray
    prob_mass: np.ndarray
    coactivation: np.ndarray
    saliency_sum: np.ndarray
    entropy_sum: np.ndarray
    entropy_sq_sum: np.ndarray
    entropy_hist: np.ndarray
    entropy_edges: np.ndarray
    max_logit: np.ndarray
    expert_max_logit: np.ndarray
    passes: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.passes is None:  # statistics of a model without looped layers
            object.__setattr__(self, "passes", np.ones(len(self.layers), dtype=np.int64))

    @property
    def routed_tokens(self) -> np.ndarray:
        """``(L,)`` tokens each layer routed, every pass counted: ``n_tokens × passes``."""
        return self.n_tokens * np.asarray(self.passes, dtype=np.int64)

    @property
    def load_share(self) -> np.ndarray:
        """``(L, E)`` share of routed slots per expert (rows sum to 1)."""
        return _ratio(self.counts, (self.routed_tokens * self.top_k)[:, None])

    @property
    def prob_share(self) -> np.ndarray:
        """``(L, E)`` mean routing probability per expert (rows sum to 1)."""
        return _ratio(self.prob_mass, self.routed_tokens[:, None])

    @property
    def saliency(self) -> np.ndarray:
        """``(L, E)`` mean gate weight × ‖expert output‖ over the expert's routed tokens (nan if none)."""
        return _ratio(self.saliency_sum, self.counts)

    @property
    def mean_entropy(self) -> np.ndarray:
        """``(L,)`` mean per-token routing entropy in nats."""
        return _ratio(self.entropy_sum, self.routed_tokens)

    @property
    def entropy_std(self) -> np.ndarray:
        """``(L,)`` standard deviation of per-token routing entropy."""
        mean_square = _ratio(self.entropy_sq_sum, self.routed_tokens)
        return np.sqrt(np.maximum(mean_square - self.mean_entropy**2, 0.0))

    @property
    def dead_experts(self) -> np.ndarray:
        """``(L,)`` experts never chosen in the pass."""
        return (self.counts == 0).sum(axis=1)

    @property
    def load_cv(self) -> np.ndarray:
        """``(L,)`` coefficient of variation of the per-expert load (0 = perfectly balanced)."""
        return _ratio(self.counts.std(axis=1), self.counts.mean(axis=1))

    def layer_index(self, layer: int) -> int:
        """Row of decoder layer ``layer`` in the ``(L, ...)`` arrays."""
        if layer not in self.layers:
            raise MoescopeError(
                f"Decoder layer {layer} is not an MoE layer of this model; use one of {list(self.layers)}."
            )
        return self.layers.index(layer)

    def to_frame(self) -> pd.DataFrame:
        """Long form, one row per (layer, expert).

        Columns: layer, expert, tokens, load_share, prob_mass, prob_share, saliency, max_logit.
        """
        import pandas as pd

        n_layers, n_experts = self.counts.shape
        return pd.DataFrame(
            {
                schema.LAYER: np.repeat(np.asarray(self.layers, dtype=np.int64), n_experts),
                schema.EXPERT: np.tile(np.arange(n_experts), n_layers),
                "tokens": self.counts.ravel(),
                "load_share": self.load_share.ravel(),
                "prob_mass": self.prob_mass.ravel(),
                "prob_share": self.prob_share.ravel(),
                "saliency": self.saliency.ravel(),
                "max_logit": self.expert_max_logit.ravel(),
            }
        )

    def save(self, path: str | Path) -> Path:
        """Write one ``.npz`` file (arrays plus a JSON header), atomically: temp file, then rename."""
        path = Path(path)
        header = {"kind": _KIND, "schema_version": schema.SCHEMA_VERSION}
        arrays = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, np.ndarray):
                arrays[f.name] = value
            else:
                header[f.name] = list(value) if isinstance(value, tuple) else value
        buffer = io.BytesIO()
        np.savez(buffer, header=np.array(json.dumps(header)), **arrays)
        return write_atomic(path, buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> RoutingStats:
        """Read a file written by :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise MoescopeError(
                f"Routing statistics file {path} does not exist; check the path or run collect_routing."
            )
        try:
            with np.load(path, allow_pickle=False) as npz:
                header = json.loads(str(npz["header"]))
                arrays = {name: npz[name] for name in npz.files if name != "header"}
        except (OSError, ValueError, KeyError):
            header = {}
        if header.get("kind") != _KIND:
            raise MoescopeError(
                f"{path} is not a routing statistics file; pass a file written by RoutingStats.save."
            )
        scalars = {f.name: header[f.name] for f in fields(cls) if f.name in header}
        return cls(**{**scalars, "layers": tuple(scalars["layers"]), **arrays})


def _ratio(num: Any, den: Any) -> np.ndarray:
    """``num / den`` with nan where ``den`` is 0, without warnings."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den == 0, np.nan, num / np.where(den == 0, 1.0, den))


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
    model : a supported transformers MoE causal LM (see :func:`moescope.models.arch.adapt`).
    data : ``"tasks"``, a ``.txt`` / ``.jsonl`` path, or token ids (see :func:`calibration_batches`).
    tokenizer : needed for text data.
    n_tokens : token budget, padding excluded (fewer when a finite source runs out).
    batch_size, seq_len : rows per forward pass and longest row.
    progress : show a tqdm progress bar.
    seed : task-suite seed.

    The model runs in eval mode under ``torch.no_grad()``; its training flag is restored after.
    """
    from tqdm.auto import tqdm

    batches = calibration_batches(
        data, tokenizer, n_tokens=n_tokens, batch_size=batch_size, seq_len=seq_len, seed=seed
    )
    extra = _forward_kwargs(model)
    vocab = model.get_input_embeddings().num_embeddings
    device = next(model.parameters()).device
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
