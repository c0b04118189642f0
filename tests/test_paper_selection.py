"""The paper's selection: routed-context sums, the three views, their fusion, K-Medoids, the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore import paper
from moescope.explore.clustering import select_experts
from moescope.explore.routing import RoutingStats, collect_routing, observe_routing
from moescope.explore.selection import Selection
from moescope.export.config import ExportConfig
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny

ALL = "router,coactivation,context"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def qwen():
    """A tiny 16-expert Qwen3-MoE and its routing statistics over random token ids."""
    model = tiny("qwen3_moe", num_local_experts=16)
    ids = torch.randint(3, 128, (8, 32), generator=torch.Generator().manual_seed(0))
    return model, collect_routing(model, ids, n_tokens=256, progress=False)


# --- routed-context running sums ----------------------------------------------------------------


def _manual_context(layer, inputs: list[torch.Tensor], valid: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Sums of gate weight × block input, and of gate weights, per expert, token by token, over
    every call of the block (a looped layer runs more than once per forward)."""
    context = torch.zeros(layer.num_experts, inputs[0].shape[1], dtype=torch.float64)
    gate = torch.zeros(layer.num_experts, dtype=torch.float64)
    for x in inputs:
        hidden = x[valid]
        with torch.no_grad():
            _, weights, index = layer.route(hidden)
        for token, slot in np.ndindex(*index.shape):
            expert, w = int(index[token, slot]), float(weights[token, slot])
            context[expert] += w * hidden[token].double()
            gate[expert] += w
    return context.numpy(), gate.numpy()


