"""The paper's selection (method ``paper``): three expert-distance views, fused, then K-Medoids.

Per MoE layer, three ``(E, E)`` distances between routed experts (``PAPER_VIEWS``):

- ``router``: cosine distance between the experts' router weight rows (static preference);
- ``coactivation``: ``1 - C_ij / sqrt(C_ii C_jj)``, where ``C`` counts the tokens that chose
  both experts (the diagonal: each expert's routed tokens); 0 for two experts always chosen
  together, 1 for two never chosen together (or one never chosen at all);
- ``context``: cosine distance between the experts' *routed context*, the gate-weighted mean
  of the hidden states routed to each one (``RoutingStats.routed_context``, running sums of
  the calibration pass).

Router rows are centred on the layer's mean row first: a component every row shares shifts
every logit alike, which a softmax router ignores, and would otherwise dominate the cosine.
Routed contexts are compared as they are: centring them on the layer's mean context lost
capability on the embedded toy (context view alone, keep 1/2: 0.48 against 0.69 uncentred).
An expert with no routed token has a zero context, at distance 1 from every other.

Each view is normalised by its mean off-diagonal entry over the experts clustered together,
so every view averages 1 and the weights alone say how much each counts. The fused distance
is ``Σ_v w_v · D_v / Σ_v w_v`` over the views asked for (``DEFAULT_VIEWS`` unless given), each
weighing 1 unless weights are given. K-Medoids (FasterPAM of the maintained ``kmedoids``
package) clusters the experts on it into as many clusters as experts are kept, its medoids
initialised with the most important experts, on distances rounded to a binary grid (:data:`GRID`)
so that every swap's gain is summed exactly; each cluster then keeps its most important
member (ties: the medoid, then the lower id), so the representative a proxy keeps is one that
carried weight, not merely a central one.

*Importance* is an expert's routed contribution over the calibration pass, ``Σ gate weight ×
‖expert output‖`` over its routed tokens (``RoutingStats.saliency_sum``): its routed tokens
times its REAP saliency. The paper prefers the most frequently routed experts; on the embedded
toy, routed tokens as importance kept 0.10 of the accuracy at keep 1/2 where the routed
contribution kept 0.56 (three views, equal weights), and frequency alone is the weakest
baseline there. The default views depend on the router (:func:`default_views`). Under a
softmax (or any non-sigmoid) router, the router view alone: on the toy it kept 0.78 (1/2) and
0.35 (1/4), all three views at equal weights 0.56 and 0.14, co-activation alone 0.24 and 0.23,
router and context (calibrated on the replay's RL data) 0.59 and 0.14 (``bench/paper_selection.py``;
the documentation's *The method*, *the paper's selection*). Under a sigmoid router (DeepSeek-V3's
family), router and context together: on toy-v3 (top-6 of 64) they kept 0.32 against the
router's 0.24 at 1/4 and 0.60 against 0.48 at 1/2 (``--model toy-v3 --calibration rl``), and
healed to the capability target in fewer steps.
One model of each family decided this; name the views to choose otherwise.

Under grouped routing every contiguous expert group is clustered on its own into its equal
share of the kept count, as the ``cluster`` method does. The method and its inputs follow the
public summary of the seed paper (arXiv 2608.10823); the normalisation, the centring and the
representative rule are moescope's choices, measured on the embedded toy (the documentation's *The method*).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope._util.threads import single_threaded
from moescope.errors import MoescopeError
from moescope.explore.selection import LayerSelection

if TYPE_CHECKING:
    from moescope.explore.stats import RoutingStats

PAPER_VIEWS = ("router", "coactivation", "context")
"""The distance views of the ``paper`` method, in the order weights are given."""

DEFAULT_VIEWS = ("router",)
"""The views fused when none are named and the router is not a sigmoid one: the best on the
embedded toy (module docstring)."""

SIGMOID_VIEWS = ("router", "context")
"""The views fused when none are named under a sigmoid router (DeepSeek-V3's family): the best
on toy-v3 (module docstring)."""

DEFAULT_VIEW_WEIGHTS = {"router": 1.0, "coactivation": 1.0, "context": 1.0}
"""Weight of each named view in the fused distance when no weights are given."""

NORMALISATION = "each view divided by its mean off-diagonal distance"
REPRESENTATIVE = "the member of each K-Medoids cluster with the largest routed contribution"
_MAX_ITER = 100  # FasterPAM swap rounds; it stops earlier when no swap improves

GRID = 2.0**-20
"""The step the fused distances (averaging 1) are rounded to before K-Medoids. A swap that gains
nothing (two experts trading places as the medoid of a two-expert cluster, say) sums to ±1 ulp
in float arithmetic, and FasterPAM takes it or not by that last bit, which the order of float
sums decides: the same routing sums computed at other shapes (a model read a layer at a time)
then ended in another local optimum. On the grid the sums are exact and such a swap is never
taken: under symmetric relative noise of 1e-9 to 1e-6, FasterPAM's medoids moved on 64–72 of
400 random 16-expert problems, on the grid on none."""


def default_views(scoring: str | None) -> tuple[str, ...]:
    """The views fused when none are named, for a router scoring its logits with ``scoring``
    (:class:`~moescope.models.routers.RoutingRule`; ``None`` when unknown, as for embeddings).

    Example
    -------
    >>> default_views("sigmoid"), default_views("softmax")
    (('router', 'context'), ('router',))
    """
    return SIGMOID_VIEWS if scoring == "sigmoid" else DEFAULT_VIEWS


def paper_views(
    views: str | Sequence[str] | None = None, view_weights: str | Sequence[float] | None = None
) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The views and their weights, checked: ``views`` a subset of ``PAPER_VIEWS`` (names or a
    comma-separated string; default ``DEFAULT_VIEWS``), ``view_weights`` one non-negative number
    per view, not all zero (default ``DEFAULT_VIEW_WEIGHTS``).

    Example
    -------
    >>> paper_views("router,context", "2,1")
    (('router', 'context'), (2.0, 1.0))
    """
    names = _names(DEFAULT_VIEWS if views is None else views)
    if not names or len(set(names)) != len(names):
        raise MoescopeError(
            f"views {list(names)} must name each view at most once and at least one; "
            f"choose from {', '.join(PAPER_VIEWS)}."
        )
    unknown = [name for name in names if name not in PAPER_VIEWS]
    if unknown:
        raise MoescopeError(f"unknown view {unknown[0]!r}; choose from {', '.join(PAPER_VIEWS)}.")
    if view_weights is None:
        return names, tuple(DEFAULT_VIEW_WEIGHTS[name] for name in names)
    weights = _weights(view_weights)
    if len(weights) != len(names):
        raise MoescopeError(
            f"{len(weights)} view weights were given for the {len(names)} views {', '.join(names)}; "
            "give one weight per view."
        )
    if not all(math.isfinite(w) and w >= 0 for w in weights) or not any(weights):
        raise MoescopeError(
            f"view weights {list(weights)} must be finite, non-negative and not all zero; e.g. 1,1,1."
        )
    return names, weights


def _names(views: str | Sequence[str]) -> tuple[str, ...]:
    items = views.split(",") if isinstance(views, str) else list(views)
    return tuple(str(item).strip() for item in items if str(item).strip())


def _weights(view_weights: str | Sequence[float]) -> tuple[float, ...]:
    items = view_weights.split(",") if isinstance(view_weights, str) else list(view_weights)
    try:
        return tuple(float(item) for item in items)
    except (TypeError, ValueError):
        raise MoescopeError(
            f"view weights {view_weights!r} are not numbers; give one per view, e.g. 1,1,1."
        ) from None


def check_view_data(views: Sequence[str], stats: RoutingStats | None, has_router: bool) -> None:
    """Refuse views whose data is missing: statistics for all (importance), the routed-context
    sums for ``context``, the model's router rows for ``router``."""
    if stats is None:
        raise MoescopeError(
            "the paper selection needs routing statistics; pass stats= (a RoutingStats of this model)."
        )
    if "context" in views and stats.context_sum is None:
        raise MoescopeError(
            "the context view needs routed-context sums, which these routing statistics lack (collected "
            "before moescope kept them); collect them again with collect_routing, or drop the context view."
        )
    if "router" in views and not has_router:
        raise MoescopeError(
            "the router view needs the model's router rows; pass the model rather than its embeddings, "
            "or drop the router view."
        )


# --- the views ------------------------------------------------------------------------------------


def cosine_distance(x: np.ndarray, centre: bool = False) -> np.ndarray:
    """``(E, E)`` cosine distance of ``(E, D)`` rows (first centred on their mean with
    ``centre``); a zero row is at distance 1 from every other."""
    x = np.nan_to_num(np.asarray(x, dtype=np.float64))
    if centre:
        x = x - x.mean(axis=0, keepdims=True)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    unit = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    d = 1.0 - unit @ unit.T
    np.fill_diagonal(d, 0.0)
    return np.clip(d, 0.0, 2.0)


def coactivation_distance(coactivation: np.ndarray) -> np.ndarray:
    """``(E, E)`` ``1 - C_ij / sqrt(C_ii C_jj)`` of a co-activation count matrix."""
    c = np.asarray(coactivation, dtype=np.float64)
    scale = np.sqrt(np.outer(np.diag(c), np.diag(c)))
    d = 1.0 - np.divide(c, scale, out=np.zeros_like(c), where=scale > 0)
    np.fill_diagonal(d, 0.0)
    return np.clip(d, 0.0, 1.0)


def layer_distances(
    views: Sequence[str], stats: RoutingStats, layer: int, router_weight: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """``{view: (E, E)}`` raw distances of decoder layer ``layer`` (before normalisation)."""
    row = stats.layer_index(layer)
    out = {}
    for view in views:
        if view == "router":
            out[view] = cosine_distance(router_weight, centre=True)
        elif view == "coactivation":
            out[view] = coactivation_distance(stats.coactivation[row])
        else:
            out[view] = cosine_distance(stats.routed_context[row])
    return out


def normalised(d: np.ndarray) -> np.ndarray:
    """``d`` divided by its mean off-diagonal entry (unchanged when that is 0: all coincide)."""
    n = len(d)
    mean = (d.sum() - np.trace(d)) / (n * (n - 1)) if n > 1 else 0.0
    return d / mean if mean > 0 else d


def fuse(distances: Mapping[str, np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """``Σ_v w_v · normalised(D_v) / Σ_v w_v`` over the views in ``distances`` order."""
    total = sum(w * normalised(d) for w, d in zip(weights, distances.values(), strict=True))
    return total / float(sum(weights))


# --- K-Medoids and the representatives ------------------------------------------------------------


def kmedoids_clusters(distance: np.ndarray, k: int, worth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(E,)`` cluster labels (numbered by lowest member) and ``(k,)`` medoids per label, by
    FasterPAM on ``distance`` (:func:`on_grid`) starting from the ``k`` experts of largest
    ``worth`` (ties: the lower id; :func:`importance`). Deterministic: given its medoids,
    FasterPAM draws nothing."""
    try:
        import kmedoids
    except ImportError:  # pragma: no cover - the analysis extra is missing
        raise MoescopeError(
            "the paper selection needs the kmedoids package; install it with "
            "pip install 'moescope[analysis]'."
        ) from None
    n = len(distance)
    init = np.argsort(-np.asarray(worth, dtype=np.float64), kind="stable")[:k]  # ties: lower id
    if k >= n:
        return np.arange(n), np.arange(n)
    with single_threaded():
        result = kmedoids.fasterpam(on_grid(distance), init, max_iter=_MAX_ITER, n_cpu=1)
    labels, medoids = np.asarray(result.labels, dtype=np.int64), np.asarray(result.medoids, dtype=np.int64)
    order = np.argsort([np.flatnonzero(labels == c).min() for c in range(k)])  # by lowest member
    rank = np.empty(k, dtype=np.int64)
    rank[order] = np.arange(k)
    return rank[labels], medoids[order]


def on_grid(distance: np.ndarray) -> np.ndarray:
    """``distance`` made exactly symmetric and rounded to multiples of :data:`GRID`."""
    d = np.asarray(distance, dtype=np.float64)
    return np.round((d + d.T) / (2 * GRID)) * GRID


def representatives(labels: np.ndarray, medoids: np.ndarray, worth: np.ndarray) -> np.ndarray:
    """Per cluster its most important member (``worth``: :func:`importance`); ties: the
    medoid, then the lower id."""
    worth = np.asarray(worth, dtype=np.float64)
    out = []
    for cluster, medoid in enumerate(medoids):
        members = np.flatnonzero(labels == cluster)
        top = members[worth[members] == worth[members].max()]
        out.append(int(medoid) if medoid in top else int(top.min()))
    return np.asarray(out, dtype=np.int64)


# --- one selection --------------------------------------------------------------------------------


def importance(stats: RoutingStats, layer: int) -> np.ndarray:
    """``(E,)`` what K-Medoids starts from and representatives are chosen by: each expert's
    routed contribution, ``Σ gate weight × ‖expert output‖`` over the tokens routed to it
    (``RoutingStats.saliency_sum``: routed tokens × REAP saliency)."""
    return np.nan_to_num(np.asarray(stats.saliency_sum[stats.layer_index(layer)], dtype=np.float64))


def paper_layers(
    layers: Sequence[int],
    n_group: int,
    keep: int,
    stats: RoutingStats,
    routers: Mapping[int, np.ndarray] | None,
    views: Sequence[str],
    weights: Sequence[float],
) -> list[LayerSelection]:
    """One :class:`LayerSelection` per MoE layer; every routing group keeps ``keep / n_group``.

    ``routers`` maps each decoder layer to its ``(E, H)`` router rows (needed by ``router``).
    Labels are K-Medoids clusters (numbered per group, then offset), scores the importance.
    """
    out = []
    for layer in layers:
        worth = importance(stats, layer)
        raw = layer_distances(views, stats, layer, None if routers is None else routers[layer])
        size, per = len(worth) // n_group, keep // n_group
        labels, kept = [], []
        for g in range(n_group):
            block = slice(g * size, (g + 1) * size)
            fused = fuse({v: d[block, block] for v, d in raw.items()}, weights)
            group_labels, medoids = kmedoids_clusters(fused, per, worth[block])
            labels.extend((group_labels + g * per).tolist())
            kept.extend((representatives(group_labels, medoids, worth[block]) + g * size).tolist())
        out.append(LayerSelection(layer, tuple(sorted(kept)), tuple(labels), tuple(worth.tolist())))
    return out


def paper_params(views: Sequence[str], weights: Sequence[float]) -> dict[str, Any]:
    """What ``selection.json`` records of a ``paper`` selection beside its method."""
    return {
        "views": list(views),
        "view_weights": list(weights),
        "normalisation": NORMALISATION,
        "clustering": "K-Medoids (kmedoids.fasterpam) on the fused distances rounded to 2^-20, "
        "medoids initialised with the most important experts",
        "representative": REPRESENTATIVE,
    }
