"""Fixes as replay options. Rollout Routing Replay: training takes the rollout's expert choices, so
a routing mismatch's flips vanish and the log-prob gap shrinks; routers that cannot take a choice
are refused. Importance-sampling correction: the trainer's old log-probs, each token's loss
weighted toward the rollout's samples (truncated, or whole responses masked)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import moescope
from moescope import schema as S
from moescope.errors import MoescopeError
from moescope.models.routers import chosen_weights, route
from moescope.models.view import adapt
from moescope.models.zoo import tiny
from moescope.replay import ReplayConfig
from moescope.replay.losses import gspo_clip, is_weights, ppo_clip
from moescope.replay.router_replay import replayed_routing

BASE = {"steps": 3, "prompts_per_step": 4, "group_size": 8, "tasks": ("add2", "add3")}


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_a_replayed_choice_is_weighted_by_the_live_scores(arch: str) -> None:
    moe = adapt(tiny(arch))
    layer = moe.layers[0]
    logits = torch.randn(6, layer.num_experts, generator=torch.Generator().manual_seed(0))
    weights, index = route(logits, layer.rule, layer.correction_bias)
    torch.testing.assert_close(chosen_weights(logits, layer.rule, index), weights)  # its own choice: the same
    other = index.roll(1, dims=0)  # another token's experts
    assert not torch.allclose(chosen_weights(logits, layer.rule, other), weights)


def test_routers_return_the_recorded_choice_while_replaying() -> None:
    model = tiny("qwen3_moe")
    moe = adapt(model)
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    forced = [torch.zeros(16, moe.top_k, dtype=torch.long) + torch.arange(moe.top_k) for _ in moe.layers]
    seen = []
    handles = [
        layer.router.register_forward_hook(lambda m, a, out: seen.append(out[2])) for layer in moe.layers
    ]
    with torch.no_grad(), replayed_routing(moe, forced):
        model(ids)
    for handle in handles:
        handle.remove()
    assert len(seen) == len(moe.layers) and all(torch.equal(s, f) for s, f in zip(seen, forced, strict=True))
    assert "forward" not in moe.layers[0].router.__dict__  # unwrapped again


def test_routing_replay_removes_the_flips_of_a_routing_mismatch(tmp_path: Path) -> None:
    fault = {**BASE, "faults": ("routing_mismatch@0",)}
    bare = moescope.replay("toy", ReplayConfig(**fault), out=tmp_path / "fault.jsonl")
    fixed = moescope.replay("toy", ReplayConfig(**fault, routing_replay=True), out=tmp_path / "fixed.jsonl")
    for a, b in zip(bare.steps, fixed.steps, strict=True):
        assert a[S.ROUTING_FLIP_FRAC] > 0 and b[S.ROUTING_FLIP_FRAC] == 0
    assert fixed.steps[0][S.LOGPROB_MISMATCH] < bare.steps[0][S.LOGPROB_MISMATCH] / 3
    assert fixed.header["replay_config"]["routing_replay"] is True


def test_routing_replay_on_a_healthy_run_changes_nothing_before_the_first_update(tmp_path: Path) -> None:
    healthy = moescope.replay("toy", ReplayConfig(**{**BASE, "steps": 1}), out=tmp_path / "h.jsonl")
    fixed = moescope.replay(
        "toy", ReplayConfig(**{**BASE, "steps": 1}, routing_replay=True), out=tmp_path / "r.jsonl"
    )
    assert fixed.steps[0][S.REWARD_MEAN] == healthy.steps[0][S.REWARD_MEAN]  # the same samples
    assert fixed.steps[0][S.ENTROPY] == pytest.approx(healthy.steps[0][S.ENTROPY], rel=1e-5)


def test_routers_that_return_no_choice_are_refused(tmp_path: Path) -> None:
    _, tok = moescope.load_model("toy")
    model = tiny("dbrx", vocab_size=len(tok))
    config = ReplayConfig(**{**BASE, "steps": 1}, max_new_tokens=4, routing_replay=True)
    with pytest.raises(MoescopeError, match="routing replay needs routers that return"):
        moescope.replay(model, config, out=tmp_path / "t.jsonl", tokenizer=tok)
    assert not (tmp_path / "t.jsonl").exists()


def test_is_weights_truncate_tokens_or_mask_whole_responses() -> None:
    rollout = torch.zeros(2, 3)
    train = torch.tensor([[0.0, 2.0, -1.0], [0.1, 0.1, 0.1]]).log1p()  # ratios 1, 3, 0 / 1.1 x 3
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weight, cut = is_weights(train, rollout, mask, "token", 2.0)
    torch.testing.assert_close(weight, torch.tensor([[1.0, 2.0, 0.0], [1.1, 1.1, 1.1]]))
    assert cut.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    weight, cut = is_weights(train, rollout, mask, "sequence", 2.0)  # first: geometric mean 0 -> masked
    assert weight.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]] and cut.tolist() == [[1, 1, 1], [0, 0, 0]]


def test_is_correction_takes_the_trainers_old_log_probs_and_records_its_cuts(tmp_path: Path) -> None:
    fault = {**BASE, "faults": ("routing_mismatch@0",)}
    bare = moescope.replay("toy", ReplayConfig(**fault), out=tmp_path / "fault.jsonl")
    fixed = moescope.replay(
        "toy", ReplayConfig(**fault, is_correction="sequence", is_threshold=1.01), out=tmp_path / "is.jsonl"
    )
    assert bare.steps[0][S.CLIPFRAC] > 0 and S.IS_TRUNCATED_FRAC not in bare.steps[0]  # old: the rollout's
    assert 0 < fixed.steps[0][S.IS_TRUNCATED_FRAC] < 1  # a tight bound masks part of the responses
    with pytest.raises(MoescopeError, match="is_threshold must be above 1"):
        ReplayConfig(**BASE, is_correction="token", is_threshold=1.0)
    with pytest.raises(MoescopeError, match="is_correction 'tis' is not one of token, sequence"):
        ReplayConfig(**BASE, is_correction="tis")


def test_gspo_gives_every_token_its_responses_clipped_ratio() -> None:
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.3, -0.3, 0.0], [0.6, 0.6, 0.6]])  # response means 0 and 0.6
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.ones(2, 3)
    loss, clipped = gspo_clip(logp, old, adv, mask, 3e-4, 4e-4)
    assert torch.allclose(loss[0], torch.full((3,), -1.0)) and clipped[0].tolist() == [0.0, 0.0, 0.0]
    assert torch.allclose(loss[1], torch.full((3,), -(1 + 4e-4))) and clipped[1].tolist() == [1.0, 1.0, 1.0]
    token, _ = ppo_clip(logp, old, adv, 0.2, 0.28)
    assert not torch.allclose(token[0], loss[0])  # per token the ratios differ; per response they cancel


def test_gspo_clips_more_tokens_than_grpo_by_design(tmp_path: Path) -> None:
    base = {**BASE, "lr": 1e-4}
    grpo = moescope.replay("toy", ReplayConfig(**base), out=tmp_path / "grpo.jsonl")
    gspo = moescope.replay("toy", ReplayConfig(**base, algo="gspo"), out=tmp_path / "gspo.jsonl")
    assert sum(s[S.CLIPFRAC] for s in gspo.steps) > 2 * sum(s[S.CLIPFRAC] for s in grpo.steps)
    assert gspo.steps[0][S.REWARD_MEAN] == grpo.steps[0][S.REWARD_MEAN]  # the same first samples
    assert gspo.header["replay_config"]["algo"] == "gspo"


@pytest.mark.parametrize("fault", ["router_precision@0", "routing_mismatch@0"])
def test_an_fp32_router_cancels_the_router_rounding_faults(tmp_path: Path, fault: str) -> None:
    config = {**BASE, "steps": 2, "faults": (fault,)}
    bare = moescope.replay("toy", ReplayConfig(**config), out=tmp_path / "bare.jsonl")
    fixed = moescope.replay("toy", ReplayConfig(**config, fp32_router=True), out=tmp_path / "fixed.jsonl")
    assert all(s[S.LOGPROB_MISMATCH] > 0 for s in bare.steps)
    assert all(s[S.LOGPROB_MISMATCH] == 0 for s in fixed.steps)  # both sides route alike again
    assert all(s.get(S.ROUTING_FLIP_FRAC, 0) == 0 for s in fixed.steps)


def test_an_fp32_router_under_bf16_training_routes_in_fp32(tmp_path: Path) -> None:
    config = {**BASE, "steps": 1, "precision": "bf16"}
    plain = moescope.replay("toy", ReplayConfig(**config), out=tmp_path / "bf16.jsonl")
    fixed = moescope.replay("toy", ReplayConfig(**config, fp32_router=True), out=tmp_path / "fp32.jsonl")
    assert fixed.steps[0][S.ROUTER_LOGIT_MAX] != plain.steps[0][S.ROUTER_LOGIT_MAX]  # other logits
    assert fixed.steps[0][S.REWARD_MEAN] == pytest.approx(plain.steps[0][S.REWARD_MEAN], abs=0.2)