@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.slow) if a == "granitemoehybrid" else a for a in TINY_ARCHS]
)
def test_routed_context_sums_equal_a_manual_pass(arch: str) -> None:
    """The observer's running sums equal the same sums over what each MoE block received and how
    the layer routes it, token by token; padding counts nothing."""
    model = tiny(arch)
    moe = adapt(model)
    ids = torch.randint(3, 128, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    seen: dict[int, list[torch.Tensor]] = {}

    def record(layer):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            seen.setdefault(layer.index, []).append(x.detach().reshape(-1, x.shape[-1]))

        return hook

    handles = [layer.block.register_forward_pre_hook(record(layer), with_kwargs=True) for layer in moe.layers]
    with torch.no_grad(), observe_routing(model) as observer:
        model(ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    stats = observer.stats()
    for row, layer in enumerate(moe.layers):
        context, gate = _manual_context(layer, seen[layer.index], mask.reshape(-1).bool())
        np.testing.assert_allclose(stats.context_sum[row], context, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(stats.context_weight[row], gate, rtol=1e-5, atol=1e-6)
    hidden = moe.layers[0].router_weight.shape[1]
    assert stats.routed_context.shape == (len(moe.layers), moe.num_experts, hidden)


def test_an_old_statistics_file_loads_and_the_paper_method_names_the_missing_view(qwen, tmp_path) -> None:
    model, stats = qwen
    path = stats.save(tmp_path / "new.npz")
    with np.load(path) as npz:  # a file written before routed-context sums existed
        arrays = {name: npz[name] for name in npz.files if not name.startswith("context")}
    header = json.loads(str(arrays.pop("header")))
    for name in ("context_sum", "context_weight"):
        header.pop(name, None)
    np.savez(tmp_path / "old.npz", header=np.array(json.dumps(header)), **arrays)
    old = RoutingStats.load(tmp_path / "old.npz")
    assert old.context_sum is None and old.routed_context is None
    np.testing.assert_array_equal(old.counts, stats.counts)
    with pytest.raises(MoescopeError, match="context view needs routed-context sums"):
        select_experts(model, 8, method="paper", stats=old, views=paper.PAPER_VIEWS)
    kept = select_experts(model, 8, method="paper", stats=old, views=("router", "coactivation"))
    assert kept == select_experts(model, 8, method="paper", stats=stats, views="router,coactivation")
    assert select_experts(model, 8, method="paper", stats=old).view == "+".join(paper.DEFAULT_VIEWS)


# --- the views and their fusion ---------------------------------------------------------------


def test_views_from_real_statistics(qwen) -> None:
    model, stats = qwen
    layer = adapt(model).layers[0]
    views = paper.layer_distances(paper.PAPER_VIEWS, stats, layer.index, layer.router_weight.detach().numpy())
    for name, d in views.items():
        assert d.shape == (16, 16) and np.allclose(d, d.T) and not np.diagonal(d).any(), name
    rows = layer.router_weight.detach().double()
    centred = torch.nn.functional.normalize(rows - rows.mean(0), dim=1)
    expected = (1 - centred @ centred.T).fill_diagonal_(0).numpy()
    np.testing.assert_allclose(views["router"], expected, atol=1e-9)
    co = stats.coactivation[0].astype(float)
    i, j = np.unravel_index(np.argmax(co - np.diag(np.diag(co))), co.shape)  # the pair chosen together most
    assert views["coactivation"][i, j] == pytest.approx(1 - co[i, j] / np.sqrt(co[i, i] * co[j, j]))
    never = np.argwhere(co == 0)
    assert all(views["coactivation"][a, b] == 1.0 for a, b in never)
    means = torch.nn.functional.normalize(torch.from_numpy(stats.context_sum[0]), dim=1)  # scale-free
    np.testing.assert_allclose(views["context"], (1 - means @ means.T).fill_diagonal_(0).numpy(), atol=1e-9)


def test_fusion_normalises_each_view_and_weighs_it() -> None:
    a = np.array([[0, 2, 4], [2, 0, 6], [4, 6, 0]], dtype=float)  # mean off-diagonal 4
    b = np.array([[0, 1, 1], [1, 0, 1], [1, 1, 0]], dtype=float)  # mean off-diagonal 1
    np.testing.assert_allclose(paper.normalised(a), a / 4)
    np.testing.assert_allclose(paper.fuse({"router": a, "context": b}, (3, 1)), (3 * a / 4 + b) / 4)
    np.testing.assert_allclose(paper.fuse({"router": a, "context": b}, (1, 0)), a / 4)
    assert not paper.normalised(np.zeros((3, 3))).any()  # coinciding experts stay at 0


@pytest.mark.parametrize(
    ("views", "weights", "match"),
    [
        (("router", "mood"), None, "unknown view 'mood'"),
        ((), None, "at least one"),
        (("router", "router"), None, "at most once"),
        (ALL, (1, -1, 1), "non-negative"),
        (ALL, (0, 0, 0), "not all zero"),
        (ALL, (1, float("nan"), 1), "finite"),
        (ALL, (1, 1), "give one weight per view"),
        (None, (1, 1), "give one weight per view"),
        (ALL, "1,x,1", "are not numbers"),
    ],
)
def test_bad_views_or_weights_are_one_sentence(qwen, views, weights, match: str) -> None:
    model, stats = qwen
    with pytest.raises(MoescopeError, match=match):
        select_experts(model, 8, method="paper", stats=stats, views=views, view_weights=weights)
    with pytest.raises(MoescopeError, match=match):
        ExportConfig(
            method="paper", views=paper.PAPER_VIEWS if views is None else views, view_weights=weights
        )


def test_missing_inputs_are_refused(qwen) -> None:
    model, stats = qwen
    with pytest.raises(MoescopeError, match="needs routing statistics"):
        select_experts(model, 8, method="paper")
    with pytest.raises(MoescopeError, match="apply to method 'paper'"):
        select_experts(model, 8, method="frequency", stats=stats, views="router")


# --- K-Medoids and the representatives -------------------------------------------------------------


def test_kmedoids_starts_from_the_most_important_experts() -> None:
    """With every expert equally far from every other, no swap helps: the medoids stay the start,
    the ``k`` most important experts (ties: the lower id)."""
    d = 1.0 - np.eye(8)
    importance = np.array([3.0, 9.0, 1.0, 9.0, 0.0, 5.0, 7.0, 2.0])
    labels, medoids = paper.kmedoids_clusters(d, 3, importance)
    assert sorted(medoids.tolist()) == [1, 3, 6]
    assert len(set(labels.tolist())) == 3 and labels[0] == 0  # numbered by lowest member
    assert all(labels[m] == c for c, m in enumerate(medoids))


def test_kmedoids_finds_planted_groups() -> None:
    """Two tight groups far apart: one medoid each, whatever the start."""
    d = np.full((6, 6), 10.0)
    d[:3, :3] = d[3:, 3:] = 1.0
    np.fill_diagonal(d, 0.0)
    labels, _ = paper.kmedoids_clusters(d, 2, np.array([5, 4, 3, 2, 1, 0], dtype=float))
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]


def test_kmedoids_does_not_move_with_float_noise() -> None:
    """The same distances up to relative noise of 1e-9 (what computing the routing sums at
    other shapes leaves) give the same clusters; FasterPAM alone, on the unrounded distances,
    lands elsewhere on this problem (a swap gaining exactly nothing taken by one float sum's
    last bit and not by the other's)."""
    import kmedoids

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8))
    d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    d /= d.mean()
    noise = rng.normal(size=(16, 16)) * 1e-9
    noisy = np.abs(d + (noise + noise.T) / 2)
    np.fill_diagonal(noisy, 0.0)
    worth = np.arange(16, 0, -1, dtype=float)  # starts from experts 0..7
    raw = [kmedoids.fasterpam(m, np.arange(8), max_iter=100, n_cpu=1).medoids for m in (d, noisy)]
    assert sorted(raw[0].tolist()) != sorted(raw[1].tolist())
    clean, jittered = (paper.kmedoids_clusters(m, 8, worth) for m in (d, noisy))
    assert [a.tolist() for a in clean] == [a.tolist() for a in jittered]  # labels and medoids


