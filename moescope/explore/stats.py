"""Routing statistics of one calibration pass: :class:`RoutingStats`, its shares and its file.

The result of :func:`moescope.explore.routing.collect_routing` and of the routing observer, kept
apart from both so that the observer (which builds it) and the public routing module (which
runs the observer) each import it from here. Running sums only: counts, probability mass,
co-activation, saliency, entropy and routed-context totals; the shares and means are properties
derived from them.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope import schema
from moescope._util.io import write_atomic
from moescope.errors import MoescopeError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["RoutingStats"]

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
    context_sum : ``(L, E, H)`` float64 sum over routed slots of gate weight × the MoE block's
        input hidden state (the same gate weight as ``saliency_sum``); ``None`` in files written
        before moescope collected it. The largest array here: 0.85 GB for DeepSeek-V3's
        58 × 256 × 7168, in memory during the pass and in the saved file.
    context_weight : ``(L, E)`` float64 sum of those gate weights (``None`` with ``context_sum``).
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
    context_sum: np.ndarray | None = None
    context_weight: np.ndarray | None = None

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
    def routed_context(self) -> np.ndarray | None:
        """``(L, E, H)`` gate-weighted mean of the hidden states routed to each expert (nan if
        none was), or ``None`` when the statistics hold no routed-context sums."""
        if self.context_sum is None or self.context_weight is None:
            return None
        return _ratio(self.context_sum, np.asarray(self.context_weight)[..., None])

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

    def layer_frame(self) -> pd.DataFrame:
        """One row per MoE layer, indexed by ``layer``: how balanced and how sure its router is.

        Columns: ``dead_experts`` (never chosen), ``load_cv`` (0 = balanced), ``max_load_share``
        (the busiest expert's share of routed slots), ``mean_entropy`` (nats per token) and
        ``max_logit`` (largest raw router logit).

        Example
        -------
        >>> import torch
        >>> from moescope.explore.routing import collect_routing
        >>> from moescope.models.zoo import tiny
        >>> stats = collect_routing(tiny("mixtral"), torch.randint(3, 128, (4, 16)), progress=False)
        >>> list(stats.layer_frame().columns)
        ['dead_experts', 'load_cv', 'max_load_share', 'mean_entropy', 'max_logit']
        """
        import pandas as pd

        columns = {
            "dead_experts": self.dead_experts,
            "load_cv": self.load_cv,
            "max_load_share": self.load_share.max(axis=1),
            "mean_entropy": self.mean_entropy,
            "max_logit": self.max_logit,
        }
        return pd.DataFrame(columns, index=pd.Index(self.layers, name=schema.LAYER))

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
