"""Clustering experts into a selection: which routed experts a proxy keeps in each MoE layer.

:class:`ExpertClusterer` is a scikit-learn estimator over the experts of one layer. It groups
them into ``n_clusters`` clusters and names one representative per cluster: **the member
nearest its cluster centre** (the weighted mean of the members; cosine or Euclidean distance,
as ``metric`` says); ties go to the member with the larger sample weight (routed tokens), then
to the lower index.

:func:`select_experts` turns a model (or its :class:`~moescope.explore.embeddings.ExpertEmbeddings`)
into a :class:`Selection`, the ``selection.json`` artifact, by one of the methods of
:mod:`moescope.explore.methods`, whose registry names the selector here that runs it:

- ``cluster``: cluster each layer into ``keep`` clusters and keep the representatives;
- ``paper``: K-Medoids on fused router, co-activation and routed-context distances, keeping
  each cluster's member of largest routed contribution (:mod:`moescope.explore.paper`);
- ``frequency``: keep the most-routed experts (``RoutingStats.counts``);
- ``reap``: keep the highest REAP saliency (mean gate weight × output norm over routed tokens);
- ``taylor``: keep the experts whose removal changes the likelihood of the sampled completions
  most, to first order (:mod:`moescope.explore.taylor`);
- ``random``: keep a seeded uniform draw.

Constraints (transformers configs hold one expert count; see the reference, §3.3–3.4): every
MoE layer keeps the same number of experts, more than top-k (exactly top-k only with
``allow_top_k``). Under grouped routing (DeepSeek-V3 style, ``n_group > 1``) the experts form
``n_group`` contiguous groups and every group keeps ``keep / n_group`` of its own, so the kept
count divides by ``n_group``, each group keeps at least two (a group is scored by its best
two) and routing stays group-limited; ``cluster`` and ``paper`` then cluster each group on its own.

Examples
--------
>>> from moescope.models.zoo import tiny
>>> sel = select_experts(tiny("mixtral"), "1/2", method="cluster")
>>> sel.keep, len(sel.kept(0))
(4, 4)
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope._util.threads import single_threaded
from moescope.errors import MoescopeError
from moescope.explore.embeddings import (
    ExpertEmbeddings,
    check_stats,
    embed_experts,
    model_facts,
)
from moescope.explore.methods import METHODS, Method
from moescope.explore.methods import method as method_named
from moescope.explore.paper import (
    check_view_data,
    default_views,
    paper_layers,
    paper_params,
    paper_views,
)
from moescope.explore.selection import LayerSelection, Selection
from moescope.explore.taylor import TaylorImportance
from moescope.keep import Keep
from moescope.models.view import MoEModel, adapt

try:
    from sklearn.base import BaseEstimator, ClusterMixin, clone
    from sklearn.cluster import AgglomerativeClustering, KMeans
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils.validation import validate_data
except ImportError:  # pragma: no cover - the analysis extra is missing
    raise MoescopeError(
        "expert clustering needs scikit-learn 1.6 or newer; install it with pip install 'moescope[analysis]'."
    ) from None

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.explore.routing import RoutingStats

CLUSTER_METHODS = ("agglomerative", "kmeans")
LINKAGES = ("average", "complete", "single", "ward")
METRICS = ("cosine", "euclidean")
SCORES = {m.name: m.score for m in METHODS.values()}
"""What each method's scores mean (:attr:`moescope.explore.methods.Method.score`)."""
_TIE_DECIMALS = 9  # distances equal to this many decimals are a tie


class ClusteringError(MoescopeError, ValueError):
    """Invalid clusterer parameters or input (a ``ValueError``, as scikit-learn expects)."""