def test_each_cluster_keeps_its_most_important_member() -> None:
    labels = np.array([0, 0, 1, 1, 1, 2])
    medoids = np.array([0, 3, 5])
    importance = np.array([1.0, 4.0, 2.0, 2.0, 0.0, 0.0])
    assert paper.representatives(labels, medoids, importance).tolist() == [1, 3, 5]  # tie → medoid
    importance = np.array([1.0, 4.0, 2.0, 1.0, 2.0, 0.0])
    assert paper.representatives(labels, medoids, importance).tolist() == [1, 2, 5]  # tie → lower id


def test_importance_is_the_routed_contribution(qwen) -> None:
    _, stats = qwen
    np.testing.assert_array_equal(paper.importance(stats, stats.layers[1]), stats.saliency_sum[1])


# --- selections --------------------------------------------------------------------------------


def test_single_view_selection_is_kmedoids_on_that_view(qwen) -> None:
    """An ablation is one parameter: the router-only selection is K-Medoids on the router
    distance alone, the context-only one on the context distance alone."""
    model, stats = qwen
    for view in paper.PAPER_VIEWS:
        sel = select_experts(model, 4, method="paper", stats=stats, views=(view,))
        for entry, layer in zip(sel.layers, adapt(model).layers, strict=True):
            d = paper.layer_distances((view,), stats, layer.index, layer.router_weight.detach().numpy())[view]
            importance = paper.importance(stats, layer.index)
            labels, medoids = paper.kmedoids_clusters(paper.normalised(d), 4, importance)
            assert entry.labels == tuple(labels.tolist()), view
            assert entry.kept == tuple(sorted(paper.representatives(labels, medoids, importance).tolist()))
    picks = {v: select_experts(model, 4, method="paper", stats=stats, views=(v,)) for v in paper.PAPER_VIEWS}
    assert len({tuple(s.layers[0].labels) for s in picks.values()}) > 1  # the views disagree somewhere


