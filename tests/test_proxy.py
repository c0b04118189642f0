"""Proxy export: stock-loadable checkpoints, a bit-identical backbone, and exact routing semantics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_process import moescope_process

from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_data
from moescope.explore.clustering import select_experts
from moescope.explore.routing import collect_routing
from moescope.export.config import ExportConfig
from moescope.export.manifest import MANIFEST, manifest_summary, read_manifest
from moescope.export.pipeline import export_proxy
from moescope.export.surgery import (
    build_proxy,
    expert_state_keys,
    weight_semantics,
    weight_semantics_by_architecture,
)
from moescope.keep import parse_keep
from moescope.models.table import ARCHITECTURES, config_value
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny


def _half(model) -> int:
    moe = adapt(model)
    rule = moe.layers[0].rule
    return parse_keep(0.5, moe.num_experts, moe.top_k, rule.n_group, topk_group=rule.topk_group)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_export_loads_with_stock_transformers_and_keeps_the_backbone(
    arch: str, tiny_checkpoint, tmp_path
) -> None:
    from transformers import AutoModelForCausalLM

    source = tiny_checkpoint(arch)
    original = AutoModelForCausalLM.from_pretrained(source).eval()
    result = export_proxy(
        source, tmp_path / "proxy", keep=_half(original), method="random", fidelity=False, progress=False
    )
    proxy = AutoModelForCausalLM.from_pretrained(result.path).eval()  # no moescope code involved
    spec = ARCHITECTURES[arch]
    kept = result.selection.keep
    assert config_value(proxy.config, spec.count_key) == kept
    assert spec.top_k(proxy.config) == spec.top_k(original.config)
    assert type(proxy) is type(original)

    moe, pmoe = adapt(original), adapt(proxy)
    for layer, player in zip(moe.layers, pmoe.layers, strict=True):
        ids = torch.tensor(result.selection.kept(layer.index))
        torch.testing.assert_close(player.router_weight, layer.router_weight[ids], rtol=0, atol=0)
        for j, i in enumerate(ids.tolist()):
            a, b = player.expert(j), layer.expert(i)
            assert torch.equal(a.flat(), b.flat())  # gate (where there is one), up, down, biases
        if layer.correction_bias is not None:
            assert torch.equal(player.correction_bias, layer.correction_bias[ids])
        if layer.router_bias is not None:
            assert torch.equal(player.router_bias, layer.router_bias[ids])
    source_state, expert_keys = original.state_dict(), expert_state_keys(pmoe)
    backbone = {key: value for key, value in proxy.state_dict().items() if key not in expert_keys}
    assert backbone.keys() == source_state.keys() - expert_keys.keys()
    for key, value in backbone.items():
        assert value.dtype == source_state[key].dtype and torch.equal(value, source_state[key]), key

    ids = torch.randint(3, 100, (1, 5), generator=torch.Generator().manual_seed(0))
    out = proxy.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 8)


def _per_token_choices(layer, hidden):
    _, weights, index = layer.route(hidden)
    return weights, index.sort(-1).values


EXACT_ARCHS = [a for a in TINY_ARCHS if a != "phimoe"]  # PhiMoE's sparsemixer weights change (documented)


# DBRX divided by the 2-norm (identical weights: it cancels any common scale) or not at all
# (scaled); Kolibri-1's chosen sigmoids renormalized (identical: the sum is over the chosen).
NORM_VARIANTS = [
    pytest.param("dbrx", {"ffn_config.moe_normalize_expert_weights": p}, id=f"dbrx-norm-{p}")
    for p in (2.0, None)
] + [pytest.param("kolibri1", {"norm_topk_prob": True}, id="kolibri1-normalized")]


@pytest.mark.parametrize(
    ("arch", "overrides"), [pytest.param(a, {}, id=a) for a in EXACT_ARCHS] + NORM_VARIANTS
)
def test_tokens_routed_inside_the_kept_set_get_the_same_output(arch: str, overrides: dict) -> None:
    """The documented semantics: identical weights, or weights scaled by 1 / P_kept."""
    model = tiny(arch, **overrides)
    moe = adapt(model)
    selection = select_experts(model, _half(model), method="random", seed=1)
    pmoe = adapt(build_proxy(model, selection))
    hidden = torch.randn(256, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    checked = 0
    with torch.no_grad():
        for layer, player in zip(moe.layers, pmoe.layers, strict=True):
            kept = torch.tensor(selection.kept(layer.index))
            logits, _, index = layer.route(hidden)
            inside = torch.isin(index, kept).all(-1)
            _, pindex = player.route(hidden)[1:]
            mapped = kept[pindex].sort(-1).values
            unchanged = (mapped == index.sort(-1).values).all(-1)
            if not layer.rule.grouped and ARCHITECTURES[arch].model_type != "ernie4_5_moe":
                assert torch.equal(unchanged[inside], torch.ones_like(unchanged[inside])), "choice changed"
            tokens = inside & unchanged
            checked += int(tokens.sum())
            x = hidden[tokens]
            routed = layer.block_forward(x) - _shared(layer, x)
            proxy_routed = player.block_forward(x) - _shared(player, x)
            if weight_semantics(layer.rule) == "scaled":
                p_kept = torch.softmax(logits[tokens].float(), -1)[:, kept].sum(-1, keepdim=True)
                routed = routed / p_kept
            torch.testing.assert_close(proxy_routed, routed, rtol=1e-4, atol=1e-5)
    assert checked >= 8, "too few tokens routed inside the kept set to test anything"


def _shared(layer, x):
    out = layer.shared_forward(x)
    return torch.zeros_like(x) if out is None else out


def test_weight_semantics_by_architecture_lists_every_row_by_its_rule() -> None:
    """Each architecture once, or once per setting of the switch its case hangs on."""
    by_case = weight_semantics_by_architecture()
    labels = [label for case in ("identical", "scaled", "changed") for label in by_case[case]]
    names = [label.split(" with ")[0] for label in labels]
    assert sorted(set(names)) == sorted(spec.name for spec in ARCHITECTURES.values())
    assert all(names.count(n) == 1 or f"{n} with" in " ".join(labels) for n in names)
    assert "Qwen3-MoE with norm_topk_prob: true" in by_case["identical"]
    assert "Qwen3-MoE with norm_topk_prob: false" in by_case["scaled"]
    assert "DBRX with ffn_config.moe_normalize_expert_weights: null" in by_case["scaled"]
    assert {"Jamba", "DeepSeek-V2"} <= set(by_case["scaled"])
    assert {"Mixtral", "DeepSeek-V3", "GPT-OSS", "Llama 4 (text)"} <= set(by_case["identical"])
    assert by_case["changed"] == ["PhiMoE"]


def test_export_of_the_toy_by_clustering_writes_the_manifest(tmp_path: Path) -> None:
    fidelity = {"n_tokens": 1024, "n_prompts": 16, "samples": 2}
    result = export_proxy(
        "toy",
        tmp_path / "proxy",
        keep="1/4",
        method="cluster",
        n_tokens=2000,
        fidelity=fidelity,
        min_capability=0,
        progress=False,
    )
    manifest = read_manifest(result.path)
    assert manifest["fidelity"]["kl"] == pytest.approx(result.fidelity.kl) and result.fidelity.kl > 0
    checks = {c["name"]: c["passed"] for c in manifest["checklist"]}
    assert checks["backbone identical"] and checks["routing mechanism identical"]
    assert manifest == result.manifest
    assert manifest["keep"] == 8 and manifest["source"]["num_experts"] == 32
    assert manifest["method"] == "cluster" and manifest["view"] == "multiview"
    assert [entry["layer"] for entry in manifest["layers"]] == [0, 1, 2, 3]
    assert all(len(entry["kept"]) == 8 and len(entry["labels"]) == 32 for entry in manifest["layers"])
    assert manifest["proxy"]["weight_semantics"] == "identical"  # Qwen3-MoE with norm_topk_prob
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json", MANIFEST} <= {
        p.name for p in result.path.iterdir()
    }
    assert not (result.path / "toy_card.json").exists(), "the toy's card describes the toy, not the proxy"
    assert json.loads((result.path / "config.json").read_text())["num_local_experts"] == 8


def test_a_selection_file_is_reused_and_checked(tmp_path: Path, tiny_checkpoint) -> None:
    source = tiny_checkpoint("mixtral")
    model = tiny("mixtral")
    selection = select_experts(model, 4, method="random", seed=3)
    selection.save(tmp_path / "selection.json")
    result = export_proxy(
        source, tmp_path / "p", selection=tmp_path / "selection.json", fidelity=False, progress=False
    )
    assert result.selection.layers == selection.layers
    other = select_experts(tiny("qwen3_moe"), 4, method="random")
    other.save(tmp_path / "other.json")
    with pytest.raises(MoescopeError, match="config hash"):
        export_proxy(source, tmp_path / "q", selection=tmp_path / "other.json", progress=False)
    with pytest.raises(MoescopeError, match="selection keeps 4"):
        export_proxy(source, tmp_path / "q", selection=selection, keep=6, progress=False)
    assert not (tmp_path / "q").exists()


def test_the_default_method_is_auto_and_the_papers_where_nothing_can_be_measured(
    tmp_path: Path, tiny_checkpoint
) -> None:
    """Without --method an in-memory export is ``auto``; on a checkpoint without tokenizer no task
    can be measured, so it chooses by the paper's selection and says why (a streaming export,
    which never runs the model, clusters the weights: test_streaming)."""
    source = tiny_checkpoint("qwen3_moe")
    result = export_proxy(source, tmp_path / "p", keep=4, fidelity=False, progress=False)
    model = tiny("qwen3_moe")
    ids = calibration_data(model, None, "rl", n_tokens=20_000, seed=0)
    stats = collect_routing(model, ids, n_tokens=20_000, progress=False)
    assert result.selection.layers == select_experts(model, 4, method="paper", stats=stats).layers
    assert (result.manifest["method"], result.manifest["config"]["method"]) == ("paper", "auto")
    choice = result.manifest["method_choice"]
    assert choice["fallback"] == "paper" and choice["why"].startswith("no tasks") and not choice["choices"]


def test_a_checkpoint_without_tokenizer_is_calibrated_on_seeded_random_ids_and_summarised(
    tmp_path: Path, tiny_checkpoint
) -> None:
    source = tiny_checkpoint("mixtral")
    result = export_proxy(source, tmp_path / "p", keep=4, method="frequency", fidelity=False, progress=False)
    model = tiny("mixtral")
    ids = calibration_data(model, None, "rl", n_tokens=20_000, seed=0)  # the export's default, random here
    stats = collect_routing(model, ids, n_tokens=20_000, progress=False)
    assert result.selection.layers == select_experts(model, 4, method="frequency", stats=stats).layers
    summary = manifest_summary(result.path)
    assert summary.name == "proxy" and summary["method"] == "frequency" and summary["view"] is None
    assert summary["kept per layer"] == "4 of 8"
    assert summary["routing weights on unchanged choices"] == result.manifest["proxy"]["weight_semantics"]
    assert summary["files"] == ", ".join(sorted(p.name for p in result.path.iterdir()))
    with pytest.raises(MoescopeError, match=f"holds no {MANIFEST}"):
        manifest_summary(source)


def test_bad_input_writes_nothing(tmp_path: Path, tiny_checkpoint) -> None:
    source = tiny_checkpoint("mixtral")
    with pytest.raises(MoescopeError, match="say how many experts to keep"):
        export_proxy(source, tmp_path / "a", progress=False)
    with pytest.raises(MoescopeError, match="top-k"):
        export_proxy(source, tmp_path / "a", keep=1, method="random", progress=False)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "precious.txt").write_text("keep me")
    with pytest.raises(MoescopeError, match="--overwrite"):
        export_proxy(source, tmp_path / "b", keep=4, method="random", progress=False)
    assert (tmp_path / "b" / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_the_config_form_and_the_keyword_form_export_alike_and_the_manifest_keeps_the_config(
    tmp_path: Path, tiny_checkpoint
) -> None:
    source = tiny_checkpoint("mixtral")
    config = ExportConfig(keep=4, method="random", seed=2, fidelity=False)
    new = export_proxy(source, config, out=tmp_path / "new", progress=False)
    options = {"keep": 4, "method": "random", "seed": 2, "fidelity": False}
    old = export_proxy(source, tmp_path / "old", progress=False, **options)
    assert new.selection.layers == old.selection.layers
    recorded = read_manifest(new.path)["config"]
    assert recorded == config.to_dict() == old.manifest["config"]
    assert ExportConfig.from_dict(recorded) == config  # the manifest alone says how to make the proxy again
    # a Selection object goes beside the config: the manifest's selection holds it, the config names no file
    again = export_proxy(source, config, out=tmp_path / "again", selection=new.selection, progress=False)
    assert again.selection.layers == new.selection.layers and again.manifest["config"]["selection"] is None
    streamed = export_proxy(source, config, out=tmp_path / "streamed", streaming=True, progress=False)
    assert read_manifest(streamed.path)["config"] == {**config.to_dict(), "streaming": True}
    with pytest.raises(TypeError, match="out="):
        export_proxy(source, config)


@pytest.mark.slow
def test_cli_export_reloads_and_bad_input_exits_2(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = moescope_process(
        "export",
        "toy",
        "--keep",
        "1/4",
        "--method",
        "frequency",
        "--n-tokens",
        "2000",
        "--min-capability",
        "0",
        "--out",
        str(tmp_path / "proxy"),
    )
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert "8 of 32 routed experts" in out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "proxy")
    tok = AutoTokenizer.from_pretrained(tmp_path / "proxy")
    answer = model.generate(**tok("12+34=", return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert answer.shape[1] > 7
    again = moescope_process("export", "toy", "--keep", "1/4", "--out", str(tmp_path / "proxy"))
    _, err = again.communicate(timeout=300)
    assert again.returncode == 2 and "--overwrite" in err and "Traceback" not in err
    too_few = moescope_process("export", "toy", "--keep", "1", "--out", str(tmp_path / "p1"))
    _, err = too_few.communicate(timeout=300)
    assert too_few.returncode == 2 and "top-k" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p1").exists()


@pytest.mark.slow
def test_cli_export_measures_task_capability_on_a_prompt_file(tmp_path: Path) -> None:
    """``--prompts``: the checklist's task capability compares accuracy on the user's prompts;
    a missing file, or prompts with the one-read weight-view cut, fail before anything is written."""
    from moescope.models.tasks import heldout

    prompts = tmp_path / "sums.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in heldout("add2", 12))
    )
    out = tmp_path / "proxy"
    run = moescope_process(
        "export", "toy", "--keep", "1/2", "--method", "random", "--prompts", str(prompts), "--out", str(out)
    )
    stdout, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    capability = read_manifest(out)["checklist"][2]
    assert capability["details"]["measured"] and capability["details"]["tasks"] == ["sums"]
    assert "(greedy; sums " in capability["figure"] and capability["figure"] in stdout
    for extra, says in [
        ((), "nope.jsonl does not exist"),
        (("--streaming", "--method", "cluster"), "reads the model"),
    ]:
        missing = prompts if extra else tmp_path / "nope.jsonl"
        bad = moescope_process(
            "export", "toy", "--keep", "1/2", *extra, "--prompts", str(missing), "--out", str(tmp_path / "p2")
        )
        _, err = bad.communicate(timeout=300)
        assert bad.returncode == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proxy", "sums.jsonl"]


def test_export_with_prompts_needs_a_tokenizer(tmp_path: Path) -> None:
    source = tmp_path / "mixtral"
    tiny("mixtral").save_pretrained(source)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(MoescopeError, match="task accuracy needs a tokenizer"):
        export_proxy(source, tmp_path / "out", keep=4, method="random", tasks=prompts, progress=False)
    assert not (tmp_path / "out").exists()
    no_tasks = export_proxy(source, tmp_path / "none", keep=4, method="random", tasks=(), progress=False)
    assert not no_tasks.checklist[2].details["measured"]  # naming no task needs no tokenizer


@pytest.mark.slow
def test_an_export_killed_midway_leaves_nothing_at_the_output_path(tmp_path: Path) -> None:
    """SIGKILL while the proxy is being written: the output path never holds a partial proxy,
    and the next export cleans the killed run's temporary directory."""
    import signal
    import time

    out = tmp_path / "proxy"
    run = moescope_process(
        "export", "toy", "--keep", "1/4", "--method", "random", "--no-fidelity", "--out", str(out)
    )
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob(".proxy.partial-*")) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert run.poll() is None, "the export ended before it was seen writing; nothing was tested"
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=60)
    assert not out.exists()
    assert list(tmp_path.glob(".proxy.partial-*")), "the killed run's work directory is the evidence"
    finish = moescope_process(
        "export", "toy", "--keep", "1/4", "--method", "random", "--no-fidelity", "--out", str(out)
    )
    _, err = finish.communicate(timeout=300)
    assert finish.returncode == 0, err
    assert read_manifest(out)["keep"] == 8
    assert not list(tmp_path.glob(".proxy.partial-*")), "the stale work directory was removed"
