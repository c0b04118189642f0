"""Routing statistics against the model's own routers, on every architecture of the tiny zoo."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_data
from moescope.explore.routing import (
    RoutingObserver,
    RoutingStats,
    calibration_batches,
    collect_routing,
    observe_routing,
)
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(arch: str, **overrides):
    # The zoo's Multi-head Latent Attention models have 2 KV heads, which their attention only
    # handles without a padding mask; real MLA checkpoints have one KV head per query head.
    if "kv_lora_rank" in tiny_config(arch).to_dict():
        overrides.setdefault("num_key_value_heads", 4)
    return tiny(arch, **overrides)


def _padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, vocab, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:], mask[3, 3:] = 0, 0  # right padding: 48 - 5 - 9 = 34 real tokens
    return ids, mask


def _router_records(model, ids, mask) -> tuple[torch.Tensor, dict[int, list[tuple]]]:
    """Logits of a plain forward, and per MoE layer what its stock router saw and returned, once
    per call (a looped layer routes once per pass)."""
    moe, seen = adapt(model), {}

    def record(index: int):
        def hook(module, args, out) -> None:
            seen.setdefault(index, []).append((args[0].detach().reshape(-1, args[0].shape[-1]), out))

        return hook

    handles = [layer.router.register_forward_hook(record(layer.index)) for layer in moe.layers]
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
    for handle in handles:
        handle.remove()
    return logits, seen


def _direct(layer, hidden, out, valid) -> dict[str, np.ndarray]:
    """Statistics of one layer computed straight from its stock router's output, token by token."""
    if layer.spec.combine == "input":  # Llama 4: (scores [T, E], logits); chosen = non-zero scores
        scores, logits = out
        index = scores.gt(0).float().topk(layer.top_k, dim=1).indices
        weights = scores.gather(1, index)
    elif isinstance(out, torch.Tensor):  # DBRX: logits; the block chooses with its own method
        logits, (weights, index) = out, layer.block.route_tokens_to_experts(out)
    else:
        logits, weights, index = out
    hidden, logits, weights, index = (
        hidden[valid],
        logits[valid].double(),
        weights[valid].double(),
        index[valid],
    )
    if layer.rule.scoring == "sigmoid":
        probs = torch.sigmoid(logits) / torch.sigmoid(logits).sum(-1, keepdim=True)
    else:
        probs = torch.softmax(logits, -1)
    n = layer.num_experts
    chosen = torch.zeros(len(index), n).scatter_(1, index, 1.0)
    saliency = torch.zeros(n, dtype=torch.float64)
    with torch.no_grad():
        for expert in range(n):
            rows, slots = torch.where(index == expert)
            norms = layer.expert_forward(expert, hidden[rows]).norm(dim=-1).double()
            saliency[expert] = (weights[rows, slots] * norms).sum()
    return {
        "counts": chosen.sum(0).long().numpy(),
        "coactivation": (chosen.T @ chosen).long().numpy(),
        "saliency_sum": saliency.numpy(),
        "prob_mass": probs.sum(0).numpy(),
        "entropy_sum": -(probs * probs.log()).sum().numpy(),
        "max_logit": logits.max().numpy(),
    }


def _check_against_router(model) -> RoutingObserver:
    ids, mask = _padded_batch(model.config.vocab_size)
    plain, seen = _router_records(model, ids, mask)
    with torch.no_grad(), observe_routing(model) as observer:
        observed = model(ids, attention_mask=mask).logits
    assert torch.equal(observed, plain), "observation changed the model's output"
    stats, valid = observer.stats(), mask.reshape(-1).bool()
    assert stats.n_tokens == int(mask.sum())
    for row, layer in enumerate(adapt(model).layers):
        calls = [_direct(layer, *call, valid) for call in seen[layer.index]]
        assert stats.passes[row] == len(calls)
        direct = {name: sum(c[name] for c in calls) for name in calls[0] if name != "max_logit"}
        direct["max_logit"] = max(c["max_logit"] for c in calls)
        for name in ("counts", "coactivation"):
            np.testing.assert_array_equal(getattr(stats, name)[row], direct[name], err_msg=name)
        for name in ("saliency_sum", "prob_mass", "entropy_sum", "max_logit"):
            np.testing.assert_allclose(
                getattr(stats, name)[row], direct[name], rtol=1e-5, atol=1e-5, err_msg=name
            )
    return observer