def test_grouped_routing_keeps_an_equal_share_of_every_group() -> None:
    model = tiny("deepseek_v3")  # 16 experts in 4 groups, top-2 from 2 groups
    ids = torch.randint(3, 128, (8, 32), generator=torch.Generator().manual_seed(0))
    stats = collect_routing(model, ids, n_tokens=256, progress=False)
    sel = select_experts(model, 8, method="paper", stats=stats)
    assert sel.n_group == 4 and sel.layer_indices == [1, 2]
    assert sel.view == "router+context" == "+".join(paper.default_views("sigmoid"))  # its sigmoid router
    for entry in sel.layers:
        assert np.bincount(np.array(entry.kept) // 4, minlength=4).tolist() == [2, 2, 2, 2]
        labels = np.array(entry.labels)
        for group in range(4):  # each group's clusters are its own two
            assert sorted(set(labels[group * 4 : (group + 1) * 4].tolist())) == [2 * group, 2 * group + 1]


def test_selection_file_records_the_views_and_weights(qwen, tmp_path) -> None:
    model, stats = qwen
    sel = select_experts(
        model, "1/4", method="paper", stats=stats, views="router,context", view_weights="2,1"
    )
    assert (sel.method, sel.view, sel.keep) == ("paper", "router+context", 4)
    assert sel.params["views"] == ["router", "context"] and sel.params["view_weights"] == [2.0, 1.0]
    again = Selection.load(sel.save(tmp_path / "selection.json"))
    assert again == sel
    default = select_experts(model, "1/4", method="paper", stats=stats)  # a softmax router
    weights = [paper.DEFAULT_VIEW_WEIGHTS[v] for v in paper.DEFAULT_VIEWS]
    assert default.params["views"] == list(paper.DEFAULT_VIEWS) and default.params["view_weights"] == weights
    assert ExportConfig().views is None and ExportConfig().view_weights is None  # chosen by the router
    assert ExportConfig(views="context").views == ("context",)
    with pytest.raises(MoescopeError, match="without the views they weigh"):
        ExportConfig(view_weights="2,1")


def test_export_records_the_paper_method_and_streaming_chooses_the_same(
    tiny_checkpoint, tmp_path: Path
) -> None:
    from moescope.export.pipeline import export_proxy
    from moescope.export.streaming.export import export_streaming

    source = tiny_checkpoint("qwen3_moe")
    config = ExportConfig(
        keep="1/2", method="paper", views="router,coactivation", view_weights="1,2", fidelity=False
    )
    result = export_proxy(source, config, out=tmp_path / "proxy", calibration="tasks", progress=False)
    manifest = json.loads((tmp_path / "proxy" / "moescope.json").read_text())
    assert manifest["method"] == "paper" and manifest["view"] == "router+coactivation"
    assert manifest["config"]["views"] == ["router", "coactivation"]
    assert manifest["config"]["view_weights"] == [1.0, 2.0]
    assert manifest["selection"]["params"]["view_weights"] == [1.0, 2.0]
    assert result.selection.method == "paper"
    streamed = export_streaming(source, tmp_path / "streamed", config, calibration="tasks", progress=False)
    assert [layer.kept for layer in streamed.selection.layers] == [
        layer.kept for layer in result.selection.layers
    ]
    assert streamed.selection.params == result.selection.params  # views and weights recorded alike


def test_command_line_flags_and_bad_input(tiny_checkpoint, tmp_path: Path, capsys) -> None:
    from moescope.cli import main

    source, out = str(tiny_checkpoint("qwen3_moe")), tmp_path / "proxy"
    base = ["export", source, "--keep", "1/2", "--method", "paper", "--no-fidelity", "--calibration", "tasks"]
    assert main([*base, "--views", "router,context", "--view-weights", "1,1", "--out", str(out)]) == 0
    manifest = json.loads((out / "moescope.json").read_text())
    assert manifest["selection"]["params"]["views"] == ["router", "context"]
    for bad, match in (
        (["--views=router", "--view-weights=-1"], "non-negative"),
        (["--views", "router,context", "--view-weights", "-1,1"], "non-negative"),  # spaced, not argparse
        (["--views=router,mood"], "unknown view"),
        (["--view-weights=1"], "without the views"),
    ):
        capsys.readouterr()
        assert main([*base, *bad, "--out", str(tmp_path / "bad")]) == 2
        assert match in capsys.readouterr().err and not (tmp_path / "bad").exists()
