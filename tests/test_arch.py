"""Adapters against the stock modules: expert views and routing of every architecture."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from moescope.errors import UnsupportedArchitectureError
from moescope.models.routers import selection_scores, topk_margin
from moescope.models.support import language_config, spec_for
from moescope.models.table import ARCHITECTURES, config_value, supported_architectures
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny, tiny_config


def _with_random_biases(model: torch.nn.Module) -> torch.nn.Module:
    """Sharpen the routers and give every per-expert bias of the stock model (router bias,
    correction bias: any parameter or buffer named *bias with one value per expert) non-zero
    values. Biases are found without the adapter, so one the table forgets still changes the
    model's routing; their scale is that of the score spread, so they change some choices."""
    generator = torch.Generator().manual_seed(1)
    moe = adapt(model)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    with torch.no_grad():
        for layer in moe.layers:
            layer.router_weight.mul_(10.0)
        for name, tensor in tensors:
            if name.endswith("bias") and tensor.numel() == moe.num_experts:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2)
    return model


def _assert_inputs_exercise(layer, logits: torch.Tensor) -> None:
    """Guard the test's power: on these tokens, dropping the groups or the bias must change
    the routing, so a table row that forgot either could not pass."""
    import dataclasses

    from moescope.models.routers import route

    _, index = route(logits, layer.rule, layer.correction_bias)
    if layer.rule.grouped:
        _, ungrouped = route(logits, dataclasses.replace(layer.rule, n_group=1), layer.correction_bias)
        assert not torch.equal(index.sort(-1).values, ungrouped.sort(-1).values)
    if layer.correction_bias is not None and layer.rule.bias_for_selection:
        _, unbiased = route(logits, layer.rule, None)
        assert not torch.equal(index.sort(-1).values, unbiased.sort(-1).values)


