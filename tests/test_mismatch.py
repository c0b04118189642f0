"""``rollout_mismatch``: level, rise and onset of every framework's mismatch metric, on read logs,
synthetic traces and real toy replays, each with its negative control."""

from __future__ import annotations

from pathlib import Path

import pytest

import moescope
from moescope import schema as S
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import read_log
from moescope.replay import ReplayConfig
from moescope.traces import Trace

BASE = {"steps": 12, "prompts_per_step": 4, "group_size": 8, "tasks": ("add2", "add3")}


def mismatch(steps: list[dict], header: dict | None = None):
    found = [f for f in diagnose(Trace(header=header or {}, steps=steps)) if f.type == "rollout_mismatch"]
    assert len(found) <= 1
    return found[0] if found else None


def rows(key: str, values: list[float]) -> list[dict]:
    return [{"step": i, key: v, S.GRAD_NORM: 0.5} for i, v in enumerate(values)]


def test_a_k3_kl_held_above_the_moe_band_is_a_warning_and_far_above_an_error() -> None:
    found = mismatch(rows(S.MISMATCH_KL, [0.02, 0.15, 0.16, 0.12, 0.14]))
    assert found.step == 1 and found.severity == "warning" and found.evidence["rule"] == "level"
    assert mismatch(rows(S.MISMATCH_KL, [0.02, 1.3])).severity == "error"  # far above: one record says it
    assert mismatch(rows(S.MISMATCH_KL, [0.02, 0.03, 0.05, 0.04])) is None  # inside the MoE band
    # one batch of hard tokens (a damaged proxy under a bf16 rollout measured 0.18 once): not a level
    assert mismatch(rows(S.MISMATCH_KL, [1e-3, 2e-3, 0.18, 6e-4, 5e-4, 1e-3])) is None
    assert mismatch(rows(S.MISMATCH_KL, [0.31])).severity == "warning"  # a pasted record: all it has


def test_a_rising_mismatch_is_a_warning_even_at_a_low_level() -> None:
    climbing = [0.011] * 6 + [0.036] * 6  # vime#64: 0.011 with one engine, 0.036 with another
    found = mismatch(rows(S.LOGPROB_MISMATCH, climbing))
    assert found.step == 6 and found.evidence["rule"] == "rise"
    flat = [0.011, 0.012, 0.010, 0.011, 0.013, 0.011, 0.012, 0.010, 0.011, 0.012, 0.011, 0.012]
    assert mismatch(rows(S.LOGPROB_MISMATCH, flat)) is None


def test_a_k3_rise_counts_only_above_the_dense_band() -> None:
    tiny = [1e-6] * 6 + [5e-6] * 6  # five times, but noise far below anything that matters
    assert mismatch(rows(S.MISMATCH_KL, tiny)) is None
    grown = [1e-3] * 6 + [5e-3] * 6
    assert mismatch(rows(S.MISMATCH_KL, grown)).step == 6


def test_nemo_rl_token_mult_prob_error_against_its_recipe_bound(tmp_path: Path) -> None:
    found = mismatch(rows(S.MULT_PROB_ERROR, [1.01, 1.08, 1.09, 1.07]))
    assert found.step == 1 and found.severity == "warning"
    assert mismatch(rows(S.MULT_PROB_ERROR, [1.01, 6.55e9])).severity == "error"  # NeMo-RL#1801
    assert mismatch(rows(S.MULT_PROB_ERROR, [1.01, 1.02, 1.03])) is None


def test_read_logs_of_three_frameworks(tmp_path: Path) -> None:
    prime = tmp_path / "prime.log"
    prime.write_text(
        "".join(
            f"Step {i} | Loss: 0.01 | Mismatch KL: {k} | Grad. Norm: 0.4\n" for i, k in enumerate([0.2, 0.3])
        )
    )
    assert {f.type for f in diagnose(read_log(prime))} == {"rollout_mismatch"}
    nemo = tmp_path / "nemo.log"
    nemo.write_text(
        "===== Step 1/9 =====\n  • Loss: 0.01\n  • Generation KL Error: 0.0009\n"
        "===== Step 2/9 =====\n  • Loss: 0.01\n  • Generation KL Error: 0.0011\n"
    )
    assert diagnose(read_log(nemo)) == []
    verl = tmp_path / "verl.log"
    verl.write_text("step:1 - actor/grad_norm:0.4 - rollout_corr/k3_kl:0.31\n")
    assert [f.type for f in diagnose(read_log(verl))] == ["rollout_mismatch"]


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    root = tmp_path_factory.mktemp("mismatch")
    runs = {
        "bf16_rollout": {"rollout_precision": "bf16"},  # a configured mismatch from the start: healthy
        "rollout_logprob_precision": {"faults": ("rollout_logprob_precision@6",)},
        "router_precision": {"faults": ("router_precision@6",)},
        "from_the_start": {"faults": ("rollout_logprob_precision@0",)},
    }
    return {
        name: moescope.replay("toy", ReplayConfig(**{**BASE, **kw}), out=root / f"{name}.jsonl")
        for name, kw in runs.items()
    }