class ExpertClusterer(ClusterMixin, BaseEstimator):
    """Cluster the experts of one layer and pick one representative per cluster.

    Parameters
    ----------
    n_clusters : number of clusters (experts kept).
    method : ``agglomerative`` (deterministic) or ``kmeans`` (4 seeded restarts).
    linkage : agglomerative linkage: ``average``, ``complete``, ``single`` or ``ward``.
    metric : ``cosine`` (rows scaled to unit length first) or ``euclidean``. Ward and k-means
        work on the scaled rows under ``cosine``.
    random_state : seed of k-means.

    Attributes
    ----------
    labels_ : ``(E,)`` cluster of each expert; clusters are numbered by their lowest member.
    representatives_ : ``(n_clusters,)`` expert index representing each cluster.
    cluster_centers_ : ``(n_clusters, D)`` weighted mean of the members (scaled rows for cosine).
    distances_ : ``(E,)`` distance of each expert to its cluster centre.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]])
    >>> est = ExpertClusterer(n_clusters=2).fit(X)
    >>> est.labels_.tolist(), est.representatives_.tolist()
    ([0, 0, 1, 1], [0, 2])
    """

    def __init__(
        self,
        n_clusters: int = 8,
        method: str = "agglomerative",
        linkage: str = "average",
        metric: str = "cosine",
        random_state: int | np.random.RandomState | None = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.method = method
        self.linkage = linkage
        self.metric = metric
        self.random_state = random_state

    def fit(self, X: Any, y: None = None, sample_weight: Any = None) -> ExpertClusterer:
        """Cluster ``X`` ``(E, D)``; ``sample_weight`` ``(E,)`` (routed tokens) weights the
        centres and k-means, and breaks representative ties."""
        self._check_params()
        X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=2)
        if self.n_clusters > X.shape[0]:
            raise ClusteringError(
                f"n_clusters={self.n_clusters} is more than the {X.shape[0]} experts given; "
                "ask for at most that many clusters."
            )
        weight = _sample_weight(sample_weight, X.shape[0])
        z = _unit_rows(X) if self.metric == "cosine" else X.astype(np.float64)
        with single_threaded():
            labels = _fill_clusters(_canonical(self._labels(z, weight)), z, self.n_clusters)
            self.labels_ = labels
            self.cluster_centers_ = _centres(z, labels, weight, self.n_clusters)
            self.distances_ = _distances_to(z, self.cluster_centers_[labels], self.metric)
            self.representatives_ = _representatives(labels, self.distances_, weight, self.n_clusters)
        return self

    def _check_params(self) -> None:
        n = self.n_clusters
        if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1:
            raise ClusteringError(f"n_clusters={n!r} must be a positive whole number.")
        for name, allowed in (("method", CLUSTER_METHODS), ("linkage", LINKAGES), ("metric", METRICS)):
            if getattr(self, name) not in allowed:
                raise ClusteringError(
                    f"unknown {name} {getattr(self, name)!r}; choose one of {', '.join(allowed)}."
                )

    def _labels(self, z: np.ndarray, weight: np.ndarray) -> np.ndarray:
        if self.method == "kmeans":
            km = KMeans(self.n_clusters, n_init=4, random_state=self.random_state)
            with warnings.catch_warnings():  # coinciding experts: _fill_clusters opens the empty clusters
                warnings.simplefilter("ignore", ConvergenceWarning)
                return km.fit(z, sample_weight=weight).labels_
        if self.linkage == "ward":
            return AgglomerativeClustering(self.n_clusters, linkage="ward").fit(z).labels_
        agg = AgglomerativeClustering(self.n_clusters, metric="precomputed", linkage=self.linkage)
        return agg.fit(_pairwise(z, self.metric)).labels_


def _sample_weight(sample_weight: Any, n: int) -> np.ndarray:
    """``(n,)`` non-negative weights, not all zero."""
    if sample_weight is None:
        return np.ones(n)
    weight = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
    if weight.shape != (n,) or not np.all(np.isfinite(weight)) or np.any(weight < 0):
        raise ClusteringError(f"sample_weight must hold {n} finite non-negative numbers, one per expert.")
    if not weight.any():
        raise ClusteringError("sample_weight is zero for every expert; pass None to weigh them equally.")
    return weight


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def _pairwise(z: np.ndarray, metric: str) -> np.ndarray:
    """``(E, E)`` distances; ``z`` already has unit rows under ``cosine``."""
    if metric == "cosine":
        d = 1.0 - z @ z.T
    else:
        sq = (z * z).sum(1)
        d = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * z @ z.T, 0.0))
    np.fill_diagonal(d, 0.0)
    return np.clip(d, 0.0, None)


def _distances_to(z: np.ndarray, centres: np.ndarray, metric: str) -> np.ndarray:
    """``(E,)`` distance of each row of ``z`` to its own centre row."""
    if metric == "cosine":
        return 1.0 - (z * _unit_rows(centres)).sum(1)
    return np.linalg.norm(z - centres, axis=1)


def _canonical(labels: np.ndarray) -> np.ndarray:
    """Renumber clusters by their lowest member, so equal partitions get equal labels."""
    values, first = np.unique(labels, return_index=True)
    rank = np.empty(values.max() + 1, dtype=np.int64)
    rank[values[np.argsort(first)]] = np.arange(len(values))
    return rank[labels]


