"""Replays on the embedded toy: determinism, every fault's signature, precision, OPEFO, PivotRL, loops."""

from __future__ import annotations

import math

import pytest
import torch

import moescope
from moescope.replay import ReplayConfig
from moescope.replay.trainer import TIMING_KEYS

BASE = {"steps": 5, "prompts_per_step": 4, "group_size": 4, "tasks": ("add2", "add3"), "lr": 1e-4}


def run(tmp_path, name: str = "trace.jsonl", model="toy", **overrides):
    config = ReplayConfig(**{**BASE, **overrides})
    return moescope.replay(model, config, out=tmp_path / name)


def series(trace, key):
    return [s.get(key) for s in trace.steps]


def without_timing(trace):
    return [{k: v for k, v in s.items() if k not in TIMING_KEYS} for s in trace.steps]


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return run(tmp_path_factory.mktemp("healthy"))


def test_trace_header_and_step_records(healthy):
    h = healthy.header
    assert h["replay_config"]["steps"] == 5 and h["config_digest"] == ReplayConfig(**BASE).digest()
    assert h["model_type"] == "qwen3_moe" and h["faults"] == [] and h["loop_times"] == 1
    assert {"torch", "transformers"} <= set(h["versions"])
    assert [s["step"] for s in healthy.steps] == [0, 1, 2, 3, 4]
    step = healthy.steps[1]
    for key in moescope.schema.CANONICAL_METRICS:
        assert key in step, key
    load = step["moe/expert_load"]
    assert len(load) == 4 and all(
        len(row) == 32 and math.isclose(sum(row), 1.0, rel_tol=1e-6) for row in load
    )
    for group in ("attention", "routed_experts", "router", "embeddings"):
        assert step[f"actor/grad_norm/{group}"] >= 0
    margins = step["moe/topk_margin_layers"]  # softmax probabilities: a gap in (0, 1)
    assert len(margins) == 4 and all(0 < m < 1 for m in margins)
    assert math.isclose(step["moe/topk_margin"], sum(margins) / 4)
    te = step["actor/token_entropy"]
    assert sum(te["hist"]) == sum(te["bucket_tokens"]) > 0
    assert any(s["actor/grad_norm"] > 0 for s in healthy.steps)  # mixed rewards give a gradient
    assert all(s["health/nonfinite"] == 0 and s["optim/skipped"] == 0 for s in healthy.steps)


def test_same_seed_same_trace(tmp_path, healthy):
    again = run(tmp_path)
    assert without_timing(again) == without_timing(healthy)
    other = run(tmp_path, "seed1.jsonl", seed=1)
    assert without_timing(other) != without_timing(healthy)


def test_lr_spike_gives_a_grad_norm_spike_then_a_kl_jump(tmp_path, healthy):
    t = run(tmp_path, faults=("lr_spike@2",))
    assert series(t, "optim/lr")[2] == pytest.approx(1000 * BASE["lr"])
    assert without_timing(t)[:2] == without_timing(healthy)[:2]  # nothing before the fault
    calm = max(series(healthy, "actor/grad_norm"))
    assert max(series(t, "actor/grad_norm")[2:]) > 10 * calm
    assert series(t, "actor/kl")[3] > 10 * max(series(healthy, "actor/kl"))


def test_fp16_overflow_skips_steps_and_halves_the_scale(tmp_path):
    t = run(tmp_path, precision="fp16", faults=("fp16_overflow@2",))
    scale, skipped = series(t, "optim/loss_scale"), series(t, "optim/skipped")
    assert skipped[2] >= 1 and t.steps[2]["health/nonfinite"] > 0
    assert scale[2] > scale[1] and scale[3] < scale[2] and scale[4] < scale[3]  # halving after the blow-up


