"""Healing: the held-out KL falls, only router rows and kept experts change, the result is
deterministic and still a stock checkpoint; an exported directory is rewritten in place."""

from __future__ import annotations

import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.export.fidelity.measure import Fidelity, validity_checklist
from moescope.export.healing import HealingReport, heal, heal_proxy_dir, trainable_tensors
from moescope.export.manifest import read_manifest
from moescope.export.pipeline import export_proxy
from moescope.export.surgery import build_proxy, expert_state_keys
from moescope.models.toy import load_toy
from moescope.models.view import adapt

SHORT = {"steps": 6, "batch_size": 16, "heldout_tokens": 1024, "tasks": ()}


@pytest.fixture(scope="module")
def toy():
    return load_toy()


@pytest.fixture(scope="module")
def selection(toy):
    return select_experts(toy[0], "1/4", method="random")


@pytest.fixture(scope="module")
def healed(toy, selection):
    """A 1/4 proxy before (a state-dict copy) and after healing, with the report."""
    model, tok = toy
    proxy = build_proxy(model, selection)
    before = {name: tensor.clone() for name, tensor in proxy.state_dict().items()}
    report = heal(model, proxy, tokenizer=tok, **{**SHORT, "tasks": ["add2"]}, n_prompts=16, samples=2)
    return proxy, before, report


def test_healing_lowers_the_heldout_kl(healed) -> None:
    _, _, report = healed
    assert report.kl_after < report.kl_before
    assert len(report.loss) == 6 and report.n_tokens > 0
    assert report.heldout == "held-out task pool" and "task suite" in report.data


def test_healing_trains_only_router_rows_and_kept_experts(toy, healed) -> None:
    model, _ = toy
    proxy, before, report = healed
    trained = set(trainable_tensors(adapt(proxy)))
    assert trained == set(expert_state_keys(adapt(proxy)))  # the toy has no correction bias (a buffer)
    assert set(report.trained) == trained
    after = proxy.state_dict()
    for name, tensor in after.items():
        if name in trained:
            assert not torch.equal(tensor, before[name]), f"{name} did not train"
        else:
            assert torch.equal(tensor, before[name]), f"{name} changed"
    unsaved_buffers = {name for name, _ in proxy.named_buffers()} - after.keys()  # rotary frequencies
    assert report.frozen_verified == len(after) - len(trained) + len(unsaved_buffers)
    assert all(p.requires_grad for p in proxy.parameters())  # flags restored
    assert all(p.requires_grad for p in model.parameters())  # the shared backbone too


def test_healing_reports_accuracy_before_and_after(healed) -> None:
    _, _, report = healed
    frame = report.accuracy
    assert list(frame.columns) == ["task", "mode", "n", "original", "before", "after"]
    assert list(frame["mode"]) == ["greedy", "sampled"] and set(frame["n"]) == {16}


def test_healed_proxy_passes_the_model_side_checks_and_loads_with_stock_transformers(
    toy, healed, selection, tmp_path
) -> None:
    from transformers import AutoModelForCausalLM

    model, _ = toy
    proxy, _, report = healed
    backbone, routing, _ = validity_checklist(model, proxy, selection=selection)
    assert backbone.passed and routing.passed
    proxy.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(3, 44, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, proxy.eval()(ids).logits)
    assert HealingReport.load(report.save(tmp_path / "healing.json")).to_dict() == report.to_dict()


def test_healing_is_deterministic(toy, selection) -> None:
    model, tok = toy
    weights = []
    for _ in range(2):
        proxy = build_proxy(model, selection)
        heal(model, proxy, tokenizer=tok, **{**SHORT, "steps": 2, "heldout_tokens": 128})
        weights.append(proxy.state_dict())
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_bad_step_count_is_one_clear_error(toy, selection) -> None:
    model, tok = toy
    with pytest.raises(MoescopeError, match="steps must be a positive whole number"):
        heal(model, build_proxy(model, selection), tokenizer=tok, steps=0)


@pytest.mark.slow
def test_heal_proxy_dir_rewrites_the_directory_and_the_manifest(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    # measured as heal_proxy_dir measures it below, whose figures replace these in the manifest
    measure = {"n_tokens": 512, "tasks": ()}
    result = export_proxy(
        "toy",
        tmp_path / "proxy",
        keep="1/4",
        method="random",
        min_capability=0,
        fidelity=measure,
        progress=False,
    )
    old = AutoModelForCausalLM.from_pretrained(result.path).state_dict()
    report = heal_proxy_dir(
        result.path,
        steps=2,
        batch_size=16,
        heldout_tokens=512,
        tasks=(),
        measure=measure,
    )
    manifest = read_manifest(result.path)
    assert manifest["healing"] == report.to_dict()
    assert manifest["layers"] == result.manifest["layers"]
    assert Fidelity.from_dict(manifest["fidelity"]).kl == pytest.approx(report.kl_after)  # same tokens
    assert [c["passed"] for c in manifest["checklist"]][:2] == [True, True]
    new = AutoModelForCausalLM.from_pretrained(result.path).state_dict()
    assert not torch.equal(new["model.layers.0.mlp.gate.weight"], old["model.layers.0.mlp.gate.weight"])
    assert torch.equal(new["model.embed_tokens.weight"], old["model.embed_tokens.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proxy"]  # no temporary left behind