def _fill_clusters(labels: np.ndarray, z: np.ndarray, k: int) -> np.ndarray:
    """Guarantee ``k`` clusters: k-means can leave some empty when experts coincide, so the
    farthest member of the largest cluster opens each missing one."""
    labels = labels.copy()
    for new in range(labels.max() + 1, k):
        members = np.flatnonzero(labels == np.bincount(labels).argmax())
        spread = np.linalg.norm(z[members] - z[members].mean(0), axis=1)[::-1]
        labels[members[len(members) - 1 - np.argmax(spread)]] = new  # ties: the highest index moves
    return _canonical(labels)


def _centres(z: np.ndarray, labels: np.ndarray, weight: np.ndarray, k: int) -> np.ndarray:
    """``(k, D)`` weighted member means (unweighted where a cluster's weights sum to 0)."""
    onehot = np.zeros((k, len(labels)))
    onehot[labels, np.arange(len(labels))] = 1.0
    weighted = onehot * weight
    totals = weighted.sum(1, keepdims=True)
    use = np.where(totals > 0, weighted, onehot)
    return (use @ z) / use.sum(1, keepdims=True)


def _representatives(labels: np.ndarray, dist: np.ndarray, weight: np.ndarray, k: int) -> np.ndarray:
    """Per cluster: nearest the centre, then the larger weight, then the lower index."""
    order = np.lexsort((np.arange(len(labels)), -weight, np.round(dist, _TIE_DECIMALS), labels))
    first = np.unique(labels[order], return_index=True)[1]
    return order[first][:k]


# --- selecting -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """The facts of the source model a selection needs."""

    layers: tuple[int, ...]
    num_experts: int
    config_hash: str
    model_type: str
    top_k: int
    n_group: int
    topk_group: int

    def kept(self, keep: str | float | int | Keep, allow_top_k: bool) -> Keep:
        """``keep`` checked against this model's routing (:class:`~moescope.keep.Keep`)."""
        e, k, groups = self.num_experts, self.top_k, self.n_group
        return Keep.parse(keep, e, k, groups, allow_top_k=allow_top_k, topk_group=self.topk_group)


@dataclass(frozen=True)
class SelectionRequest:
    """What a method's selector reads (:attr:`moescope.explore.methods.Method.selector`): the
    source, the kept count, and what was gathered for it (``None`` where not gathered)."""

    obj: Any
    method: Method
    k: int
    source: _Source
    seed: int
    embeddings: ExpertEmbeddings | None = None
    stats: RoutingStats | None = None
    clusterer: ExpertClusterer | None = None
    views: Any = None
    view_weights: Any = None
    routers: Mapping[int, np.ndarray] | None = None
    taylor: TaylorImportance | None = None


Chosen = tuple[list[LayerSelection], str | None, dict[str, Any]]  # layers, view, params


def select_experts(
    model_or_embeddings: PreTrainedModel | MoEModel | ExpertEmbeddings,
    keep: str | float | int | Keep,
    *,
    method: str = "cluster",
    embeddings: ExpertEmbeddings | None = None,
    stats: RoutingStats | None = None,
    clusterer: ExpertClusterer | None = None,
    seed: int = 0,
    allow_top_k: bool = False,
    views: str | Sequence[str] | None = None,
    view_weights: str | Sequence[float] | None = None,
    routers: Mapping[int, np.ndarray] | None = None,
    taylor: TaylorImportance | None = None,
) -> Selection:
    """Choose the experts a proxy keeps in every MoE layer.

    Parameters
    ----------
    model_or_embeddings : the source model, or embeddings of it (enough for ``cluster`` and,
        with ``stats``, for the baselines).
    keep : fraction, ratio or count (:func:`~moescope.keep.parse_keep`), or a :class:`~moescope.keep.Keep`
        already parsed for this model.
    method : one of ``METHODS`` (what each reads: :mod:`moescope.explore.methods`).
    embeddings : vectors to cluster; default ``embed_experts(model, "multiview", stats=stats,
        seed=seed)``.
    stats : routing statistics of the model; needed by ``frequency`` and ``reap``. Under
        ``cluster`` their token counts weight the centres and break representative ties.
    clusterer : template estimator; its ``n_clusters`` and ``random_state`` are set per layer
        (per group under grouped routing) from ``keep`` and ``seed``. Default agglomerative,
        average linkage, cosine.
    seed : seed of the embeddings, k-means, K-Medoids and the random baseline.
    allow_top_k : accept keeping exactly top-k experts.
    views, view_weights : ``paper`` only: the distance views fused (default by the router,
        :func:`~moescope.explore.paper.default_views`) and one weight per view (default 1 each).
    routers : ``paper`` only: ``{decoder layer: (E, H)}`` router rows, for a model whose weights
        are not in memory (read during a layer-sequential pass); default the model's own.
    taylor : ``taylor`` only: the model's :class:`~moescope.explore.taylor.TaylorImportance`.
    """
    spec = _check_method(method, views, view_weights)
    source = _source(model_or_embeddings)
    k = source.kept(keep, allow_top_k).fixed()
    if stats is not None:
        check_stats(stats, source.config_hash, source.layers)
    request = SelectionRequest(
        model_or_embeddings,
        spec,
        k,
        source,
        seed,
        embeddings,
        stats,
        clusterer,
        views,
        view_weights,
        routers,
        taylor,
    )
    layers, view, params = spec.select(request)
    facts = {name: getattr(source, name) for name in ("num_experts", "top_k", "n_group", "model_type")}
    return Selection(
        method=method,
        view=view,
        seed=seed,
        keep=k,
        keep_ratio=k / source.num_experts,
        config_hash=source.config_hash,
        layers=tuple(layers),
        params=params,
        **facts,
    )