def test_nan_op_is_isolated_and_attributed_to_the_module(tmp_path):
    t = run(tmp_path, faults=("nan_op@2",))
    bad = series(t, "health/nonfinite")
    assert bad[2] > 0 and bad[:2] == [0, 0] and bad[3:] == [0, 0]
    assert t.steps[2]["health/first_nonfinite_module"] == "model.layers.3.mlp.experts"
    assert math.isnan(t.steps[2]["actor/loss"]) and t.steps[2]["optim/skipped"] == 2
    assert all(
        math.isfinite(x) for x in series(t, "actor/loss")[3:]
    )  # the skipped step kept the weights clean
    named = run(tmp_path, "named.jsonl", steps=3, faults=("nan_op@1:model.layers.0.self_attn",))
    assert named.steps[1]["health/first_nonfinite_module"] == "model.layers.0.self_attn"


def test_update_omission_freezes_the_weights(tmp_path):
    toy, tok = moescope.load_model("toy")
    omitted, _ = moescope.load_model("toy")
    moescope.replay(toy, ReplayConfig(**{**BASE, "steps": 2}), out=tmp_path / "a.jsonl", tokenizer=tok)
    t = moescope.replay(
        omitted,
        ReplayConfig(**{**BASE, "faults": ("update_omission@2",)}),
        out=tmp_path / "b.jsonl",
        tokenizer=tok,
    )
    assert series(t, "actor/update_applied")[2:] == [0, 0, 0] and series(t, "actor/update_applied")[0] == 2
    assert any(g > 0 for g in series(t, "actor/grad_norm")[2:])
    for (name, a), b in zip(toy.named_parameters(), omitted.parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("fault", ["router_precision", "rollout_logprob_precision"])
def test_precision_faults_open_a_rollout_training_gap(tmp_path, healthy, fault):
    t = run(tmp_path, steps=3, faults=(f"{fault}@1",))
    for key in ("rollout/logprob_mismatch", "rollout/k3_kl"):
        gap = series(t, key)
        assert gap[0] is None and all(g > 0 for g in gap[1:]), key
        assert key not in healthy.steps[1]


def test_persistent_faults_compose(tmp_path, healthy):
    t = run(
        tmp_path,
        aux_loss_coef=0.01,
        token_entropy_flow_control=True,
        min_entropy_floor=5.0,  # above any entropy of the toy: the control is on until the fault
        faults=("reward_scale@2", "no_grad_clip", "aux_loss_off@2", "entropy_control_off@2"),
    )
    assert t.header["faults"] == [
        "reward_scale@2:100.0",
        "no_grad_clip@0",
        "aux_loss_off@2",
        "entropy_control_off@2",
    ]
    assert all(c == 1.0 for c in series(t, "optim/clip_coef"))
    assert max(series(t, "actor/grad_norm")) > 1.0 > min(series(healthy, "optim/clip_coef"))
    aux = series(t, "moe/aux_loss")
    assert aux[0] > 0 and aux[1] > 0 and aux[2:] == [0.0, 0.0, 0.0]
    assert series(t, "opefo/active")[:2] == [1, 1] and series(t, "opefo/active")[2:] == [0, 0, 0]
    assert series(t, "opefo/entropy_coef")[2:] == [0.0, 0.0, 0.0]
    assert t.steps[3]["faults/active"] == [
        "reward_scale",
        "no_grad_clip",
        "aux_loss_off",
        "entropy_control_off",
    ]


def test_reward_scale_multiplies_rewards_but_not_grpo_advantages(tmp_path, healthy):
    t = run(tmp_path, faults=("reward_scale@2",))
    for step in (2, 3, 4):
        assert t.steps[step]["reward/mean"] == pytest.approx(
            100 * healthy.steps[step]["reward/mean"], rel=1e-9
        )
        assert t.steps[step]["actor/pg_loss"] == pytest.approx(healthy.steps[step]["actor/pg_loss"], abs=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_training(tmp_path, precision):
    t = run(tmp_path, steps=2, precision=precision, rollout_precision="fp32")
    assert all(math.isfinite(x) for x in series(t, "actor/loss"))
    scale = series(t, "optim/loss_scale")[0]
    if precision == "fp16":  # a power of two at most the initial 2**16 (early overflows halve it)
        assert scale <= 2.0**16 and math.log2(scale).is_integer()
    else:
        assert scale == 1.0
    assert all(g > 0 for g in series(t, "rollout/logprob_mismatch"))  # rollout fp32, training low


def test_opefo_keeps_a_collapsing_entropy_near_the_floor(tmp_path):
    # sharpening: copy tasks sampled hot, a large LR and no KL; entropy falls without control
    kw = {"steps": 14, "group_size": 8, "tasks": ("copy",), "temperature": 2.5, "lr": 3e-4, "kl_beta": 0.0}
    floor = 0.5
    off = run(tmp_path, "off.jsonl", **kw)
    on = run(tmp_path, "on.jsonl", token_entropy_flow_control=True, min_entropy_floor=floor, **kw)
    late_off = sum(series(off, "actor/entropy")[-5:]) / 5
    late_on = sum(series(on, "actor/entropy")[-5:]) / 5
    assert late_off < series(off, "actor/entropy")[0]  # the run collapses
    assert abs(late_on - floor) < abs(late_off - floor) and late_on > late_off
    assert max(series(on, "opefo/entropy_coef")) > 0 and "opefo/active" not in off.steps[0]


def test_pivotrl_keeps_only_informative_pivots(tmp_path):
    from moescope.replay import pivot
    from moescope.replay.sums import StepSums

    t = run(tmp_path, steps=2, pivot=True, sample_steps=12, variance_threshold=0.15)
    assert series(t, "pivot/sampled") == [12, 12]
    assert all(0 <= k <= 12 for k in series(t, "pivot/kept"))
    # the filter itself, on the trainer's own pivots
    trainer = _trainer(
        ReplayConfig(**{**BASE, "pivot": True, "sample_steps": 40, "variance_threshold": 0.15})
    )
    sums = StepSums()
    examples = trainer.schedule[0]
    groups = pivot.pivot_groups(trainer.sampler, 0, list(enumerate(examples)), len(examples), sums)
    kept = [g for gs in groups.values() for g in gs]
    answer_tokens = [
        len(trainer.m.tokenizer(ex.answer, add_special_tokens=False)["input_ids"]) for ex in examples
    ]
    assert sums.values["pivot_sampled"] == sum(min(10, n) for n in answer_tokens)  # 40 over 4 prompts, capped
    assert sums.values["pivot_kept"] == len(kept)
    for g in kept:
        assert torch.tensor(g.rewards).var(unbiased=False) >= 0.15
        assert g.example.answer.startswith(g.prefix)
        assert [g.prefix + c for c in g.completions].count(g.example.answer) == sum(g.rewards)


def _trainer(config):
    from moescope.replay.comm import Comm
    from moescope.replay.data import max_new_tokens, prompt_schedule
    from moescope.replay.models import prepare_models
    from moescope.replay.rewards import reward_function
    from moescope.replay.trainer import Trainer

    policy, tok = moescope.load_model("toy")
    schedule = prompt_schedule(config)
    models = prepare_models(policy, None, tok, 1)
    return Trainer(
        models, config, schedule, reward_function("exact"), max_new_tokens(config, schedule), Comm()
    )


def test_gepo_runs_and_differs_from_grpo_only_in_advantages(tmp_path, healthy):
    t = run(tmp_path, algo="gepo")
    assert t.header["replay_config"]["algo"] == "gepo"
    assert series(t, "reward/mean")[:2] == series(healthy, "reward/mean")[:2]  # same data, same samples


@pytest.mark.parametrize(
    "arch", ["mixtral", "deepseek_v3", "gpt_oss", "dbrx", "laguna", "inkling2_loop_text"]
)
def test_other_architectures_replay_with_the_toy_tokenizer(tmp_path, arch):
    from moescope.models.zoo import tiny

    _, tok = moescope.load_model("toy")
    model = tiny(arch, vocab_size=len(tok))
    t = moescope.replay(
        model, ReplayConfig(**{**BASE, "steps": 1, "max_new_tokens": 4}), out=tmp_path / "t", tokenizer=tok
    )
    step = t.steps[0]
    assert (
        step["moe/expert_load"] and math.isfinite(step["actor/loss"]) and step["actor/grad_norm/router"] >= 0
    )