def _stock_expert_outputs(layer, x: torch.Tensor) -> torch.Tensor:
    """``(E, T, H)``: each expert of the stock experts module on ``x``, routing weight 1."""
    experts, n = layer.experts, layer.num_experts
    if layer.spec.combine == "input":  # Llama 4: every expert on a pre-scaled copy of the input
        return experts(x.repeat(n, 1)).view(n, *x.shape)
    ones = torch.ones(x.shape[0], 1)
    runs = [experts(x, torch.full((x.shape[0], 1), i), ones) for i in range(n)]
    return torch.stack([run.reshape(x.shape) for run in runs])  # DBRX's come back [T, 1, H]


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_expert_view_reproduces_stock_experts(arch: str) -> None:
    moe = adapt(tiny(arch))
    x = torch.randn(5, moe.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for layer in moe.layers:
            stock = _stock_expert_outputs(layer, x)
            for i in range(layer.num_experts):
                torch.testing.assert_close(layer.expert_forward(i, x), stock[i], rtol=1e-5, atol=1e-6)


# Variants the tiny defaults do not take: Cohere2-MoE's sigmoid of the chosen logits, with and
# without renormalization; DBRX's division by the 2-norm, and by nothing; Kolibri-1's chosen
# sigmoids renormalized, Flint's not; Laguna's logits not capped.
VARIANTS = (
    [
        pytest.param(
            "cohere2_moe",
            {"expert_selection_fn": "sigmoid", "norm_topk_prob": b},
            id=f"cohere2_moe-sigmoid-{b}",
        )
        for b in (True, False)
    ]
    + [
        pytest.param("dbrx", {"ffn_config.moe_normalize_expert_weights": p}, id=f"dbrx-norm-{p}")
        for p in (2.0, None)
    ]
    + [
        pytest.param("kolibri1", {"norm_topk_prob": True}, id="kolibri1-normalized"),
        pytest.param("flint", {"norm_topk_prob": False}, id="flint-not-normalized"),
        pytest.param("laguna", {"moe_router_logit_softcapping": 0.0}, id="laguna-uncapped"),
    ]
)


@pytest.mark.parametrize(("arch", "overrides"), [pytest.param(a, {}, id=a) for a in TINY_ARCHS] + VARIANTS)
def test_routing_equals_the_model_router(arch: str, overrides: dict) -> None:
    """Hook every router during a real forward; the adapter recomputes the same routing."""
    model = _with_random_biases(tiny(arch, **overrides))
    moe = adapt(model)
    seen: dict[int, tuple] = {}

    def record(index: int):
        def hook(module, args, out) -> None:
            seen.setdefault(index, (args[0].detach(), out))

        return hook

    handles = [layer.router.register_forward_hook(record(layer.index)) for layer in moe.layers]
    ids = torch.randint(3, model.config.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    assert sorted(seen) == moe.moe_indices
    for layer in moe.layers:
        hidden, out = seen[layer.index]
        hidden = hidden.reshape(-1, hidden.shape[-1])
        logits, weights, index = layer.route(hidden)
        _assert_inputs_exercise(layer, logits)
        if layer.spec.combine == "input":  # Llama 4 returns (scores [T, E], logits)
            stock_scores, stock_logits = out
            torch.testing.assert_close(logits, stock_logits.float())
            dense = torch.zeros_like(stock_scores).scatter(1, index, weights.to(stock_scores.dtype))
            torch.testing.assert_close(dense, stock_scores)
            continue
        if isinstance(out, torch.Tensor):  # DBRX's router returns logits; its block chooses
            out = (out, *layer.block.route_tokens_to_experts(out))
        stock_logits, stock_weights, stock_index = out
        torch.testing.assert_close(logits, stock_logits.float())
        scores = selection_scores(logits, layer.rule, layer.correction_bias)  # what top-k is taken over
        taken = torch.topk(scores, layer.top_k, dim=-1).indices
        assert torch.equal(taken.sort(-1).values, stock_index.sort(-1).values)
        margin = topk_margin(scores, layer.top_k)
        assert bool((margin[torch.isfinite(margin)] >= 0).all()) and bool(torch.isfinite(margin).any())
        order, stock_order = index.argsort(-1), stock_index.argsort(-1)
        assert torch.equal(index.gather(1, order), stock_index.gather(1, stock_order))
        torch.testing.assert_close(
            weights.gather(1, order), stock_weights.float().gather(1, stock_order), rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_table_keys_match_the_config(arch: str) -> None:
    spec = ARCHITECTURES[arch]
    config = tiny_config(arch, **{spec.count_key: 12})
    stored = config_value(config.to_dict(), spec.count_key)
    assert stored == 12, "the count key must be the field config.json stores"
    assert spec.num_experts(config) == 12 and spec.top_k(config) == 2
    moe = adapt(tiny(arch))
    assert all(layer.num_experts == moe.num_experts for layer in moe.layers)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_layout_agrees_with_module_flags(arch: str) -> None:
    layer = adapt(tiny(arch)).layers[0]
    experts = layer.experts
    if hasattr(experts, "mlp"):  # DBRX: 2-D tensors of one block of rows per expert
        width, hidden = (
            config_value(layer.layer, "ffn.experts.mlp.ffn_hidden_size"),
            layer.router_weight.shape[1],
        )
        assert layer.spec.layout == "stacked_rows"
        assert experts.mlp.w1.shape == experts.mlp.w2.shape == (layer.num_experts * width, hidden)
        return
    if not hasattr(experts, "is_transposed"):  # Llama 4's experts are not decorated
        assert layer.spec.layout == "fused_transposed"
        return
    expected = "fused" if hasattr(experts, "gate_up_proj") else "up_down"  # Nemotron-H: no gate
    if experts.is_transposed:
        expected = "fused_transposed" if experts.is_concatenated else "fused_transposed_interleaved"
    assert layer.spec.layout == expected


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_every_expert_tensor_has_one_slice_per_expert(arch: str) -> None:
    layer = adapt(tiny(arch)).layers[0]
    names = dict(layer.named_expert_tensors())
    assert any(name.endswith(("gate_up_proj", "experts.up_proj", "mlp.w1")) for name in names)
    stacked = layer.num_experts * layer.expert(0).up.shape[0]  # DBRX: one block of rows per expert
    for name, tensor in names.items():
        assert layer.num_experts in (tensor.shape[0], tensor.shape[-1]) or (
            layer.spec.layout == "stacked_rows" and tensor.shape[0] == stacked
        ), name


def _routed_sum(layer, x: torch.Tensor) -> torch.Tensor:
    """``(T, H)``: the view's experts on ``x``, weighted by the view's routing."""
    _, weights, index = layer.route(x)
    outputs = torch.stack([layer.expert_forward(i, x) for i in range(layer.num_experts)])
    rows = torch.arange(len(x))
    return sum(weights[:, slot, None] * outputs[index[:, slot], rows] for slot in range(layer.top_k))


@pytest.mark.parametrize("latent", [None, 16])
def test_nemotron_block_is_its_routed_experts_plus_the_shared_one(latent: int | None) -> None:
    """Experts with no gate, relu² on ``up``, and (with ``moe_latent_size``) a latent space the
    block projects into and out of: the view's routed sum plus the shared MLP is the block."""
    moe = adapt(tiny("nemotron_h", moe_latent_size=latent))
    x = torch.randn(7, moe.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for layer in moe.layers:
            assert layer.expert(0).gate is None
            expected = _routed_sum(layer, x) + layer.shared_forward(x)
            torch.testing.assert_close(layer.block_forward(x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["sum", "average"])
def test_cohere2_shared_experts_are_summed_or_averaged_in(strategy: str) -> None:
    """``shared_forward`` is the shared experts' share of the block's output: all of it when
    summed, half when averaged (the routed output is halved too)."""
    moe = adapt(tiny("cohere2_moe", shared_expert_combination_strategy=strategy))
    x = torch.randn(7, moe.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for layer in moe.layers:
            routed = _routed_sum(layer, x) * (0.5 if strategy == "average" else 1.0)
            expected = routed + layer.shared_forward(x)
            torch.testing.assert_close(layer.block_forward(x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "arch", [a for a in TINY_ARCHS if (tiny_config(a).to_dict().get("n_group") or 1) > 1]
)
def test_grouped_configs_route_by_group(arch: str) -> None:
    config = tiny_config(arch)
    rule = adapt(tiny(arch)).layers[0].rule
    assert (rule.n_group, rule.topk_group) == (config.n_group, config.topk_group)
    assert rule.grouped


def test_deepseek_v3_structure() -> None:
    moe = adapt(tiny("deepseek_v3"))
    assert moe.dense_layers == (0,) and moe.moe_indices == [1, 2]
    rule = moe.layers[0].rule
    assert (rule.scoring, rule.n_group, rule.topk_group, rule.scale) == ("sigmoid", 4, 2, 2.5)
    assert moe.layers[0].correction_bias.shape == (16,)
    assert moe.layers[0].shared_experts is not None


def test_gpt_oss_interleaved_view() -> None:
    layer = adapt(tiny("gpt_oss")).layers[0]
    fused = layer.experts.gate_up_proj[3]  # [H, 2I], gate and up interleaved by column
    view = layer.expert(3)
    assert torch.equal(view.gate, fused[:, 0::2].T) and torch.equal(view.up, fused[:, 1::2].T)
    assert view.gate_bias is not None and view.down_bias is not None
    assert layer.router_bias is not None


def test_unsupported_and_dense_models_name_the_supported_ones() -> None:
    from transformers import AutoConfig

    with pytest.raises(UnsupportedArchitectureError, match="dense model") as dense:
        spec_for(AutoConfig.for_model("llama"))
    assert "mixtral" in str(dense.value)
    with pytest.raises(UnsupportedArchitectureError, match="not supported") as moe:
        spec_for(AutoConfig.for_model("jetmoe"))
    assert "deepseek_v3" in str(moe.value)
    assert "attention experts share num_local_experts" in str(moe.value)  # the reason, where known
    with pytest.raises(UnsupportedArchitectureError, match="zero-computation"):
        spec_for(AutoConfig.for_model("longcat_flash"))
    with pytest.raises(UnsupportedArchitectureError, match="skip expert"):
        spec_for(AutoConfig.for_model("zaya"))
    with pytest.raises(UnsupportedArchitectureError, match="token id"):
        spec_for(AutoConfig.for_model("deepseek_v4"))
    with pytest.raises(UnsupportedArchitectureError, match="shared experts as extra rows"):
        spec_for(AutoConfig.for_model("inkling_text"))
    with pytest.raises(UnsupportedArchitectureError, match="vision tower has routed experts"):
        language_config(AutoConfig.for_model("dots3_note"))  # its language model alone is supported
    with pytest.raises(UnsupportedArchitectureError, match="scoring_func='sigmoid'"):  # a rule it cannot read
        spec_for("inkling2_text").rule(tiny_config("inkling2_text", scoring_func="softmax"))


def test_experts_counted_in_a_sub_config_make_an_unknown_model_an_moe() -> None:
    """A model that, like DBRX, keeps its expert count in a sub-config is not called dense."""
    from transformers import PretrainedConfig
    from transformers.models.dbrx.configuration_dbrx import DbrxFFNConfig

    class NestedConfig(PretrainedConfig):
        model_type = "nested_moe"
        sub_configs: ClassVar[dict[str, type]] = {"ffn_config": DbrxFFNConfig}

    config = NestedConfig()
    config.ffn_config = DbrxFFNConfig(moe_num_experts=1)
    with pytest.raises(UnsupportedArchitectureError, match="dense model"):
        spec_for(config)
    config.ffn_config = DbrxFFNConfig(moe_num_experts=8)
    with pytest.raises(UnsupportedArchitectureError, match="'nested_moe' is not supported"):
        spec_for(config)


def test_table_covers_the_required_architectures() -> None:
    required = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"}
    assert required <= set(supported_architectures())
    assert {"phimoe", "granitemoe", "glm4_moe"} <= set(supported_architectures())
