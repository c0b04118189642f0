"""Fidelity and the validity checklist: exact zeros for an identity proxy, ordered figures for
smaller proxies, each check failing on the change it guards and naming it."""

from __future__ import annotations

import json

import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.routing import collect_routing
from moescope.export.fidelity.measure import (
    BACKBONE,
    CAPABILITY,
    ROUTING,
    Fidelity,
    measure_fidelity,
    record_in_manifest,
    validity_checklist,
)
from moescope.export.manifest import read_manifest
from moescope.export.pipeline import export_proxy
from moescope.export.surgery import build_proxy
from moescope.keep import parse_keep
from moescope.models.evaluation import evaluate_tasks
from moescope.models.tasks import heldout
from moescope.models.toy import load_toy
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny

FAST = {"n_tokens": 512, "tasks": ()}  # no generation: the next-token figures only


@pytest.fixture(scope="module")
def toy():
    return load_toy()


@pytest.fixture(scope="module")
def stats(toy):
    model, tok = toy
    return collect_routing(model, "tasks", tokenizer=tok, n_tokens=2048, progress=False)


@pytest.fixture(scope="module")
def proxies(toy, stats):
    """Frequency proxies keeping 32 (all), 16, 8 and 4 experts: nested, so fewer kept is a strict subset."""
    model, _ = toy
    out = {}
    for keep in (32, 16, 8, 4):
        selection = select_experts(model, keep, method="frequency", stats=stats)
        out[keep] = (build_proxy(model, selection), selection)
    return out


def test_identity_proxy_is_exact_and_passes_every_check(toy, proxies) -> None:
    model, tok = toy
    proxy, _ = proxies[32]
    fid = measure_fidelity(
        model, proxy, tokenizer=tok, n_tokens=1024, tasks=["add2"], n_prompts=16, samples=2
    )
    assert fid.kl == 0.0 and fid.top1_agreement == 1.0 and fid.perplexity_ratio == 1.0
    assert set(fid.routing_distance.values()) == {0.0} and set(fid.routing_coverage.values()) == {1.0}
    accuracy = fid.task_accuracy
    assert list(accuracy["original"]) == list(accuracy["proxy"])
    checks = validity_checklist(model, proxy, fid)
    assert [c.name for c in checks] == [BACKBONE, ROUTING, CAPABILITY]
    assert all(c.passed for c in checks), [c.figure for c in checks]
    assert checks[2].details["ratio"] == 1.0


def test_fewer_kept_experts_give_worse_figures(toy, proxies) -> None:
    model, tok = toy
    figures = {keep: measure_fidelity(model, proxies[keep][0], tokenizer=tok, **FAST) for keep in (16, 8, 4)}
    assert figures[8].kl > 0
    assert figures[16].kl < figures[8].kl < figures[4].kl
    assert figures[16].top1_agreement > figures[4].top1_agreement
    assert figures[16].perplexity_ratio < figures[4].perplexity_ratio
    for layer in figures[4].routing_coverage:  # nested selections: a superset covers more
        assert (
            figures[16].routing_coverage[layer]
            > figures[8].routing_coverage[layer]
            > figures[4].routing_coverage[layer]
        )
    assert all(0 < d <= 1 for d in figures[4].routing_distance.values())
    assert {f.n_tokens for f in figures.values()} == {figures[4].n_tokens}  # the same held-out positions


def test_figures_are_deterministic_and_survive_save_load(toy, proxies, tmp_path) -> None:
    model, tok = toy
    proxy, _ = proxies[8]
    kw = {"n_tokens": 512, "tasks": ["add2"], "n_prompts": 16, "samples": 2}
    first, second = (measure_fidelity(model, proxy, tokenizer=tok, **kw) for _ in range(2))
    assert first.to_dict() == second.to_dict()
    loaded = Fidelity.load(first.save(tmp_path / "fidelity.json"))
    assert loaded.to_dict() == first.to_dict()
    assert loaded.to_frame().equals(first.to_frame())
    shares = loaded.routing_shares
    assert shares.groupby("layer")["proxy"].sum().round(9).eq(1.0).all()


def test_backbone_check_fails_on_a_perturbed_tensor_and_names_it(toy, proxies) -> None:
    model, _ = toy
    selection = proxies[8][1]
    proxy = build_proxy(model, selection)  # shares the backbone tensors with the model: replace one
    norm = proxy.model.layers[1].input_layernorm
    norm.weight = torch.nn.Parameter(norm.weight.detach().clone())
    with torch.no_grad():
        norm.weight[3] += 1e-3
    backbone, routing, _ = validity_checklist(model, proxy, selection=selection)
    name = "model.layers.1.input_layernorm.weight"
    assert not backbone.passed and routing.passed
    assert f"{name} (values differ in 1 of 128 elements)" in backbone.figure
    assert list(backbone.details["tensors_differing"]) == [name]


def test_backbone_check_reads_a_sub_config_field_by_field() -> None:
    """DBRX keeps its expert settings in ffn_config: the count may change there, nothing else."""
    model = tiny("dbrx")
    selection = select_experts(model, 4, method="random", seed=0)
    proxy = build_proxy(model, selection)
    backbone, routing, _ = validity_checklist(model, proxy, selection=selection)
    assert backbone.passed and routing.passed, (backbone.figure, routing.figure)
    assert "ffn_config.moe_num_experts 8 → 4" in backbone.figure
    assert "ffn_config.moe_top_k" in backbone.details["routing_keys"]
    proxy.config.ffn_config.moe_jitter_eps = 0.01
    backbone = validity_checklist(model, proxy, selection=selection)[0]
    assert not backbone.passed and list(backbone.details["config_differing"]) == ["ffn_config.moe_jitter_eps"]


