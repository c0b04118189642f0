"""Pasted excerpts: a few records whose own fields settle a finding, read as a user pastes them.

Each rule has a positive control (the decisive records) and a negative one (the same shape,
healthy); healthy excerpts of every pasted format raise nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import read_log


def findings_of(tmp_path: Path, text: str, name: str = "paste.log") -> dict:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return {f.type: f for f in diagnose(read_log(path))}


TRL_DEAD = (
    "{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 1e-06, 'reward': 0.0, 'reward_std': 0.0, "
    "'frac_reward_zero_std': 1.0, 'completions/mean_length': 312.5, 'epoch': 0.01}\n"
)
TRL_HEALTHY = (
    "{'loss': 0.0123, 'grad_norm': 0.41, 'learning_rate': 1e-06, 'reward': 0.44, 'reward_std': 0.31, "
    "'frac_reward_zero_std': 0.25, 'completions/mean_length': 312.5, 'completions/clipped_ratio': 0.05, "
    "'epoch': 0.01}\n"
)


def test_one_record_with_no_reward_variance_is_no_signal(tmp_path: Path) -> None:
    found = findings_of(tmp_path, TRL_DEAD)  # every response scored 0, the gradient norm 0: decisive
    assert found["no_signal"].step == 0 and found["no_signal"].severity == "error"
    assert "zero_grad" not in found  # the zero gradient is explained by the dead groups
    equal = TRL_DEAD.replace("'grad_norm': 0.0", "'grad_norm': 0.3").replace("'reward': 0.0", "'reward': 0.6")
    assert findings_of(tmp_path, equal)["no_signal"].severity == "warning"  # equal rewards that paid
    assert "no_signal" not in findings_of(tmp_path, TRL_HEALTHY)


def test_one_record_with_every_completion_truncated_is_degenerate(tmp_path: Path) -> None:
    cut = TRL_HEALTHY.replace("'completions/clipped_ratio': 0.05", "'completions/clipped_ratio': 1.0")
    found = findings_of(tmp_path, cut)
    assert (
        found["degenerate_output"].severity == "error"
        and "every one of the 1 record" in found["degenerate_output"].message
    )
    half = TRL_HEALTHY.replace("'completions/clipped_ratio': 0.05", "'completions/clipped_ratio': 0.5")
    assert "degenerate_output" not in findings_of(tmp_path, half)


def test_loss_and_gradient_exactly_zero_without_reward_statistics_is_zero_grad(tmp_path: Path) -> None:
    text = "{'loss': 0.0, 'grad_norm': 0.0, 'learning_rate': 1e-06, 'epoch': 0.02}\n"
    found = findings_of(tmp_path, text)
    assert found["zero_grad"].step == 0 and not found["zero_grad"].evidence["rewards_logged"]
    moving = (
        "{'loss': 0.0, 'grad_norm': 0.37, 'learning_rate': 1e-06, 'epoch': 0.02}\n"  # GRPO loss ~0 is normal
    )
    assert "zero_grad" not in findings_of(tmp_path, moving)


def test_a_vanished_megatron_loss_in_two_lines_is_a_suspected_non_finite(tmp_path: Path) -> None:
    line = (
        " [2025-03-01 10:00:{s:02d}] iteration {i:8d}/    1000 | consumed samples: {c} | learning rate: "
        "1.000000E-06 | global batch size:    64 | {loss}loss scale: 1.0 | grad norm: 0.812 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |\n"
    )
    text = line.format(s=1, i=10, c=640, loss="lm loss: 1.234000E+00 | ") + line.format(
        s=2, i=11, c=704, loss=""
    )
    nf = findings_of(tmp_path, text)["nonfinite"]
    assert nf.step == 11 and nf.evidence["suspected"] and nf.severity == "warning"
    healthy = line.format(s=1, i=10, c=640, loss="lm loss: 1.234000E+00 | ") + line.format(
        s=2, i=11, c=704, loss="lm loss: 1.229000E+00 | "
    )
    assert "nonfinite" not in findings_of(tmp_path, healthy)


def test_a_vanished_loss_is_judged_only_against_records_of_the_same_kind(tmp_path: Path) -> None:
    text = (
        "step:1 - actor/pg_loss:0.01 - actor/grad_norm:0.4 - actor/entropy:0.6 - critic/score/mean:0.3\n"
        "step:2 - val-core/acc:0.41\n"  # a validation line: no training metric to compare
        "step:2 - actor/pg_loss:0.02 - actor/grad_norm:0.38 - actor/entropy:0.59 - critic/score/mean:0.31\n"
        "step:3 - val-core/acc:0.44\n"
    )
    assert "nonfinite" not in findings_of(tmp_path, text)


@pytest.mark.parametrize(
    ("framework_line", "fires"),
    [
        # Megatron logs its load-balancing loss divided by the coefficient: 1 when balanced
        ("load_balancing_loss: 2.801638E+00 | ", True),
        ("load_balancing_loss: 1.031000E+00 | ", False),
    ],
)
def test_megatron_load_balancing_loss_against_its_balanced_value(
    tmp_path: Path, framework_line: str, fires: bool
) -> None:
    text = "".join(
        f" iteration {i:8d}/    1000 | learning rate: 1.000000E-06 | lm loss: 1.2E+00 | "
        f"{framework_line}grad norm: 0.5 | number of skipped iterations:   0 |\n"
        for i in (20, 21)
    )
    found = findings_of(tmp_path, text)
    assert ("load_collapse" in found) is fires
    if fires:
        assert found["load_collapse"].step == 20 and found["load_collapse"].evidence["balanced"] == 1.0


def test_megatron_named_load_balancing_loss_in_ms_swift_lines(tmp_path: Path) -> None:
    line = (
        '{{"loss": 0.01, "grad_norm": 0.4, "load_balancing_loss": {v}, "global_step/max_steps": "{i}/100"}}\n'
    )
    found = findings_of(tmp_path, line.format(v=3.1, i=5) + line.format(v=3.2, i=6), "logging.jsonl")
    assert (
        found["load_collapse"].evidence["key"] == "load_balancing_loss" and found["load_collapse"].step == 5
    )
    calm = line.format(v=1.02, i=5) + line.format(v=1.05, i=6)
    assert "load_collapse" not in findings_of(tmp_path, calm, "logging.jsonl")


def test_megatron_per_layer_load_balancing_loss_names_the_layer(tmp_path: Path) -> None:
    from moescope.traces import Trace

    steps = [
        {"step": s, "moe/load_balancing_loss_layer_0": 1.01, "moe/load_balancing_loss_layer_7": 2.9}
        for s in (100, 101)
    ]
    found = [
        f for f in diagnose(Trace(header={"framework": "megatron"}, steps=steps)) if f.type == "load_collapse"
    ]
    assert [(f.layer, f.step) for f in found] == [(7, 100)]


def test_transformers_aux_loss_level_is_not_judged(tmp_path: Path) -> None:
    # transformers' router aux loss is top-k when balanced, which a log does not say
    text = "{'loss': 0.01, 'grad_norm': 0.4, 'aux_loss': 7.9, 'reward': 0.4, 'reward_std': 0.3}\n" * 2
    assert "load_collapse" not in findings_of(tmp_path, text)


def test_an_absurd_gradient_norm_needs_no_history(tmp_path: Path) -> None:
    text = (
        "step 1/100 | loss 0.51 | grad_norm 1e9 | lr 1e-7\nstep 2/100 | loss 0.50 | grad_norm 3e8 | lr 1e-7\n"
    )
    spike = findings_of(tmp_path, text)["grad_spike"]
    assert spike.step == 1 and spike.evidence["value"] == 1e9
    calm = text.replace("1e9", "0.9").replace("3e8", "0.8")
    assert "grad_spike" not in findings_of(tmp_path, calm)


def test_a_norm_ten_times_every_earlier_one_is_a_spike_over_a_spread_history(tmp_path: Path) -> None:
    """Selected records with ``...`` between them: the history already steps up (0.3 → 1.2), which
    widens its spread, yet a norm ten times above every earlier one is a spike."""
    norms = (0.31, 0.29, "...", 1.2, 1.1, 15.8, 6.0, 19.5)
    text = "".join(
        "...\n" if g == "..." else f"{{'loss': 0.6, 'grad_norm': {g}, 'epoch': 0.2}}\n" for g in norms
    )
    spike = findings_of(tmp_path, text)["grad_spike"]
    assert spike.step == 4 and spike.evidence["value"] == 15.8
    calm = text.replace("15.8", "4.8").replace("19.5", "5.5")  # four times the top: noise
    assert "grad_spike" not in findings_of(tmp_path, calm)


def test_a_framework_warning_is_the_evidence_of_its_finding(tmp_path: Path) -> None:
    text = (
        " iteration       10/    1000 | learning rate: 1.0E-06 | lm loss: 1.2E+00 | grad norm: 0.8 |\n"
        "ERROR found NaN in local grad norm for bucket #0 in backward pass before data-parallel\n"
        " iteration       11/    1000 | learning rate: 1.0E-06 | lm loss: 1.2E+00 | grad norm: 0.7 |\n"
    )
    nf = findings_of(tmp_path, text)["nonfinite"]
    assert nf.step == 11 and "found NaN in local grad norm" in nf.message
    assert nf.evidence["alerts"][0].startswith("ERROR found NaN")


def test_a_preference_trainers_kl_is_not_the_per_token_kl(tmp_path: Path) -> None:
    """TRL's KTO logs as ``kl`` its loss's reference point, a KL estimate of summed log-probabilities
    (trl#1447's records: 0, 0, 0.15, 0.44, 1.23): it grows by nats on a healthy run and is kept
    under its own name; GRPO's ``kl`` is the per-token KL to the reference, judged as ever."""
    kto = "".join(
        f"{{'loss': {0.5 - 0.01 * i:.4f}, 'grad_norm': 3.1, 'learning_rate': 5e-07, "
        f"'rewards/chosen': {0.02 * i}, 'rewards/rejected': {-0.03 * i}, 'kl': {kl}, "
        "'logps/chosen': -81.2, 'logps/rejected': -95.4, "
        f"'epoch': {0.01 * i:.2f}}}\n"
        for i, kl in enumerate((0.0, 0.0, 0.6, 2.1, 5.8, 12.4))
    )
    assert findings_of(tmp_path, kto) == {}
    assert "kl" in read_log(tmp_path / "paste.log").steps[-1]
    grpo = kto.replace("'rewards/chosen'", "'reward'").replace(
        "'logps/chosen': -81.2, 'logps/rejected': -95.4, ", ""
    )
    grpo = grpo.replace("'rewards/rejected'", "'reward_std'")
    assert findings_of(tmp_path, grpo)["kl_blowup"].severity == "error"


HEALTHY_EXCERPTS = {
    "trl.log": TRL_HEALTHY * 2,
    "prime.log": (
        "Step 7 | Time: 3.21s | Loss: 0.0123 | Entropy: 0.53 | Mismatch KL: 0.0012 | Grad. Norm: 0.41 "
        "| LR: 1.00e-06 | Max Vio: 0.42\n"
        "Step 7 | Time: 30.2s | Reward: 0.4123 | Seq. Length: 512.3 tokens/sample | Async Level: 1\n"
    ),
    "nemo.log": (
        "========================= Step 3/100 =========================\n"
        "  • Loss: 0.0123\n  • Generation KL Error: 0.0011\n  • Avg Reward: 0.4531\n"
        "  • Mean Generation Length: 1597.9\n"
    ),
    "snapshot.txt": (
        "actor/entropy:0.61\nactor/grad_norm:0.31\nactor/pg_clipfrac:0.002\ncritic/score/mean:0.42\n"
    ),
    "slime.log": (
        "step 3: {'train/loss': 0.012, 'train/grad_norm': 0.45, 'train/entropy_loss': 0.6}\n"
        "rollout 3: {'rollout/raw_reward': 0.5}\n"
    ),
}


@pytest.mark.parametrize("name", sorted(HEALTHY_EXCERPTS))
def test_healthy_excerpts_raise_nothing(tmp_path: Path, name: str) -> None:
    assert findings_of(tmp_path, HEALTHY_EXCERPTS[name], name) == {}
