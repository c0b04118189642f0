"""Replay building blocks that need no model: advantages, config, faults, rewards, schedule."""

from __future__ import annotations

import pytest
import torch

from moescope.errors import MoescopeError
from moescope.models.tasks import Example
from moescope.replay.advantages import advantages, group_entropy, grpo_advantages
from moescope.replay.config import ReplayConfig
from moescope.replay.data import prompt_schedule
from moescope.replay.faults import KINDS, FaultPlan, parse_fault
from moescope.replay.losses import k3_kl, ppo_clip
from moescope.replay.rewards import numeric, regex, reward_function, score_all

EASY = [1.0] * 7 + [0.0]  # p = 7/8
HARD = [1.0] + [0.0] * 7  # p = 1/8
MIDDLE = [1.0] * 4 + [0.0] * 4


def test_grpo_normalises_each_group_and_zeroes_constant_groups():
    r = torch.tensor([MIDDLE, [1.0] * 8, [0.0] * 8])
    a = grpo_advantages(r)
    assert torch.allclose(a[0].mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(a[0].std(), torch.tensor(1.0), atol=1e-4)
    assert torch.equal(a[1:], torch.zeros(2, 8))


def test_gepo_off_is_exactly_grpo():
    r = torch.tensor([EASY, HARD, MIDDLE, [0.2, 0.9, 0.4, 0.4, 0.0, 1.0, 0.3, 0.7]])
    assert torch.equal(advantages(r, gepo=False), grpo_advantages(r))


def test_gepo_shrinks_credit_in_easy_groups_and_penalties_in_hard_groups():
    r = torch.tensor([EASY, HARD, MIDDLE])
    plain, gepo = grpo_advantages(r), advantages(r, gepo=True, threshold=0.6)
    h = float(group_entropy(torch.tensor(7 / 8)))
    assert 0 < h < 1
    # easy group: positive advantages scaled by the group entropy, the rare failure untouched
    assert torch.allclose(gepo[0, :7], plain[0, :7] * h)
    assert gepo[0, 7] == plain[0, 7] < 0
    # hard group: penalties scaled, the rare success untouched
    assert torch.allclose(gepo[1, 1:], plain[1, 1:] * h)
    assert gepo[1, 0] == plain[1, 0] > 0
    # a 50/50 group is neither easy nor hard
    assert torch.equal(gepo[2], plain[2])
    # the group's net push now leans toward its rare outcome
    assert gepo[0].sum() < 0 < gepo[1].sum()


def test_group_of_one_is_refused():
    with pytest.raises(MoescopeError, match="group_size"):
        ReplayConfig(group_size=1)
    with pytest.raises(MoescopeError, match="G >= 2"):
        grpo_advantages(torch.tensor([[1.0]]))


def test_ppo_clip_and_k3():
    logp = torch.log(torch.tensor([1.5, 0.5, 1.0]))
    old = torch.zeros(3)
    adv = torch.tensor([1.0, -1.0, 1.0])
    loss, clipped = ppo_clip(logp, old, adv, 0.2, 0.28)
    assert torch.allclose(loss, torch.tensor([-1.28, 0.8, -1.0]))
    assert clipped.tolist() == [1.0, 1.0, 0.0]
    assert torch.equal(k3_kl(logp, logp), torch.zeros(3))
    assert (k3_kl(logp, old)[:2] > 0).all()


def test_config_round_trips_and_rejects_bad_values():
    c = ReplayConfig(steps=3, faults=("lr_spike@1",), tasks=("add2",))
    assert ReplayConfig.from_dict(c.to_dict()) == c
    assert c.digest() == ReplayConfig.from_dict(c.to_dict()).digest() != ReplayConfig().digest()
    for bad in ({"precision": "fp8"}, {"steps": 0}, {"minibatches": 0}, {"algo": "ppo"}, {"top_p": 0}):
        with pytest.raises(MoescopeError):
            ReplayConfig(**bad)
    with pytest.raises(MoescopeError, match="Unknown replay config field"):
        ReplayConfig.from_dict({"stepz": 3})
    with pytest.raises(MoescopeError, match="wrong type"):
        ReplayConfig.from_dict({"steps": "ten"})
    # a notebook or papermill parameter gives the faults as one comma-separated string
    several = ReplayConfig(steps=8, faults=" no_grad_clip@3, lr_spike@6:10 ,")
    assert several.faults == ("no_grad_clip@3", "lr_spike@6:10")
    assert ReplayConfig.from_dict({"steps": 8, "faults": "no_grad_clip@3,lr_spike@6:10"}) == several
    assert ReplayConfig(faults="").faults == ()
    with pytest.raises(MoescopeError, match="Unknown fault 'explode'"):
        ReplayConfig(faults="lr_spike@1, explode")


def test_fault_syntax():
    f = parse_fault("nan_op@3:model.layers.0.mlp")
    assert (f.name, f.step, f.arg) == ("nan_op", 3, "model.layers.0.mlp")
    assert parse_fault("lr_spike").step == 5 and parse_fault("lr_spike").arg == 1000.0
    assert parse_fault("no_grad_clip").step == 0 and parse_fault("no_grad_clip").active(7)
    assert parse_fault("lr_spike@2").active(2) and not parse_fault("lr_spike@2").active(3)
    for text, pattern in (
        ("explode", "Unknown fault 'explode'"),
        ("lr_spike@x", "not an integer"),
        ("lr_spike@1:big", "not a number"),
        ("no_grad_clip:3", "takes no argument"),
        ("router_precision:fp64", "bf16 or fp16"),
        ("routing_mismatch:int4", "fp8, bf16 or fp16"),
    ):
        with pytest.raises(MoescopeError, match=pattern):
            parse_fault(text)
    with pytest.raises(MoescopeError, match="precision fp16"):
        FaultPlan(["fp16_overflow@1"], precision="fp32", steps=5)
    with pytest.raises(MoescopeError, match="after the run's last step"):
        FaultPlan(["lr_spike@9"], precision="fp32", steps=5)
    assert set(KINDS) >= {
        "lr_spike", "fp16_overflow", "nan_op", "router_precision", "update_omission",
        "rollout_logprob_precision", "reward_scale", "no_grad_clip", "aux_loss_off", "entropy_control_off",
        "routing_mismatch",
    }  # fmt: skip
    assert parse_fault("routing_mismatch").arg == "fp8" and parse_fault("routing_mismatch").step == 0


def test_rewards():
    ex = Example("x", "q=", "42")
    assert numeric(ex, " 42.0 and more") == 1.0 and numeric(ex, "41") == 0.0 and numeric(ex, "none") == 0.0
    assert (
        regex(Example("x", "q=", r"4\d"), " 47 ") == 1.0 and regex(Example("x", "q=", r"4\d"), "470") == 0.0
    )
    assert reward_function("exact")(ex, "42") == 1.0

    def broken(example, completion):
        raise ValueError("boom")

    with pytest.raises(MoescopeError, match="Reward function broken raised ValueError"):
        score_all(broken, [ex], ["42"])
    with pytest.raises(MoescopeError, match="Unknown reward"):
        reward_function("fuzzy")


def test_schedule_is_fixed_by_the_config(tmp_path):
    a = prompt_schedule(ReplayConfig(steps=3, prompts_per_step=4))
    assert a == prompt_schedule(ReplayConfig(steps=3, prompts_per_step=4))
    assert [len(s) for s in a] == [4, 4, 4]
    assert a[0] != prompt_schedule(ReplayConfig(steps=3, prompts_per_step=4, seed=1))[0]
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    s = prompt_schedule(ReplayConfig(steps=3, prompts_per_step=2, prompts=str(f)))
    assert sorted(e.answer for e in s[0]) == ["2", "4"] and sum(len(x) for x in s) == 6
    f.write_text('{"prompt": "1+1="}\n')
    with pytest.raises(MoescopeError, match=r"p\.jsonl:1 has no 'answer'"):
        prompt_schedule(ReplayConfig(steps=1, prompts_per_step=1, prompts=str(f)))