_SLOW_ARCHS = {"granitemoehybrid"}  # the reference Mamba-2 kernel takes seconds on CPU


@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.slow) if a in _SLOW_ARCHS else a for a in TINY_ARCHS]
)
def test_recorded_routing_and_saliency_equal_the_models_own(arch: str) -> None:
    """Top-k choices equal what each stock router chose; saliency equals a direct computation."""
    stats = _check_against_router(_model(arch)).stats()
    k, n = stats.top_k, stats.routed_tokens
    np.testing.assert_array_equal(stats.counts.sum(axis=1), k * n)
    np.testing.assert_allclose(stats.prob_mass.sum(axis=1), n, rtol=1e-6)
    assert np.all(stats.max_logit == stats.expert_max_logit.max(axis=1))
    assert np.all(stats.entropy_hist.sum(axis=1) == n)
    np.testing.assert_allclose(stats.load_share.sum(axis=1), 1.0)
    assert np.all(stats.mean_entropy <= math.log(stats.num_experts) + 1e-6)


def test_a_looped_span_of_layers_counts_every_pass(tmp_path) -> None:
    """Inkling 2 Loop runs layers 1 and 2 twice per forward: their sums count both passes, and
    the shares and mean entropy divide by the tokens they routed, so rows still sum to 1."""
    model = _model("inkling2_loop_text")
    config = model.config
    stats = _check_against_router(model).stats()
    looped = range(config.loop_layer_index_start, config.loop_layer_index_end)
    assert stats.passes.tolist() == [config.loop_num_passes if i in looped else 1 for i in stats.layers]
    assert stats.passes.tolist() == [1, 2, 2, 1]
    np.testing.assert_allclose(stats.prob_share.sum(axis=1), 1.0)
    np.testing.assert_allclose(stats.mean_entropy, stats.entropy_sum / stats.routed_tokens)
    path = stats.save(tmp_path / "stats.npz")
    assert RoutingStats.load(path).passes.tolist() == [1, 2, 2, 1]


@pytest.mark.parametrize(("impl", "source"), [("batched_mm", "captured"), ("eager", "recomputed")])
def test_saliency_holds_for_every_experts_implementation(impl: str, source: str) -> None:
    """Norms captured in token-major order (batched_mm) or recomputed (the eager loop) agree too."""
    model = _model("deepseek_v3")
    model.set_experts_implementation(impl)
    assert set(_check_against_router(model).saliency_source.values()) == {source}


def test_saliency_is_captured_without_recomputing_experts(monkeypatch) -> None:
    from moescope.models.view import MoELayer

    model, calls = _model("qwen3_moe"), []
    original = MoELayer.expert_forward
    monkeypatch.setattr(MoELayer, "expert_forward", lambda *a: calls.append(a) or original(*a))
    with torch.no_grad(), observe_routing(model) as observer:
        model(torch.randint(3, 128, (2, 8)))
    assert set(observer.saliency_source.values()) == {"captured"}
    assert not calls
    assert not observer._pending and not observer._experts_in, "nothing of the pass is kept"


def test_hooks_and_tap_are_removed_also_on_error() -> None:
    model = _model("mixtral")
    layer = adapt(model).layers[0]
    with pytest.raises(ValueError), observe_routing(model):
        assert layer.experts.has_post_expert_norm
        raise ValueError("inside the block")
    assert not layer.experts.has_post_expert_norm and not hasattr(layer.experts, "post_expert_norm")
    assert not layer.router._forward_hooks and not layer.experts._forward_pre_hooks
    assert not getattr(model, "model", model)._forward_pre_hooks


def test_collect_routing_on_token_tensors_counts_top_k_per_token() -> None:
    model = _model("mixtral").train()
    ids = torch.randint(3, 128, (5, 40), generator=torch.Generator().manual_seed(1))
    stats = collect_routing(model, ids, n_tokens=150, batch_size=2, seq_len=16, progress=False)
    assert model.training, "the training flag must be restored"
    assert stats.n_tokens == 150 and stats.layers == (0, 1)
    np.testing.assert_array_equal(stats.counts.sum(axis=1), 150 * stats.top_k)
    np.testing.assert_array_equal(np.diagonal(stats.coactivation, axis1=1, axis2=2), stats.counts)
    assert np.array_equal(stats.coactivation, stats.coactivation.transpose(0, 2, 1))
    assert stats.source == "token tensors (5 rows)"


