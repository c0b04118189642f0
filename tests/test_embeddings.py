"""Expert embeddings: every view, the projections, the multi-view join, 2-D layouts and files."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.clustering import ExpertClusterer, select_experts
from moescope.explore.embeddings import (
    PROBE_SHAPE,
    VIEWS,
    ExpertEmbeddings,
    _Projector,
    embed_experts,
    join_views,
    principal_coordinates,
    probe_hidden_states,
    weight_vectors,
)
from moescope.models.view import adapt
from moescope.models.zoo import tiny
from moescope.provenance import config_hash


def _coactivation_stats(model, blocks: int) -> SimpleNamespace:
    """Routing statistics in which experts co-fire only inside ``blocks`` contiguous blocks."""
    moe = adapt(model)
    n_layers, n = len(moe.layers), moe.num_experts
    same = np.arange(n)[:, None] // (n // blocks) == np.arange(n)[None, :] // (n // blocks)
    co = np.where(same, 50, 1) + np.diag(np.full(n, 100))
    layers = tuple(moe.moe_indices)
    return SimpleNamespace(
        layers=layers,
        num_experts=n,
        top_k=moe.top_k,
        config_hash=config_hash(model.config),
        counts=np.tile(np.diag(co), (n_layers, 1)),
        coactivation=np.tile(co, (n_layers, 1, 1)),
        layer_index=layers.index,
    )


@pytest.mark.parametrize("view", ["weights", "outputs", "router"])
def test_single_views_give_one_vector_per_expert_and_layer(view: str) -> None:
    model = tiny("deepseek_v3")  # a leading dense layer: rows follow the MoE layers only
    emb = embed_experts(model, view, dim=32, progress=False)
    assert emb.vectors.shape == (2, 16, 32) and emb.vectors.dtype == np.float32  # 16 experts
    assert emb.layers == (1, 2) and emb.view == view and emb.coords is None
    assert np.isfinite(emb.vectors).all() and np.abs(emb.vectors).sum(axis=2).min() > 0
    assert (emb.model_type, emb.top_k, emb.n_group, emb.topk_group) == ("deepseek_v3", 2, 4, 2)
    assert emb.config_hash == config_hash(model.config)


def test_embeddings_are_fixed_by_the_seed() -> None:
    model = tiny("gpt_oss")
    first = embed_experts(model, "multiview", seed=3, progress=False)
    again = embed_experts(model, "multiview", seed=3, progress=False)
    other = embed_experts(model, "multiview", seed=4, progress=False)
    np.testing.assert_array_equal(first.vectors, again.vectors)
    assert not np.allclose(first.vectors, other.vectors)


def test_weights_view_is_a_distance_preserving_projection_of_the_flat_weights() -> None:
    """The two-sided sketch behaves like a Johnson-Lindenstrauss projection of ExpertWeights.flat()."""
    moe = adapt(tiny("qwen3_moe", num_local_experts=16))
    emb = embed_experts(moe, "weights", dim=256, progress=False)
    flat = torch.stack([moe.layers[0].expert(i).flat() for i in range(16)]).detach().numpy()
    rows, cols = np.triu_indices(16, k=1)
    true = np.linalg.norm(flat[rows] - flat[cols], axis=1)
    sketched = np.linalg.norm(emb.vectors[0][rows] - emb.vectors[0][cols], axis=1)
    ratio = sketched / true
    assert abs(np.median(ratio) - 1) < 0.15 and ratio.min() > 0.5 and ratio.max() < 1.5


def test_bfloat16_weights_are_sketched_within_their_own_precision() -> None:
    """A bf16 model's weight view (its products run in bf16 where the CPU has them) stays
    within bf16 rounding of the fp32 view of the very same numbers."""
    model = tiny("qwen3_moe", num_local_experts=16).to(torch.bfloat16)
    low = embed_experts(model, "weights", progress=False).vectors
    high = embed_experts(model.float(), "weights", progress=False).vectors
    assert np.linalg.norm(low - high) / np.linalg.norm(high) < 0.01


def test_bfloat16_weight_view_is_the_same_with_native_or_upcast_products(monkeypatch) -> None:
    """Both ways of multiplying bf16 weights (native on a bf16-capable CPU, upcast elsewhere)
    sum the same exact products in float32 and round the sums to bfloat16: only the order of
    the additions differs, which moves a rare sum across a rounding boundary. So ``W Bᵀ`` is
    equal but for a bfloat16 ulp in under 1 entry in 1,000, the vectors differ by under 5e-4 of
    their norm (before: ~2e-3 everywhere), and the experts clustered are the same."""
    from moescope.explore import embeddings

    def both(compute):
        out = []
        for dtype in (torch.bfloat16, torch.float32):
            monkeypatch.setattr(embeddings, "_product_dtype", lambda w, dtype=dtype: dtype)
            out.append(compute())
        return out

    generator = torch.Generator().manual_seed(0)
    w = torch.empty(512, 2048, dtype=torch.bfloat16).normal_(0, 0.02, generator=generator)  # 4 blocks
    b = _Projector(0, 64).matrix("up/right", 16, 2048)
    native, upcast = both(lambda: embeddings._times_right(w, b))
    assert native.dtype == upcast.dtype == torch.float32
    assert torch.equal(native.bfloat16().float(), native) and torch.equal(upcast.bfloat16().float(), upcast)
    differ = native != upcast
    assert differ.float().mean() < 1e-3
    assert ((native - upcast).abs()[differ] <= upcast.abs()[differ] * 2**-7).all()  # one ulp

    model = tiny("qwen3_moe", num_local_experts=16).to(torch.bfloat16)
    native, upcast = both(lambda: embed_experts(model, "weights", progress=False))
    assert np.linalg.norm(native.vectors - upcast.vectors) / np.linalg.norm(upcast.vectors) < 5e-4
    kept = [[layer.kept for layer in select_experts(e, 8, method="cluster").layers] for e in (native, upcast)]
    assert kept[0] == kept[1]


def test_weight_vectors_do_not_depend_on_the_threads_sketching_them() -> None:
    layer = adapt(tiny("gpt_oss")).layers[0]  # transposed, interleaved gate/up with biases
    projector = _Projector(0, 64)
    one = weight_vectors(layer, projector)
    np.testing.assert_array_equal(weight_vectors(layer, projector, workers=3), one)


def test_router_view_is_the_router_row_when_it_fits() -> None:
    moe = adapt(tiny("mixtral"))
    emb = embed_experts(moe, "router", dim=64, progress=False)  # hidden size 64: padded, not projected
    np.testing.assert_allclose(emb.vectors[1], moe.layers[1].router_weight.detach().numpy(), rtol=1e-6)


def test_principal_coordinates_keep_inner_products_when_experts_fit() -> None:
    x = np.random.default_rng(0).normal(size=(8, 300))
    reduced = principal_coordinates(x, 16)
    assert reduced.shape == (8, 16)
    np.testing.assert_allclose(reduced @ reduced.T, x @ x.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(principal_coordinates(x, 16), reduced)  # signs fixed


def test_multiview_joins_normalized_views_with_equal_say() -> None:
    emb = embed_experts(tiny("olmoe"), "multiview", dim=16, progress=False)
    assert emb.components == ("weights", "outputs", "router") and emb.dim == 48
    np.testing.assert_allclose(np.linalg.norm(emb.vectors, axis=2), 1.0, rtol=1e-5)
    rng = np.random.default_rng(0)
    views = [rng.normal(size=(6, 5)) * 100, rng.normal(size=(6, 3)) + 7]  # scales and offsets differ
    joined = join_views(views)
    per_view = []
    for x in views:
        c = x - x.mean(0)
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        per_view.append(c @ c.T)
    np.testing.assert_allclose(joined @ joined.T, np.mean(per_view, axis=0), atol=1e-12)


def test_coactivation_view_needs_stats_and_reads_them() -> None:
    model = tiny("mixtral")
    with pytest.raises(MoescopeError, match="coactivation view needs routing statistics"):
        embed_experts(model, "coactivation", progress=False)
    stats = _coactivation_stats(model, blocks=2)
    emb = embed_experts(model, "coactivation", stats=stats, dim=8, progress=False)
    labels = ExpertClusterer(n_clusters=2).fit(emb.vectors[0]).labels_
    assert labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # experts 0-3 co-fire, and 4-7
    multi = embed_experts(model, "multiview", stats=stats, dim=8, progress=False)
    assert multi.components[-1] == "coactivation" and multi.dim == 32


def test_stats_of_another_model_are_refused() -> None:
    stats = _coactivation_stats(tiny("mixtral"), blocks=2)
    with pytest.raises(MoescopeError, match="collect them on this model"):
        embed_experts(
            tiny("mixtral", seed=1, num_local_experts=16), "coactivation", stats=stats, progress=False
        )


@pytest.mark.parametrize("bad", [{"view": "cosine"}, {"dim": 0}])
def test_bad_arguments_are_one_sentence(bad: dict) -> None:
    with pytest.raises(MoescopeError) as err:
        embed_experts(tiny("mixtral"), **{"view": "weights", **bad}, progress=False)
    message = str(err.value)
    assert message.endswith(".") and "\n" not in message
    if "view" in bad:
        assert all(view in message for view in VIEWS)


def test_the_probe_is_captured_at_each_moe_block_and_leaves_the_model_as_it_was() -> None:
    model = tiny("qwen2_moe").train()
    moe = adapt(model)
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    hidden = probe_hidden_states(moe, ids)
    assert sorted(hidden) == moe.moe_indices and hidden[0].shape == (10, 64)
    assert model.training and all(not layer.block._forward_pre_hooks for layer in moe.layers)
    default = embed_experts(moe, "outputs", dim=16, progress=False)
    explicit = embed_experts(moe, "outputs", probe=ids, dim=16, progress=False)
    assert PROBE_SHAPE[0] * PROBE_SHAPE[1] > 10 and not np.allclose(default.vectors, explicit.vectors)
    with pytest.raises(MoescopeError, match="token ids"):
        embed_experts(moe, "outputs", probe=torch.rand(2, 5), progress=False)
    with pytest.raises(MoescopeError, match="vocabulary size 128"):
        embed_experts(moe, "outputs", probe=torch.tensor([1, 500]), progress=False)


def test_pca_projection_and_long_frame() -> None:
    emb = embed_experts(tiny("mixtral"), "weights", dim=16, progress=False).project()  # 8 experts: PCA
    assert emb.coords.shape == (2, 8, 2) and np.isfinite(emb.coords).all()
    np.testing.assert_array_equal(emb.coords, emb.project("pca").coords)
    frame = emb.to_frame()
    assert frame.columns.tolist() == ["layer", "expert", "x", "y"] and len(frame) == 16
    assert frame.loc[9, ["layer", "expert"]].tolist() == [1, 1]
    assert frame["x"].tolist()[:8] == emb.coords[0, :, 0].tolist()
    with pytest.raises(MoescopeError, match="UMAP needs at least"):
        emb.project("umap")
    with pytest.raises(MoescopeError, match="unknown projection"):
        emb.project("tsne")


@pytest.mark.slow
def test_umap_projection_is_seeded() -> None:
    """UMAP's first call compiles with numba (~15 s), hence slow."""
    rng = np.random.default_rng(0)
    vectors = np.concatenate([rng.normal(c, 0.05, size=(12, 8)) for c in (-1, 1)]).astype(np.float32)
    emb = ExpertEmbeddings("weights", (0,), 24, "hash", 0, vectors[None])
    auto, again = emb.project(), emb.project("umap", seed=0)
    assert auto.coords.shape == (1, 24, 2)
    np.testing.assert_allclose(auto.coords, again.coords)


