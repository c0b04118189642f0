"""Clustering experts into a selection: the estimator, the kept count, the methods, the file."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from planted import plant_prototypes
from sklearn.metrics import adjusted_rand_score
from sklearn.utils.estimator_checks import check_estimator

from moescope.errors import MoescopeError
from moescope.explore.clustering import ExpertClusterer, select_experts
from moescope.explore.embeddings import ExpertEmbeddings, embed_experts
from moescope.explore.selection import LayerSelection, Selection
from moescope.keep import parse_keep
from moescope.models.support import spec_for
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny
from moescope.provenance import config_hash


def _planted(arch: str, experts: int, prototypes: int, *, groups: int = 1, seed: int = 0):
    """A tiny ``arch`` model with ``experts`` experts planted as noisy copies of ``prototypes``."""
    model = tiny(arch, **{spec_for(arch).count_key: experts})
    return model, plant_prototypes(model, prototypes, noise=0.3, seed=seed, groups=groups)


def _stats(model, counts: np.ndarray, saliency: np.ndarray | None = None) -> SimpleNamespace:
    """Routing statistics with the given ``(L, E)`` token counts (and saliency)."""
    moe = adapt(model)
    layers = tuple(moe.moe_indices)
    return SimpleNamespace(
        layers=layers,
        num_experts=moe.num_experts,
        top_k=moe.top_k,
        config_hash=config_hash(model.config),
        counts=counts,
        saliency=saliency if saliency is not None else counts / counts.max(),
        layer_index=layers.index,
    )


# --- the estimator -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "estimator",
    [ExpertClusterer(n_clusters=3), ExpertClusterer(n_clusters=3, method="kmeans", random_state=0)],
)
def test_is_a_scikit_learn_estimator(estimator: ExpertClusterer) -> None:
    """scikit-learn's own estimator checks; the array-API check needs SciPy's array-API mode,
    which moescope does not use, and is the only one scikit-learn skips here."""
    check_estimator(estimator, on_skip=None)


def test_representative_is_nearest_the_centre_then_most_routed_then_lowest() -> None:
    x = np.array([[0.0], [1.0], [2.0], [10.0], [12.0], [20.0], [21.0]])
    est = ExpertClusterer(n_clusters=3, metric="euclidean").fit(x)
    assert est.labels_.tolist() == [0, 0, 0, 1, 1, 2, 2]  # numbered by lowest member
    assert est.representatives_.tolist() == [1, 3, 5]  # centre hit; then ties → lowest index
    weighted = ExpertClusterer(n_clusters=3, metric="euclidean").fit(x, sample_weight=[1, 1, 1, 1, 1, 1, 5])
    assert weighted.representatives_.tolist() == [1, 3, 6]  # the busier expert pulls the centre
    np.testing.assert_allclose(weighted.cluster_centers_[2], [(20 + 5 * 21) / 6])


def test_coinciding_experts_still_fill_every_cluster() -> None:
    x = np.repeat(np.eye(2), [5, 3], axis=0)  # two distinct points, four clusters asked
    for method in ("kmeans", "agglomerative"):
        est = ExpertClusterer(n_clusters=4, method=method, random_state=0).fit(x)
        assert len(set(est.labels_)) == 4 and len(set(est.representatives_)) == 4


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"method": "dbscan"}, "unknown method"),
        ({"metric": "l1"}, "unknown metric"),
        ({"n_clusters": 9}, "at most"),
    ],
)
def test_bad_clusterer_input_is_a_value_error(params: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ExpertClusterer(**{"n_clusters": 2, **params}).fit(np.eye(8))


# --- planted structure ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss"])
@pytest.mark.parametrize("view", ["weights", "outputs"])
def test_planted_groups_are_recovered(arch: str, view: str) -> None:
    model, planted = _planted(arch, experts=16, prototypes=4)
    emb = embed_experts(model, view, progress=False)
    for method in ("agglomerative", "kmeans"):
        for row, truth in enumerate(planted):
            labels = ExpertClusterer(4, method=method, random_state=0).fit(emb.vectors[row]).labels_
            assert adjusted_rand_score(truth, labels) >= 0.9, (method, row)


@pytest.mark.parametrize("arch", sorted(set(TINY_ARCHS) - {"mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss"}))
def test_planted_groups_are_recovered_in_every_architecture(arch: str) -> None:
    model, planted = _planted(arch, experts=8, prototypes=4, seed=1)
    probe = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))  # hybrids are slow
    for view in ("weights", "outputs"):
        emb = embed_experts(model, view, probe=probe, progress=False)
        for row, truth in enumerate(planted):
            assert adjusted_rand_score(truth, ExpertClusterer(4).fit(emb.vectors[row]).labels_) >= 0.9


def test_cluster_selection_keeps_one_expert_per_planted_group_under_grouped_routing() -> None:
    model, planted = _planted("deepseek_v3", experts=16, prototypes=8, groups=4)
    sel = select_experts(model, 8, embeddings=embed_experts(model, "weights", progress=False))
    assert (sel.n_group, sel.keep, sel.view) == (4, 8, "weights")
    for entry, truth in zip(sel.layers, planted, strict=True):
        assert sorted(truth[list(entry.kept)]) == list(range(8))  # one per planted group
        assert np.bincount(np.array(entry.kept) // 4).tolist() == [2, 2, 2, 2]  # two per routing group
        assert adjusted_rand_score(truth, entry.labels) == 1.0


# --- the kept count ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keep", "expected"),
    [
        (0.5, 32),
        ("0.25", 16),
        ("1/4", 16),
        (0.125, 8),
        (16, 16),
        ("16", 16),
        (np.int64(9), 9),
        (1.0, 64),
        (0.3, 19),
    ],
)
def test_keep_is_a_fraction_a_ratio_or_a_count(keep, expected: int) -> None:
    assert parse_keep(keep, 64, 4) == expected


def test_keep_rounds_fractions_to_whole_groups() -> None:
    assert parse_keep(0.3, 256, 8, n_group=8, topk_group=4) == 80  # 9.6 per group → 10
    assert parse_keep("1/8", 256, 8, n_group=8, topk_group=4) == 32


@pytest.mark.parametrize(
    ("keep", "kwargs", "match"),
    [
        (9, {}, "more than the layers have; the nearest valid count is 8"),
        (1, {}, "fewer than the top-k=2"),
        ("1/4", {}, "only top-k=2.*allow_top_k=True"),
        (0.01, {}, "no expert at all"),
        (6, {"n_group": 4}, "does not split evenly over the 4 expert groups"),
        (4, {"n_group": 4}, "under 2 per expert group"),
        (4, {"n_group": 2, "topk_group": 1}, "too few for top-k=3 inside the 1 groups"),
        ("a quarter", {}, "not a fraction, ratio or count"),
        ("1/0", {}, "not a fraction, ratio or count"),
        (True, {}, "not a fraction, ratio or count"),
        (2.5, {}, "neither a fraction"),
    ],
)
def test_impossible_keep_is_one_clear_sentence(keep, kwargs: dict, match: str) -> None:
    top_k = 3 if "topk_group" in kwargs else 2
    with pytest.raises(MoescopeError, match=match) as err:
        parse_keep(keep, 8, top_k, **kwargs)
    assert str(err.value).endswith(".") and "\n" not in str(err.value)


def test_keeping_exactly_top_k_is_an_opt_in() -> None:
    assert parse_keep(2, 8, 2, allow_top_k=True) == 2
    sel = select_experts(tiny("mixtral"), 2, method="random", allow_top_k=True)
    assert sel.keep == 2 and all(len(entry.kept) == 2 for entry in sel.layers)


# --- select_experts ------------------------------------------------------------------------------


def test_selection_is_deterministic_under_a_seed() -> None:
    model = tiny("qwen3_moe", num_local_experts=16)
    emb = embed_experts(model, "weights", progress=False)
    kmeans = ExpertClusterer(method="kmeans")
    first = select_experts(model, 0.5, embeddings=emb, clusterer=kmeans, seed=5)
    assert first == select_experts(model, 0.5, embeddings=emb, clusterer=kmeans, seed=5)
    assert first.seed == 5 and first.params["clusterer"]["random_state"] == 5
    assert select_experts(model, 0.5, seed=2) == select_experts(model, 0.5, seed=2)
    random_a, random_b = (select_experts(model, 0.5, method="random", seed=s) for s in (0, 1))
    assert random_a == select_experts(model, 0.5, method="random", seed=0) and random_a != random_b


def test_every_layer_keeps_the_same_sorted_original_ids() -> None:
    model = tiny("deepseek_v3", n_routed_experts=16)
    for method in ("cluster", "random"):
        sel = select_experts(model, "1/2", method=method)
        assert sel.layer_indices == [1, 2] and sel.keep_ratio == 0.5
        for entry in sel.layers:
            assert len(entry.kept) == 8 and list(entry.kept) == sorted(set(entry.kept))
            assert np.bincount(np.array(entry.kept) // 4).tolist() == [2, 2, 2, 2]


def test_frequency_and_reap_rank_by_the_routing_statistics() -> None:
    model = tiny("mixtral")
    counts = np.array([[5, 9, 1, 9, 0, 3, 7, 2], [1, 2, 3, 4, 5, 6, 7, 8]])
    saliency = np.array([[np.nan, 1, 2, 3, 4, 5, 6, 7], [9, 1, 1, 1, 1, 1, 1, 8]])
    stats = _stats(model, counts, saliency)
    frequency = select_experts(model, 3, method="frequency", stats=stats)
    assert frequency.kept(0) == (1, 3, 6) and frequency.kept(1) == (5, 6, 7)  # ties → lower id
    assert frequency.layers[0].labels == (-1, 0, -1, 1, -1, -1, 2, -1)
    assert frequency.layers[0].scores[1] == 9.0 and frequency.params["score"] == "routed tokens"
    reap = select_experts(model, 3, method="reap", stats=stats)
    assert reap.kept(0) == (5, 6, 7) and reap.kept(1) == (0, 1, 7)  # nan (never routed) ranks last
    with pytest.raises(MoescopeError, match="needs routing statistics"):
        select_experts(model, 3, method="reap")


def test_cluster_selection_uses_token_counts_to_break_ties() -> None:
    model = tiny("mixtral")
    x = np.repeat(np.eye(4), 2, axis=0)[None].repeat(2, axis=0).astype(np.float32)  # pairs of twins
    emb = ExpertEmbeddings(
        "weights", (0, 1), 8, config_hash(model.config), 0, x, model_type="mixtral", top_k=2
    )
    assert select_experts(emb, 4).kept(0) == (0, 2, 4, 6)
    counts = np.array([[0, 5, 5, 0, 0, 0, 1, 2]] * 2)
    assert select_experts(model, 4, embeddings=emb, stats=_stats(model, counts)).kept(0) == (1, 2, 4, 7)


def test_selection_from_embeddings_alone() -> None:
    """A DeepSeek-V3-shaped problem in miniature: synthetic vectors, grouped routing."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3, 64, 12)).astype(np.float32)
    emb = ExpertEmbeddings(
        "multiview",
        (3, 4, 5),
        64,
        "synthetic",
        0,
        vectors,
        model_type="deepseek_v3",
        top_k=8,
        n_group=8,
        topk_group=4,
    )
    sel = select_experts(emb, 0.25)
    assert sel.keep == 16 and sel.n_group == 8 and sel.config_hash == "synthetic"
    assert all(np.bincount(np.array(e.kept) // 8).tolist() == [2] * 8 for e in sel.layers)
    assert max(sel.layers[0].labels) == 15


def test_mismatched_inputs_are_refused() -> None:
    model = tiny("mixtral")
    other = embed_experts(tiny("olmoe"), "router", progress=False)
    with pytest.raises(MoescopeError, match="embeddings were computed on model config"):
        select_experts(model, 4, embeddings=other)
    with pytest.raises(MoescopeError, match="routing statistics were collected"):
        select_experts(model, 4, method="frequency", stats=_stats(tiny("olmoe"), np.ones((2, 8))))


@pytest.mark.parametrize(
    ("keep", "method", "match"),
    [
        (12, "cluster", "more than the layers have"),
        (1, "frequency", "fewer than the top-k"),
        (4, "best", "unknown"),
    ],
)
def test_bad_input_writes_nothing(tmp_path, keep, method: str, match: str) -> None:
    with pytest.raises(MoescopeError, match=match):
        select_experts(tiny("mixtral"), keep, method=method).save(tmp_path / "selection.json")
    assert not any(tmp_path.iterdir())


# --- the selection file --------------------------------------------------------------------------


def test_selection_file_round_trips_and_reads_well(tmp_path) -> None:
    model = tiny("gpt_oss")
    sel = select_experts(model, 0.5, embeddings=embed_experts(model, "router", progress=False))
    path = sel.save(tmp_path / "selection.json")
    assert [p.name for p in tmp_path.iterdir()] == ["selection.json"]
    text = path.read_text()
    data = json.loads(text)
    assert data["schema_version"] == 1 and data["method"] == "cluster" and data["view"] == "router"
    assert len(text.splitlines()) < 40  # one line per layer
    assert data["layers"][0]["kept"] == list(sel.kept(0))
    loaded = Selection.load(path)
    assert loaded == sel
    loaded.check_model(model)
    with pytest.raises(MoescopeError, match="made for a gpt_oss model"):
        loaded.check_model(tiny("gpt_oss", num_local_experts=16).config)
    frame = sel.to_frame()
    assert frame.columns.tolist() == ["layer", "expert", "cluster", "kept", "score"]
    assert len(frame) == 16 and frame["kept"].sum() == 8
    assert frame.groupby("layer")["cluster"].nunique().tolist() == [4, 4]


def test_a_damaged_selection_file_is_refused(tmp_path) -> None:
    sel = select_experts(tiny("mixtral"), 4, method="random")
    data = json.loads(sel.to_json())
    data["layers"][1]["kept"] = [0, 1, 2]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(MoescopeError, match="selection layer 1 keeps"):
        Selection.load(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text(json.dumps({**data, "schema_version": 0}))
    with pytest.raises(MoescopeError, match="schema version 0"):
        Selection.load(tmp_path / "old.json")
    with pytest.raises(MoescopeError, match="not the same from each"):
        Selection(
            "random", None, 0, 2, 0.25, 8, 1, 2, "x", "h", (LayerSelection(0, (0, 1), (0,) * 8, (0.0,) * 8),)
        )


def test_real_routing_statistics_drive_the_baselines() -> None:
    from moescope.explore.routing import collect_routing

    model = tiny("qwen2_moe")
    ids = torch.randint(3, 128, (4, 32), generator=torch.Generator().manual_seed(0))
    stats = collect_routing(model, ids, n_tokens=128, progress=False)
    emb = embed_experts(model, "coactivation", stats=stats, progress=False)
    assert emb.vectors.shape == (len(stats.layers), 8, 64)
    for method in ("frequency", "reap", "cluster"):
        sel = select_experts(model, 4, method=method, stats=stats, embeddings=emb)
        assert sel.keep == 4 and len(sel.layers) == len(stats.layers)
    top = np.argsort(-stats.counts[0], kind="stable")[:4]
    assert select_experts(model, 4, method="frequency", stats=stats).kept(0) == tuple(sorted(top))


def test_one_thread_also_for_libraries_loaded_after_the_first_limit() -> None:
    """scikit-learn and SciPy bring their own OpenMP and OpenBLAS on first import; a limit that
    knew only the libraries loaded before them left those threads spinning on a busy machine."""
    script = textwrap.dedent(
        """
        import json
        from threadpoolctl import threadpool_info
        from moescope._util.threads import single_threaded
        with single_threaded():
            pass
        import scipy.linalg, sklearn.cluster  # new thread pools, loaded after the first limit
        with single_threaded():
            print(json.dumps([(pool["filepath"], pool["num_threads"]) for pool in threadpool_info()]))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    pools = json.loads(run.stdout)
    assert any("scikit_learn" in path or "scipy" in path for path, _ in pools), pools
    assert all(threads == 1 for _, threads in pools), pools