def _source(obj: Any) -> _Source:
    if isinstance(obj, ExpertEmbeddings):
        fields = ("layers", "num_experts", "config_hash", "model_type", "top_k", "n_group", "topk_group")
        return _Source(**{name: getattr(obj, name) for name in fields})
    return _Source(**model_facts(obj if isinstance(obj, MoEModel) else adapt(obj)))


def _check_method(name: str, views: Any, view_weights: Any) -> Method:
    spec = method_named(name)
    if not spec.views and (views is not None or view_weights is not None):
        fused = ", ".join(m.name for m in METHODS.values() if m.views)
        raise MoescopeError(f"views and view weights apply to method {fused!r}, not {name!r}; drop them.")
    return spec


# --- the selectors the registry names (moescope.explore.methods) ----------------------------------


def select_clustered(r: SelectionRequest) -> Chosen:
    """``cluster``: each layer (each group) clustered into its share; the representatives kept."""
    emb = _embeddings_for(r.obj, r.embeddings, r.stats, r.seed, r.source)
    template = clone(r.clusterer) if r.clusterer is not None else ExpertClusterer()
    layers = _cluster_layers(emb, r.k, r.source, template, r.seed, r.stats)
    clusterer = {"class": type(template).__name__, **_json_params(template)}
    return layers, emb.view, {"score": r.method.score, "clusterer": clusterer}


def select_paper(r: SelectionRequest) -> Chosen:
    """``paper``: K-Medoids on the fused distance views; the view name joins the views by ``+``."""
    obj = r.obj
    moe = None if isinstance(obj, ExpertEmbeddings) else obj if isinstance(obj, MoEModel) else adapt(obj)
    views, routers = r.views, r.routers
    if views is None:
        views = default_views(None if moe is None else moe.rule.scoring)
    names, weights = paper_views(views, r.view_weights)
    if routers is None and "router" in names and moe is not None:
        routers = _router_rows(moe)
    check_view_data(names, r.stats, has_router=routers is not None)
    layers = paper_layers(r.source.layers, r.source.n_group, r.k, r.stats, routers, names, weights)
    return layers, "+".join(names), {"score": r.method.score, **paper_params(names, weights)}


def select_most_routed(r: SelectionRequest) -> Chosen:
    """``frequency``: the most-routed experts of each group."""
    return _ranked(r, _stats_rows(r, lambda stats: stats.counts))


def select_most_salient(r: SelectionRequest) -> Chosen:
    """``reap``: the experts of largest REAP saliency in each group."""
    return _ranked(r, _stats_rows(r, lambda stats: stats.saliency))


def select_taylor(r: SelectionRequest) -> Chosen:
    """``taylor``: the experts of largest Taylor importance in each group."""
    return _ranked(r, _taylor_scores(r.taylor, r.source))


def select_random(r: SelectionRequest) -> Chosen:
    """``random``: a seeded uniform draw in each group."""
    return _ranked(r, np.random.default_rng(r.seed).random((len(r.source.layers), r.source.num_experts)))


def _ranked(r: SelectionRequest, scores: np.ndarray) -> Chosen:
    return _baseline_layers(scores, r.k, r.source), None, {"score": r.method.score}


def _router_rows(moe: MoEModel) -> dict[int, np.ndarray]:
    """``{decoder layer: (E, H)}`` router rows of a model."""
    return {layer.index: layer.router_weight.detach().float().cpu().numpy() for layer in moe.layers}


