"""toy-v3, the embedded DeepSeek-V3: what ships, what it is, that every entry point takes its name,
and that its build is deterministic and balances load through the correction bias alone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DeepseekV3ForCausalLM

from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.export.cost.shape import ModelShape
from moescope.export.pipeline import export_proxy
from moescope.keep import parse_keep
from moescope.models.accuracy import resolve_tasks
from moescope.models.embedded import CARD_NAME, EMBEDDED, embedded_path, write_embedded
from moescope.models.loading import load_config, resolve_model
from moescope.models.tasks import TASK_FAMILIES
from moescope.models.toy._training import RoutingCounter
from moescope.models.toy_v3 import load_toy_v3, toy_v3_card, toy_v3_path
from moescope.models.toy_v3.build import V3Recipe, balance_step, build, make_model
from moescope.models.view import adapt
from moescope.report.pipeline import _model_parameter

NAME = "toy-v3"


@pytest.fixture(scope="module")
def v3():
    return load_toy_v3()


def test_packaged_checkpoint_is_small_and_matches_its_card() -> None:
    files = {p.name: p.stat().st_size for p in toy_v3_path().iterdir()}
    assert set(files) >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
        CARD_NAME,
    }
    assert sum(files.values()) <= 10 * 2**20
    digest = hashlib.sha256((toy_v3_path() / "model.safetensors").read_bytes()).hexdigest()
    assert toy_v3_card()["model_sha256"] == digest


def test_is_a_stock_deepseek_v3_built_like_large_moes(v3) -> None:
    model, _ = v3
    cfg = model.config
    assert type(model) is DeepseekV3ForCausalLM and cfg.architectures == ["DeepseekV3ForCausalLM"]
    assert cfg.n_routed_experts >= 64 and cfg.num_experts_per_tok >= 6 and cfg.n_shared_experts >= 1
    assert 1 < cfg.topk_group < cfg.n_group and cfg.norm_topk_prob
    moe = adapt(model)
    rule = moe.rule
    assert (rule.scoring, rule.bias_for_selection, rule.grouped) == ("sigmoid", True, True)
    assert moe.dense_layers == tuple(range(cfg.first_k_dense_replace))
    assert all(layer.shared_experts is not None for layer in moe.layers)
    # balanced without an auxiliary loss: the trained correction biases moved away from zero
    assert all(layer.correction_bias.abs().max() > 0 for layer in moe.layers)
    counts = [
        parse_keep(k, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, topk_group=cfg.topk_group)
        for k in ("1/2", "1/4", "1/8")
    ]
    assert counts == [cfg.n_routed_experts // d for d in (2, 4, 8)]


def test_card_describes_the_checkpoint() -> None:
    card = toy_v3_card()
    cfg = AutoConfig.from_pretrained(toy_v3_path())
    recipe = card["recipe"]
    assert (recipe["n_routed_experts"], recipe["num_experts_per_tok"]) == (
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
    )
    assert {r["task"] for r in card["accuracy"]["results"]} == set(recipe["tasks"])
    assert any(0.3 <= r["sampled"] <= 0.9 for r in card["accuracy"]["results"]), card["accuracy"]
    load = card["expert_load"]
    assert load["layers"] == list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))
    assert all(len(row) == cfg.n_routed_experts and abs(sum(row) - 1) < 1e-6 for row in load["share"])
    assert recipe["bias_update_speed"] > 0 and {"torch", "transformers"} <= set(card["versions"])


def test_the_name_resolves_wherever_toy_does(v3, tmp_path: Path, capsys) -> None:
    model, _ = v3
    assert resolve_model(NAME) == embedded_path(NAME) == toy_v3_path()
    assert load_config(NAME).model_type == "deepseek_v3"
    assert ModelShape.from_config(NAME).routed_experts == model.config.n_routed_experts
    assert resolve_tasks(None, model) == TASK_FAMILIES  # the task suite is what it was trained on
    assert _model_parameter(NAME) == NAME
    assert main(["toy", "--name", NAME, "--out", str(tmp_path / "v3")]) == 0
    assert capsys.readouterr().out.strip() == str((tmp_path / "v3").absolute())
    assert (tmp_path / "v3" / "model.safetensors").read_bytes() == (
        toy_v3_path() / "model.safetensors"
    ).read_bytes()
    with pytest.raises(MoescopeError, match="--overwrite"):
        write_embedded(NAME, tmp_path / "v3")
    assert main(["inspect", NAME]) == 0 and "64" in capsys.readouterr().out
    with pytest.raises(MoescopeError, match="toy, toy-v3"):
        embedded_path("toy-v4")
    assert set(EMBEDDED) == {"toy", NAME}


def test_a_quarter_proxy_keeps_the_grouped_rule_and_loads_stock(tmp_path: Path) -> None:
    result = export_proxy(
        NAME, tmp_path / "proxy", keep="1/4", method="random", fidelity=False, progress=False
    )
    cfg = json.loads((result.path / "config.json").read_text())
    source = json.loads((toy_v3_path() / "config.json").read_text())
    for written in (cfg, source):  # the version of transformers that wrote each file
        written.pop("transformers_version")
    assert cfg == {**source, "n_routed_experts": 16}  # groups, top-k and shared experts as they were
    for entry in result.manifest["layers"]:
        assert [sum(e // 16 == g for e in entry["kept"]) for g in range(4)] == [4, 4, 4, 4]
    proxy = AutoModelForCausalLM.from_pretrained(result.path)
    assert type(proxy) is DeepseekV3ForCausalLM
    ids = torch.tensor([[1, 5, 6, 14, 7, 8, 16]])
    assert torch.isfinite(proxy(ids).logits).all()


# --- the build ------------------------------------------------------------------------------------

TINY = V3Recipe(
    tasks=("add2",),
    steps=3,
    batch_size=8,
    warmup_steps=1,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    first_k_dense_replace=1,  # a dense layer 0: counting and balancing skip it
    q_lora_rank=16,
    kv_lora_rank=16,
    n_routed_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=8,
    eval_n=4,
    eval_samples=1,
    eval_batch_size=4,
)


def test_a_short_build_is_deterministic_and_moves_only_the_correction_bias(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    paths = [build(tmp_path / name, TINY, log=lambda _: None) for name in ("a", "b")]
    assert torch.get_num_threads() == threads  # the build's thread count does not leak
    weights = [(p / "model.safetensors").read_bytes() for p in paths]
    assert weights[0] == weights[1]
    card = json.loads((paths[0] / CARD_NAME).read_text())
    assert card["recipe"]["steps"] == 3 and card["expert_load"]["layers"] == [1]
    model = AutoModelForCausalLM.from_pretrained(paths[0])
    bias = adapt(model).layers[0].correction_bias
    # three sign steps of size γ: every bias is a multiple of γ no larger than 3γ
    steps = bias / TINY.bias_update_speed
    assert (
        torch.allclose(steps, steps.round(), atol=1e-3) and steps.abs().max() <= 3 and steps.abs().max() > 0
    )


def test_balance_step_lifts_the_underloaded_and_lowers_the_overloaded() -> None:
    torch.manual_seed(0)
    model = make_model(TINY)
    with RoutingCounter(model) as counter:
        counter.counts[0] = torch.zeros(16, dtype=torch.float64)
        counter.counts[0, :4] = 10.0  # four experts took every slot
        balance_step(counter, 0.01)
        bias = adapt(model).layers[0].correction_bias
        assert torch.equal(bias[:4], torch.full((4,), -0.01)) and torch.equal(
            bias[4:], torch.full((12,), 0.01)
        )
        assert counter.counts.sum() == 0  # the next step counts afresh
        model(torch.tensor([[1, 5, 6, 14, 7]]))
    assert counter.counts.sum() == 5 * TINY.num_experts_per_tok  # one top-k per token