def test_routing_check_fails_on_an_edited_top_k_and_names_it(toy, proxies, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    model, _ = toy
    proxy, _ = proxies[8]
    proxy.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 3}))
    edited = AutoModelForCausalLM.from_pretrained(tmp_path)
    backbone, routing, _ = validity_checklist(model, edited)
    assert backbone.passed and not routing.passed
    assert "top_k 2 → 3" in routing.figure
    assert "router.top_k 2 → 3" in routing.details["problems"]


def test_routing_check_fails_on_a_changed_scoring(toy, proxies) -> None:
    model, _ = toy
    proxy = build_proxy(model, proxies[8][1])
    proxy.config.norm_topk_prob = False
    routing = validity_checklist(model, proxy)[1]
    assert not routing.passed and "normalize True → False" in routing.figure


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_model_side_checks_pass_for_a_half_proxy_of_every_architecture(arch: str) -> None:
    model = tiny(arch)
    moe = adapt(model)
    keep = parse_keep(0.5, moe.num_experts, moe.top_k, moe.rule.n_group, topk_group=moe.rule.topk_group)
    proxy = build_proxy(model, select_experts(model, keep, method="random"))
    backbone, routing, _ = validity_checklist(model, proxy)
    assert backbone.passed, backbone.figure
    assert routing.passed, routing.figure


def test_routing_check_compares_the_correction_bias_of_the_kept_experts() -> None:
    model = tiny("deepseek_v3")
    selection = select_experts(model, 8, method="random")
    proxy = build_proxy(model, selection)
    with torch.no_grad():
        adapt(proxy).layers[0].correction_bias[1] += 0.5  # a sliced copy: the model is untouched
    routing = validity_checklist(model, proxy, selection=selection)[1]
    assert not routing.passed
    assert "correction_bias is not the original's entries of the kept experts (layers [1])" in routing.figure


def test_capability_check_is_a_ratio_against_the_threshold(toy, proxies) -> None:
    model, tok = toy
    proxy, _ = proxies[4]
    fid = measure_fidelity(model, proxy, tokenizer=tok, n_tokens=256, tasks=["add2"], n_prompts=16, samples=2)
    capability = validity_checklist(model, proxy, fid, accuracy_threshold=0.8)[2]
    rows = fid.task_accuracy[fid.task_accuracy["mode"] == "sampled"]
    expected = float(rows["proxy"].mean() / rows["original"].mean())
    assert capability.details["ratio"] == pytest.approx(expected)
    assert capability.passed == (expected >= 0.8)
    assert not validity_checklist(model, proxy)[2].passed  # without a measurement: not measured


def test_prompt_file_accuracy_matches_the_task_suite(toy, proxies, tmp_path) -> None:
    model, tok = toy
    examples = heldout("add2", 16)
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n" for ex in examples))
    fid = measure_fidelity(model, proxies[32][0], tokenizer=tok, n_tokens=256, tasks=path)
    (row,) = fid.task_accuracy.itertuples()
    assert (row.task, row.mode, row.n) == ("sums", "greedy", 16)
    assert row.original == row.proxy == evaluate_tasks(model, tok, ["add2"], n=16, samples=1)["add2"].greedy


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": 4}\n',
            "bad.jsonl:2 has no 'answer' string",
        ),
        ('{"prompt": "1+1=", "answer": "2"}\nnot json\n', "bad.jsonl:2 is not valid JSON"),
        ('["1+1=", "2"]\n', "bad.jsonl:1 holds a JSON list, not an object"),
        ("\n\n", "holds no prompts"),
    ],
)
def test_malformed_prompt_file_is_one_clear_error(toy, proxies, tmp_path, text: str, says: str) -> None:
    model, tok = toy
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(MoescopeError) as err:
        measure_fidelity(model, proxies[8][0], tokenizer=tok, tasks=path)
    message = str(err.value)
    assert says in message and message.endswith(".") and "\n" not in message
    assert message.count("; ") == 1  # the problem; the fix


def test_changed_router_rows_need_the_selection(toy, proxies) -> None:
    model, tok = toy
    selection = proxies[8][1]
    proxy = build_proxy(model, selection)
    with torch.no_grad():
        proxy.get_parameter("model.layers.0.mlp.gate.weight").mul_(1.01)  # a copy: the model is untouched
    with pytest.raises(MoescopeError, match="pass selection="):
        measure_fidelity(model, proxy, tokenizer=tok, **FAST)
    assert measure_fidelity(model, proxy, tokenizer=tok, selection=selection, **FAST).kl > 0


@pytest.mark.slow
def test_record_in_manifest_keeps_the_rest_and_reads_back(toy, tmp_path) -> None:
    model, tok = toy
    result = export_proxy(
        "toy", tmp_path / "proxy", keep="1/4", method="random", min_capability=0, progress=False
    )
    fid = measure_fidelity(
        model, result.path, tokenizer=tok, n_tokens=512, tasks=["add2"], n_prompts=8, samples=2
    )
    checks = validity_checklist(model, build_proxy(model, result.selection), fid)
    manifest = record_in_manifest(result.path, fid, checks)
    stored = read_manifest(result.path)
    assert stored == json.loads(json.dumps(manifest))
    assert stored["layers"] == result.manifest["layers"]  # the rest stays
    assert Fidelity.from_dict(stored["fidelity"]).to_dict() == fid.to_dict()
    assert [c["name"] for c in stored["checklist"]] == [BACKBONE, ROUTING, CAPABILITY]
    assert stored["fidelity"]["task_accuracy"][0]["original_mixed"] is None  # NaN → null, valid JSON
    assert [p.name for p in tmp_path.iterdir()] == ["proxy"]  # no temporary left behind