def _embeddings_for(
    obj: Any, embeddings: ExpertEmbeddings | None, stats: Any, seed: int, source: _Source
) -> ExpertEmbeddings:
    emb = embeddings if embeddings is not None else obj if isinstance(obj, ExpertEmbeddings) else None
    if emb is None:
        return embed_experts(obj, "multiview", stats=stats, seed=seed)
    if emb.config_hash != source.config_hash or emb.layers != source.layers:
        raise MoescopeError(
            f"the embeddings were computed on model config {emb.config_hash} (layers {list(emb.layers)}), "
            f"not {source.config_hash}; embed this model's experts with embed_experts."
        )
    return emb


def _cluster_layers(
    emb: ExpertEmbeddings, k: int, source: _Source, template: ExpertClusterer, seed: int, stats: Any
) -> list[LayerSelection]:
    """Cluster every layer (every contiguous group under grouped routing) into its share of ``k``."""
    n_group, size = source.n_group, source.num_experts // source.n_group
    per = k // n_group
    template.set_params(n_clusters=per, random_state=seed)
    out = []
    for row, layer in enumerate(emb.layers):
        counts = None if stats is None else np.asarray(stats.counts[stats.layer_index(layer)], np.float64)
        labels, scores, kept = [], [], []
        for g in range(n_group):
            block = slice(g * size, (g + 1) * size)
            unrouted = counts is None or not counts[block].any()
            est = clone(template).fit(
                emb.vectors[row, block], sample_weight=None if unrouted else counts[block]
            )
            labels.extend((est.labels_ + g * per).tolist())
            scores.extend((0.0 - est.distances_).tolist())
            kept.extend((est.representatives_ + g * size).tolist())
        out.append(LayerSelection(layer, tuple(sorted(kept)), tuple(labels), tuple(scores)))
    return out


def _stats_rows(r: SelectionRequest, table: Callable[[RoutingStats], Any]) -> np.ndarray:
    """``(L, E)`` the routing statistic a ranking method ranks experts by."""
    stats = r.stats
    if stats is None:
        raise MoescopeError(
            f"the {r.method.name} selection needs routing statistics; pass stats= (a RoutingStats "
            "of this model) or use method='cluster' or 'random'."
        )
    return _finite_rows(table(stats), [stats.layer_index(layer) for layer in r.source.layers])


def _taylor_scores(taylor: TaylorImportance | None, source: _Source) -> np.ndarray:
    """``(L, E)`` Taylor importance of the source's MoE layers, checked to be this model's."""
    if taylor is None:
        raise MoescopeError(
            "the taylor selection needs the model's expert Taylor importance; pass "
            "taylor=moescope.explore.taylor.taylor_importance(model, data)."
        )
    if taylor.config_hash != source.config_hash or not set(source.layers) <= set(taylor.layers):
        raise MoescopeError(
            f"the Taylor importance was measured on model config {taylor.config_hash} (layers "
            f"{list(taylor.layers)}), not this one; measure it on this model."
        )
    return _finite_rows(taylor.sums, [taylor.layer_index(layer) for layer in source.layers])


def _finite_rows(table: Any, rows: list[int]) -> np.ndarray:
    """``table``'s ``rows`` (one per MoE layer of the source) as float64, a non-finite score as 0."""
    return np.nan_to_num(np.asarray(table, dtype=np.float64)[rows], nan=0.0, posinf=0.0, neginf=0.0)


def _baseline_layers(scores: np.ndarray, k: int, source: _Source) -> list[LayerSelection]:
    """Keep the top ``k / n_group`` scores of every group (ties: the lower index); each kept
    expert is its own cluster, numbered in id order, the others ``-1``."""
    n_layers, n_experts, n_group = *scores.shape, source.n_group
    grouped = scores.reshape(n_layers, n_group, n_experts // n_group)
    top = np.argsort(-grouped, axis=2, kind="stable")[:, :, : k // n_group]
    kept = np.sort((top + np.arange(n_group)[:, None] * (n_experts // n_group)).reshape(n_layers, k), axis=1)
    out = []
    for layer, row_kept, row_scores in zip(source.layers, kept, scores, strict=True):
        labels = np.full(n_experts, -1)
        labels[row_kept] = np.arange(k)
        out.append(
            LayerSelection(
                layer, tuple(row_kept.tolist()), tuple(labels.tolist()), tuple(row_scores.tolist())
            )
        )
    return out


def _json_params(estimator: BaseEstimator) -> dict[str, Any]:
    """The estimator's parameters, with anything that is not plain JSON written as text."""
    return {
        key: value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        for key, value in estimator.get_params().items()
    }