def test_save_and_load_round_trip(tmp_path) -> None:
    emb = embed_experts(tiny("granitemoe"), "router", dim=8, progress=False).project()
    path = emb.save(tmp_path / "emb.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz"]  # no temporary file left
    loaded = ExpertEmbeddings.load(path)
    np.testing.assert_array_equal(loaded.vectors, emb.vectors)
    np.testing.assert_array_equal(loaded.coords, emb.coords)
    assert (loaded.view, loaded.layers, loaded.config_hash, loaded.top_k) == (
        emb.view,
        emb.layers,
        emb.config_hash,
        emb.top_k,
    )
    (tmp_path / "bad.npz").write_text("not numpy")
    with pytest.raises(MoescopeError, match="not an expert-embeddings file"):
        ExpertEmbeddings.load(tmp_path / "bad.npz")


def test_vectors_of_the_wrong_shape_are_refused() -> None:
    with pytest.raises(MoescopeError, match="layers, experts, dim"):
        ExpertEmbeddings("weights", (0, 1), 8, "hash", 0, np.zeros((2, 7, 4), np.float32))


def test_a_looped_layer_is_probed_on_every_pass() -> None:
    """Inkling 2 Loop runs layers 1 and 2 twice per forward: their probe holds both passes' inputs."""
    moe = adapt(tiny("inkling2_loop_text"))
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    hidden = probe_hidden_states(moe, ids)
    assert {layer: h.shape[0] for layer, h in hidden.items()} == {0: 16, 1: 32, 2: 32, 3: 16}
    first, second = hidden[1][:16], hidden[1][16:]
    assert not torch.equal(first, second)  # the second pass sees the first one's output