@pytest.mark.parametrize("fault", ["rollout_logprob_precision", "router_precision"])
def test_a_replay_with_a_precision_fault_raises_it_at_the_fault(replays, fault: str) -> None:
    found = mismatch(replays[fault].steps, replays[fault].header)
    assert found.step == 6 and found.evidence["rule"] == "onset"
    assert mismatch(replays[fault].steps).step == 6  # absent, then positive: the same without the header


def test_a_replay_whose_engines_should_agree_raises_it_from_the_first_step(replays) -> None:
    found = mismatch(replays["from_the_start"].steps, replays["from_the_start"].header)
    assert found.step == 0 and found.evidence["rule"] == "onset"
    assert (
        mismatch(replays["from_the_start"].steps) is None
    )  # without the header: a real log's small mismatch


def test_a_replay_with_a_configured_low_precision_rollout_raises_nothing(replays) -> None:
    trace = replays["bf16_rollout"]
    assert all(S.MISMATCH_KL in step for step in trace.steps)  # logged from the start
    for step in trace.steps:  # the importance ratio training / rollout: near 1, some spread
        assert abs(step[S.IS_RATIO_MEAN] - 1) < 0.05 and 0 < step[S.IS_RATIO_STD] < 0.5
    assert [f for f in diagnose(trace) if f.severity != "info"] == []


@pytest.mark.parametrize("model", ["toy", "toy-v3"])
def test_routing_mismatch_flips_expert_choices_and_opens_a_gap(tmp_path: Path, model: str) -> None:
    """The rollout routes on fp8 router logits: a share of choices flips on every layer, the two
    sides' log-probs part, the PPO ratio sees it, and the diagnosis names it from step 0."""
    short = {**BASE, "steps": 3}
    healthy = moescope.replay(model, ReplayConfig(**short), out=tmp_path / "healthy.jsonl")
    faulted = moescope.replay(
        model, ReplayConfig(**short, faults=("routing_mismatch@0",)), out=tmp_path / "faulted.jsonl"
    )
    for step in faulted.steps:
        assert 0 < step[S.ROUTING_FLIP_FRAC] < 0.5 and all(f > 0 for f in step[S.ROUTING_FLIP_LAYERS])
        assert step[S.LOGPROB_MISMATCH] > 0 and S.ROUTING_FLIP_FRAC not in healthy.steps[0]
    assert abs(faulted.steps[0][S.PPO_KL]) > 2 * abs(
        healthy.steps[0][S.PPO_KL]
    )  # old log-probs: the rollout's
    found = mismatch(faulted.steps, faulted.header)
    assert found.step == 0 and found.evidence["rule"] == "onset"


def test_a_clip_fraction_held_high_is_a_mismatch_where_ratios_are_token_level(tmp_path: Path) -> None:
    found = mismatch(rows(S.CLIPFRAC, [0.01, 0.3, 0.35, 0.28, 0.3]))
    assert found.step == 1 and found.severity == "warning" and found.evidence["key"] == S.CLIPFRAC
    assert "clip range" in found.message
    assert mismatch(rows(S.CLIPFRAC, [0.4])).severity == "warning"  # a pasted record: all it has
    assert mismatch(rows(S.CLIPFRAC, [0.01, 0.9, 0.02, 0.03, 0.01])) is None  # one step: not a level
    assert mismatch(rows(S.CLIPFRAC, [0.02, 0.05, 0.08, 0.04])) is None  # healthy GRPO's band
    gspo = {"replay_config": {"algo": "gspo"}}
    assert mismatch(rows(S.CLIPFRAC, [0.01, 0.3, 0.35, 0.28, 0.3]), gspo) is None  # GSPO: by design


def test_a_gspo_replay_clips_by_design_and_raises_nothing(tmp_path: Path) -> None:
    short = {**BASE, "steps": 4}
    gspo = moescope.replay("toy", ReplayConfig(**{**short, "algo": "gspo"}), out=tmp_path / "gspo.jsonl")
    grpo = moescope.replay("toy", ReplayConfig(**short), out=tmp_path / "grpo.jsonl")
    clipped = max(step[S.CLIPFRAC] for step in gspo.steps)
    assert clipped > 0.2 and clipped > 5 * max(step[S.CLIPFRAC] for step in grpo.steps)  # by design
    assert [f for f in diagnose(gspo) if f.severity != "info"] == []


@pytest.mark.parametrize(
    "config_line",
    [
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",  # verl (hydra override)
        "GRPOConfig(importance_sampling_level='sequence', epsilon=3e-4)",  # TRL
        "--importance_sampling_level sequence --epsilon 3e-4",  # ms-swift
        '{"advantage_estimator": "gspo"}',  # slime's args as JSON
    ],
)
def test_a_log_whose_config_says_gspo_is_not_judged_by_its_clip_fraction(
    tmp_path: Path, config_line: str
) -> None:
    records = "".join(
        f"step:{i} - actor/pg_clipfrac:{c} - actor/grad_norm:0.4\n" for i, c in enumerate([0.3] * 4)
    )
    plain = tmp_path / "grpo.log"
    plain.write_text(records)
    assert [f.evidence["key"] for f in diagnose(read_log(plain))] == [S.CLIPFRAC]
    gspo = tmp_path / "gspo.log"
    gspo.write_text(config_line + "\n" + records)
    trace = read_log(gspo)
    assert trace.header["ratio_level"] == "sequence" and any("line 1 sets sequence" in n for n in trace.notes)
    assert diagnose(trace) == []
