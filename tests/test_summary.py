"""Architecture summaries and parameter accounting."""

from __future__ import annotations

import pytest

from moescope.models.summary import summarize
from moescope.models.view import adapt
from moescope.models.zoo import tiny


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss", "granitemoeshared"])
def test_param_split_adds_up(arch: str) -> None:
    model = tiny(arch)
    summary = summarize(model)
    p = summary.params
    assert p.total == sum(param.numel() for param in model.parameters())
    assert p.total == p.backbone + p.routed_experts + p.shared_experts
    moe = adapt(model)
    per_expert = sum(t.numel() for t in moe.layers[0].expert(0).__dict__.values() if t is not None)
    assert p.routed_experts == len(moe.layers) * moe.num_experts * per_expert
    assert p.active_per_token == p.backbone + p.shared_experts + p.routed_experts * 2 // moe.num_experts
    assert p.router == sum(layer.router_weight.numel() for layer in moe.layers) + (
        sum(layer.router_bias.numel() for layer in moe.layers) if moe.layers[0].router_bias is not None else 0
    )


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
@pytest.mark.parametrize("fused", [False, True])
def test_checkpoint_summary_equals_loaded_model_summary(arch: str, fused: bool, tiny_checkpoint) -> None:
    """Read from disk without weights (meta device) = counted on the loaded model."""
    on_disk = summarize(tiny_checkpoint(arch, fused=fused))
    in_memory = summarize(tiny(arch))
    assert on_disk.params == in_memory.params
    assert on_disk.moe_layers == in_memory.moe_layers and on_disk.routing == in_memory.routing


def test_summary_fields() -> None:
    s = summarize(tiny("deepseek_v3"))
    assert (s.dense_layers, s.moe_layers, s.shared_experts) == ((0,), (1, 2), 1)
    assert (s.n_group, s.topk_group, s.correction_bias, s.count_key) == (4, 2, True, "n_routed_experts")
    assert "sigmoid" in s.routing and "2/4 groups" in s.routing
    frame = s.to_frame()
    assert {"field", "value"} == set(frame.columns)
    assert "params.routed_experts" in set(frame["field"])
    assert summarize(tiny("gpt_oss")).router_bias
    assert summarize(tiny("granitemoeshared")).shared_experts == 1
    assert summarize(tiny("mixtral")).shared_experts == 0


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3"])
def test_remaining_share_is_what_a_proxy_keeps(arch: str) -> None:
    from moescope.explore.clustering import select_experts
    from moescope.export.surgery import build_proxy

    model = tiny(arch)
    params = summarize(model).params
    selection = select_experts(model, 0.5, method="random")
    proxy = summarize(build_proxy(model, selection)).params
    left = params.remaining(selection.keep_ratio) * params.total
    assert left == pytest.approx(proxy.total + params.router - proxy.router), "all but the router rows cut"
    assert params.remaining(1.0) == 1.0 and params.remaining(0.0) < 1.0