def test_stats_round_trip_through_a_file(tmp_path) -> None:
    stats = collect_routing(
        _model("deepseek_v3"), torch.randint(3, 128, (3, 20)), n_tokens=60, progress=False
    )
    path = stats.save(tmp_path / "routing.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["routing.npz"], "no temporary file is left behind"
    loaded = RoutingStats.load(path)
    assert (loaded.layers, loaded.n_tokens, loaded.config_hash) == (stats.layers, 60, stats.config_hash)
    np.testing.assert_array_equal(loaded.coactivation, stats.coactivation)
    np.testing.assert_array_equal(loaded.expert_max_logit, stats.expert_max_logit)
    frame = loaded.to_frame()
    assert list(frame.columns[:2]) == ["layer", "expert"] and len(frame) == 2 * stats.num_experts
    assert frame.groupby("layer")["load_share"].sum().round(9).eq(1).all()
    assert stats.layer_index(2) == 1 and loaded.dead_experts.shape == (2,)
    with pytest.raises(MoescopeError, match="not an MoE layer"):
        stats.layer_index(0)


def test_load_refuses_other_files(tmp_path) -> None:
    other = tmp_path / "other.npz"
    np.savez(other, header=np.array(json.dumps({"kind": "something else"})))
    with pytest.raises(MoescopeError, match="not a routing statistics file"):
        RoutingStats.load(other)
    with pytest.raises(MoescopeError, match="does not exist"):
        RoutingStats.load(tmp_path / "missing.npz")


@pytest.mark.parametrize(
    ("data", "n_tokens", "match"),
    [
        ("tasks", 0, "n_tokens must be a positive"),
        ("tasks", -5, "n_tokens must be a positive"),
        ("missing.txt", 100, "does not exist"),
        ("empty.txt", 100, "holds no text"),
        ("blank.jsonl", 100, "holds no text"),
        ("bad.jsonl", 100, "bad.jsonl:2 has no 'text'"),
    ],
)
def test_bad_input_is_one_clear_sentence_and_writes_nothing(
    tmp_path, monkeypatch, data, n_tokens, match
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.txt").write_text("\n   \n")
    (tmp_path / "blank.jsonl").write_text("\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "ab"}\n{"title": "x"}\n')
    before = sorted(tmp_path.iterdir())
    model = _model("mixtral")
    with pytest.raises(MoescopeError, match=match) as err:
        collect_routing(model, data, tokenizer=_CharTokenizer(), n_tokens=n_tokens, progress=False)
    message = str(err.value)
    assert message.count(". ") == 0 and message.endswith(".") and ";" in message, "one sentence with its fix"
    assert sorted(tmp_path.iterdir()) == before
    assert not adapt(model).layers[0].router._forward_hooks


class _CharTokenizer:
    """One id per character (3 + code point mod 100), a leading BOS: enough for the tiny models."""

    pad_token_id = 0

    def __call__(self, texts: list[str]) -> dict[str, list[list[int]]]:
        return {"input_ids": [[1] + [3 + ord(c) % 100 for c in text] for text in texts]}


def test_text_and_jsonl_files_are_batched_to_the_budget(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("hello world\n\nsecond line here\n" + "x" * 50 + "\n")
    rows = ['{"text": "abc"}', '{"prompt": "12+3=", "answer": "15"}', "", '{"text": "defgh"}']
    (tmp_path / "b.jsonl").write_text("\n".join(rows) + "\n")
    tok = _CharTokenizer()
    text = list(calibration_batches(tmp_path / "a.txt", tok, n_tokens=1000, batch_size=2, seq_len=16))
    assert sum(int(b["attention_mask"].sum()) for b in text) == 12 + 17 + 51  # BOS + characters
    assert max(b["input_ids"].shape[1] for b in text) == 16  # the 51-token line became windows
    jsonl = list(calibration_batches(tmp_path / "b.jsonl", tok, n_tokens=9, batch_size=8, seq_len=16))
    (batch,) = jsonl
    assert batch["attention_mask"].sum(1).tolist() == [4, 5]  # "abc", then "12+3=15" cut to the budget
    assert batch["input_ids"][1, :5].tolist() == [1, *(3 + ord(c) % 100 for c in "12+3")]
    assert batch["input_ids"][0, 4:].eq(0).all(), "right padding with the pad id"


def test_task_suite_source_feeds_prompt_and_answer() -> None:
    from moescope.models.tasks import TASK_FAMILIES, make_examples
    from moescope.models.toy.tokenizer import build_tokenizer

    tok = build_tokenizer()
    batches = list(calibration_batches("tasks", tok, n_tokens=400, batch_size=8, seq_len=64, seed=3))
    assert sum(int(b["attention_mask"].sum()) for b in batches) == 400
    first = batches[0]["input_ids"][0, : int(batches[0]["attention_mask"][0].sum())]
    example = make_examples(TASK_FAMILIES[0], 1, seed=3)[0]
    assert tok.decode(first, skip_special_tokens=True) == example.prompt + example.answer
    stats = collect_routing(_model("qwen3_moe"), "tasks", tokenizer=tok, n_tokens=200, progress=False)
    assert stats.n_tokens == 200 and stats.source == "task suite (seed 0)"


def test_generate_is_observed_with_left_padding() -> None:
    """Hooks fire on every decode step; the left-padded prompt positions are not counted."""
    model = _model("olmoe")
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    with torch.no_grad(), observe_routing(model) as observer:
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False
        )
    stats = observer.stats()
    assert stats.n_tokens == 10 + 2 * 2  # prompt tokens, then the 2 decode steps that run a forward
    np.testing.assert_array_equal(stats.counts.sum(axis=1), stats.top_k * stats.n_tokens)


def test_calibration_data_stands_in_random_ids_for_the_task_suite_only_without_a_tokenizer(
    tmp_path,
) -> None:
    model = _model("mixtral")
    ids = calibration_data(model, None, n_tokens=200, seed=4)
    assert ids.dtype == torch.long and ids.shape == (4, 64), "rows of 64, rounded up to cover the budget"
    assert int(ids.min()) >= 3 and int(ids.max()) < model.config.vocab_size, "no special ids, all in vocab"
    assert torch.equal(ids, calibration_data(model, None, "tasks", n_tokens=200, seed=4))
    assert not torch.equal(ids, calibration_data(model, None, n_tokens=200, seed=5))
    assert calibration_data(model, None, seed=0).shape == (64, 64), "the default: 64 rows of 64"
    tensor = torch.arange(3, 13).view(2, 5)
    tok = _CharTokenizer()
    assert calibration_data(model, tok) == "tasks", "with a tokenizer the task suite itself"
    assert calibration_data(model, None, tensor) is tensor
    text = tmp_path / "a.txt"
    text.write_text("some calibration text\n")
    assert calibration_data(model, None, text) is text
    assert calibration_data(model, None, str(text)) == str(text)
    with pytest.raises(MoescopeError, match="needs a tokenizer"):  # a user's file is never replaced
        collect_routing(model, calibration_data(model, None, str(text)), n_tokens=10, progress=False)
    stats = collect_routing(model, ids, n_tokens=200, progress=False)
    assert stats.n_tokens == 200


def test_layer_frame_has_one_row_per_moe_layer() -> None:
    stats = collect_routing(
        _model("deepseek_v3"), torch.randint(3, 128, (3, 20)), n_tokens=60, progress=False
    )
    frame = stats.layer_frame()
    assert frame.index.name == "layer" and frame.index.tolist() == list(stats.layers)
    np.testing.assert_array_equal(frame["dead_experts"], stats.dead_experts)
    np.testing.assert_allclose(frame["load_cv"], stats.load_cv)
    np.testing.assert_allclose(frame["max_load_share"], stats.load_share.max(axis=1))
    np.testing.assert_allclose(frame["mean_entropy"], stats.mean_entropy)
    np.testing.assert_allclose(frame["max_logit"], stats.max_logit)
    assert (frame["max_load_share"] >= 1 / stats.num_experts).all()
