"""Rules for what users paste: a skipped step, printed top-k ids, Megatron's doubled load-balancing
loss under recompute, the load summaries of other engines, and one decisive record."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from moescope import schema as S
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import read_log
from moescope.traces import Trace


def findings_of(tmp_path: Path, text: str, name: str = "paste.log") -> dict:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return {f.type: f for f in diagnose(read_log(path))}


def test_a_skipped_step_is_nonfinite_and_says_so(tmp_path: Path) -> None:
    text = (
        "{'loss': 1.6228, 'grad_norm': 9.3, 'learning_rate': 4.9424e-06, 'epoch': 0.16}\n"
        "{'loss': 1.6573, 'grad_norm': nan, 'learning_rate': 4.9424e-06, 'epoch': 0.16}\n"
    )
    nf = findings_of(tmp_path, text)["nonfinite"]
    assert nf.step == 1 and nf.severity == "error" and nf.evidence["skipped_update"]
    assert "skipped the update" in nf.message
    moved = text.replace("'learning_rate': 4.9424e-06, 'epoch': 0.16}\n", "'learning_rate': 4.9e-06}\n", 1)
    assert not findings_of(tmp_path, moved)["nonfinite"].evidence["skipped_update"]


def test_losses_named_by_their_suffix_are_read_and_judged(tmp_path: Path) -> None:
    """CSDN#6 (a re-id model): no name a key map knows, no step marker, two test lines after it;
    every ``*_loss`` is NaN."""
    text = (
        "Time: 2024-10-31 18:32:24; Epoch: 69; LR, 3e-05; pid_loss: nan;  triplet_loss: nan;  "
        "msel_loss: nan;\nTime: 2024-10-31 18:32:58; Test on Dataset: sysu, \nmINP: 0.0419 \nmAP: 0.036 \n"
    )
    found = findings_of(tmp_path, text)["nonfinite"]
    assert found.severity == "error" and {"pid_loss", "triplet_loss"} <= set(found.evidence["keys"])


_SLIME = (
    "rollout {}: {{'rollout/response_lengths': 4023.29, 'rollout/rewards': 0.0, 'rollout/truncated': "
    "0.164, 'rollout/raw_reward': {}, 'rollout/advantages': 0.0}}\n"
)


@pytest.mark.parametrize(
    ("rewards", "found"),
    [
        ([0.0], True),  # slime#1527: every rollout scores 0 (means only, no spread logged)
        ([0.0, 0.0, 0.0], True),
        ([0.0, 0.0, 0.125, 0.25], False),  # a hard start that learns
        ([0.5, 0.0], False),
    ],
)
def test_a_mean_reward_of_zero_on_every_rollout_is_no_signal(
    tmp_path: Path, rewards: list[float], found: bool
) -> None:
    text = "".join(_SLIME.format(i, r) for i, r in enumerate(rewards))
    no_signal = findings_of(tmp_path, text).get("no_signal")
    assert (no_signal is not None) == found
    if found:
        assert (no_signal.step, no_signal.severity) == (0, "error") and "exactly 0" in no_signal.message


def test_trls_quickstart_table_with_every_completion_clipped_is_no_signal(tmp_path: Path) -> None:
    """TRL's GRPO quickstart at ``max_completion_length=256``, its metrics pasted as a table with
    short names (``clipped_ratio`` is TRL's ``completions/clipped_ratio``): every completion cut
    at the limit and no reward: no signal, and the length limit the likely cause."""
    table = "Step  loss  grad_norm  reward_mean  clipped_ratio  mean_length\n"
    table += "".join(f"{s}     0     0          0            1.0            256\n" for s in (1, 2, 3))
    found = findings_of(tmp_path, table)
    assert found["no_signal"].severity == "error" and found["degenerate_output"].step == 1


def test_a_games_mean_reward_of_zero_is_no_verdict_on_the_reward_function(tmp_path: Path) -> None:
    """ML-Agents prints ``Mean Reward: 0.000`` on records of a healthy run: no language model's
    rollouts logged, no finding."""
    line = "INFO:mlagents.trainers: first-run-0: FindTheTarget: Step: {}. Mean Reward: 0.000. Training.\n"
    assert "no_signal" not in findings_of(tmp_path, "".join(line.format(1000 * i) for i in range(1, 5)))


def test_a_nan_in_reward_statistics_alone_is_a_warning(tmp_path: Path) -> None:
    """ml-agents prints ``Mean Reward: nan`` while no episode has ended (a mean of an empty slice);
    a loss that goes NaN beside it keeps the error."""
    rewards = "".join(
        f"step {i} | Mean Reward {r}\n" for i, r in enumerate(["-82.99", "-48.5", "nan", "nan"])
    )
    found = findings_of(tmp_path, rewards)["nonfinite"]
    assert (found.step, found.severity, found.evidence["rewards_only"]) == (2, "warning", True)
    losses = "".join(f"step {i} | reward {r} | loss {r}\n" for i, r in enumerate(["0.5", "0.4", "nan"]))
    assert findings_of(tmp_path, losses)["nonfinite"].severity == "error"


def test_a_record_of_another_kind_sharing_one_name_with_the_loss_lines_is_no_vanished_loss(
    tmp_path: Path,
) -> None:
    """acme interleaves episode lines and learner lines, both with ``Steps``: an episode line has
    no loss to lose."""
    episode = "[Environment Loop] Episode Length = 764 | Episode Return = -21.0 | Steps = {} | "
    episode += "Steps Per Second = 37.3\n"
    learner = "[Learner] Loss = {} | Steps = {} | Walltime = {}\n"
    text = episode.format(1528) + "".join(learner.format(0.058, 70 + 17 * i, 4.2 + i) for i in range(6))
    assert "nonfinite" not in findings_of(tmp_path, text)


def test_nan_lines_of_plain_text_name_no_metric_family(tmp_path: Path) -> None:
    """The plain-text reader keeps lines that mention NaN: which metric went is not known."""
    text = "35000 35% (1m 4s) nan Nam / Russian\n40000 40% (1m 13s) nan Assaf / Russian\n"
    found = findings_of(tmp_path, text)["nonfinite"]
    assert found.evidence["families"] == ["the log's text"] and "in the log's text" in found.message


def test_one_record_with_a_null_gradient_norm_is_decisive(tmp_path: Path) -> None:
    found = findings_of(tmp_path, "{'loss': 0.0, 'grad_norm': None, 'learning_rate': 1e-06}\n")
    assert found["nonfinite"].step == 0
    assert "nonfinite" not in findings_of(
        tmp_path, "{'loss': 0.0, 'grad_norm': 0.2, 'learning_rate': 1e-06}\n"
    )


@pytest.mark.parametrize(
    ("line", "dead"),
    [
        ("step:5 - critic/score/mean:0.0 - critic/advantages/max:0.0 - critic/advantages/min:0.0", True),
        ("step:5 - critic/score/mean:0.3 - critic/advantages/max:1.2 - critic/advantages/min:-0.9", False),
        ("step:5 - critic/score/mean:0.0 - critic/advantages/max:0.0 - critic/advantages/min:-0.0", True),
    ],
)
def test_one_record_with_every_advantage_zero_is_no_signal(tmp_path: Path, line: str, dead: bool) -> None:
    assert ("no_signal" in findings_of(tmp_path, line + "\n")) is dead


def test_printed_top_k_ids_on_one_expert_are_a_load_collapse(tmp_path: Path) -> None:
    found = [f for f in diagnose(read_log(Path(__file__).parent / "data" / "logs" / "topk_indices.log"))]
    assert [(f.type, f.layer) for f in found] == [("load_collapse", n) for n in (1, 2, 3, 4)]
    spread = "".join(f"layer {n} topk_idx: [[3, 17], [40, 9], [22, 51], [8, 30]]\n" for n in range(4))
    assert findings_of(tmp_path, spread) == {}


LBL = "".join(
    f"iteration {i}: load_balancing_loss: {v}E+00\n" for i, v in ((10, 2.202137), (20, 2.298303), (30, 2.12))
)


def test_megatron_lbl_doubled_under_recompute_is_a_note_not_a_collapse(tmp_path: Path) -> None:
    said = "with --moe-layer-recompute:\n" + LBL
    path = tmp_path / "lbl.log"
    path.write_text(said)
    trace = read_log(path)
    assert diagnose(trace) == [] and any("counts the load-balancing loss twice" in n for n in trace.notes)
    plain = findings_of(tmp_path, LBL)["load_collapse"]  # not said: judged, with the doubling named
    assert "Megatron-LM#1330" in plain.message
    assert "load_collapse" in findings_of(tmp_path, "recompute_granularity: full\n" + LBL.replace("2.", "5."))
    off = findings_of(tmp_path, "recompute_granularity: null\n" + LBL)
    assert "load_collapse" in off


@pytest.mark.parametrize(
    ("key", "bad", "good"),
    [
        (S.DEAD_EXPERT_FRAC, 0.4, 0.0),
        (S.USED_EXPERT_FRAC, 0.5, 1.0),
        (S.MAX_VIOLATION, 6.0, 0.8),
    ],
)
def test_load_summaries_of_other_engines(key: str, bad: float, good: float) -> None:
    def found(value: float) -> list[str]:
        return [f.type for f in diagnose(Trace(header={}, steps=[{"step": 1, key: value}]))]

    assert found(bad) == ["load_collapse"] and found(good) == []


def test_per_layer_load_cv_names_its_layer() -> None:
    steps = [{"step": s, "moe/layer_0/cv": 0.3, "moe/layer_5/cv": 0.3 if s < 6 else 2.5} for s in range(12)]
    found = [f for f in diagnose(Trace(header={}, steps=steps)) if f.type == "load_collapse"]
    assert [(f.layer, f.step) for f in found] == [(5, 6)]


def _ess_log(values: list[float]) -> str:
    return "".join(
        f"step:{i} - rollout_corr/rollout_is_eff_sample_size:{v} - actor/grad_norm:0.3\n"
        for i, v in enumerate(values, start=1)
    )


@pytest.mark.parametrize(
    ("values", "step", "severity"),
    [
        ([0.9, 0.85, 0.8, 0.25, 0.2, 0.22, 0.21], 4, "warning"),  # below verl's 0.3, held
        ([0.9, 0.9, 0.02, 0.9, 0.9], 3, "error"),  # one record left to a handful of samples
        ([0.1, 0.12], 1, "warning"),  # a pasted excerpt, low on every record
    ],
)
def test_a_low_effective_sample_size_is_a_mismatch(
    tmp_path: Path, values: list[float], step: int, severity: str
) -> None:
    found = findings_of(tmp_path, _ess_log(values))["rollout_mismatch"]
    assert (found.step, found.severity, found.evidence["key"]) == (step, severity, S.IS_ESS)
    assert "rollout/is_ess" in found.message


@pytest.mark.parametrize(
    "values",
    [
        [0.95, 0.9, 0.7, 0.6, 0.55, 0.9],  # verl's healthy band
        [0.9, 0.9, 0.25, 0.9, 0.9, 0.9],  # one low batch, not held
        [0.9, 0.2, 0.9, 0.25, 0.9, 0.28, 0.9],  # low now and then, never for 3 records in a row
    ],
)
def test_a_healthy_effective_sample_size_raises_nothing(tmp_path: Path, values: list[float]) -> None:
    assert "rollout_mismatch" not in findings_of(tmp_path, _ess_log(values))


def test_one_record_of_a_large_mismatch_is_decisive(tmp_path: Path) -> None:
    found = findings_of(tmp_path, "step:7 - rollout_corr/k3_kl:1.4 - actor/grad_norm:0.3\n")
    assert found["rollout_mismatch"].step == 7 and found["rollout_mismatch"].severity == "error"
    assert "rollout_mismatch" not in findings_of(tmp_path, "step:7 - rollout_corr/k3_kl:0.0004\n")


def test_a_megatron_line_without_its_loss_is_a_suspected_nonfinite_loss(tmp_path: Path) -> None:
    line = (
        " iteration 9/ 10 | learning rate: 4.2E-07 | global batch size: 12 | loss scale: 1.0 |"
        " number of skipped iterations: 0 | number of nan iterations: 0 |\n"
    )
    nf = findings_of(tmp_path, line)["nonfinite"]
    assert (nf.step, nf.severity, nf.evidence["suspected"]) == (9, "warning", True)
    with_loss = line.replace("loss scale", "lm loss: 3.1E+00 | loss scale")
    assert "nonfinite" not in findings_of(tmp_path, with_loss)


def _loss_lines(losses: list[float]) -> str:
    return "".join(f"step {i} | loss {v} | lr 1e-05\n" for i, v in enumerate(losses))


@pytest.mark.parametrize(
    ("losses", "step"),
    [
        ([15.5, 13.0, 3.8, 2.39, 1.43, 5.82, 7.05, 10.03], 5),  # entrenar#274: back toward 11.93
        ([15.5, 13.0, 3.8, 2.39, 1.43, 2.1, 3.0, 6.0, 5.9], None),  # the climb broke off
        ([15.5, 13.0, 3.8, 2.39, 1.43, 2.5, 4.8], None),  # two rises: too few
        ([15.5, 13.0, 1.2, 3.8, 1.43, 5.82, 7.05, 10.03], None),  # not from the lowest
        ([15.5, 13.0, 3.8, 2.39, 1.43, 2.82, 4.05, 6.03], None),  # under five times the lowest
        ([1.396, 1.192, 1.346, 1.36, 1.444, 1.204, 1.774, 2.155, 2.374], 6),  # a TF2 detector: new highs
        ([1.396, 1.192, 1.346, 1.36, 1.444, 1.204, 1.5, 1.6, 1.7], None),  # under 1.5x the highest before
        ([22.9, 24.7, 26.5, 28.4, 30.2, 32.0, 33.9, 35.8, 37.6, 39.5], 1),  # CoTNet: nine rises in a row
        ([22.9, 24.7, 26.5, 28.4, 30.2, 32.0, 33.9, 35.8, 33.6, 39.5], None),  # the rises broken once
    ],
)
def test_a_loss_that_climbs_from_its_lowest_to_the_end_is_a_divergence(
    tmp_path: Path, losses: list[float], step: int | None
) -> None:
    found = findings_of(tmp_path, _loss_lines(losses)).get("loss_divergence")
    assert (found and (found.step, found.severity)) == (step and (step, "warning"))


def test_a_critics_loss_that_climbs_as_its_values_grow_is_no_divergence(tmp_path: Path) -> None:
    """keras-rl's DDPG: the temporal-difference loss grows with the Q-values while the return improves."""
    line = "step {} | episode_reward {} | loss {} | mean_q {}\n"
    rows = [(-1338.7, 0.804, -31.1), (-647.9, 1.6, -70.3), (-339.9, 3.513, -74.6), (-132.5, 6.544, -59.4)]
    text = "".join(line.format(10000 * (i + 1), *row) for i, row in enumerate(rows))
    assert "loss_divergence" not in findings_of(tmp_path, text)


def test_a_loss_that_jumps_after_a_short_head_and_stays_is_a_divergence(tmp_path: Path) -> None:
    """Too few values before the jump for an early-run level: the jump itself is the evidence."""
    found = findings_of(tmp_path, _loss_lines([1.5, 9.0, 9.5, 9.2, 9.8, 9.1]))["loss_divergence"]
    assert (found.step, found.severity) == (1, "warning") and "jumps" in found.message


def test_a_three_record_paste_whose_last_two_left_the_first_s_level_is_a_divergence(tmp_path: Path) -> None:
    found = findings_of(tmp_path, _loss_lines([0.69, 27.3, 16.9]))["loss_divergence"]
    assert (found.step, found.severity) == (1, "warning")


def test_a_paste_that_ends_on_a_loss_far_above_its_level_is_a_divergence(tmp_path: Path) -> None:
    """Users stop the paste where the loss exploded: one record, but 25x the level before it."""
    found = findings_of(tmp_path, _loss_lines([1.13, 0.92, 2.30, 95.8]))["loss_divergence"]
    assert (found.step, found.severity) == (3, "warning") and "last record" in found.message


def test_one_record_with_a_loss_no_healthy_run_reaches_is_an_error(tmp_path: Path) -> None:
    """A snapshot has no level to rise from: a loss of 1e+19 on it is decisive alone; a large
    loss a healthy regression or Q-function logs (squared errors of unscaled returns) is not."""
    found = findings_of(tmp_path, "step 7 | loss 1.36e+19 | lr 3e-04\n")["loss_divergence"]
    assert (found.step, found.severity) == (7, "error") and "above 1e+12" in found.message
    assert "loss_divergence" not in findings_of(tmp_path, "step 7 | loss 28412.5 | lr 3e-04\n")


def test_a_jump_that_goes_on_past_the_ceiling_is_an_error_where_it_began(tmp_path: Path) -> None:
    """The jump alone rests on a short head (a warning); the loss it leads to, past any healthy
    run's, makes it a divergence, dated at the jump."""
    found = findings_of(tmp_path, _loss_lines([0.85, 2.44, 63118.6, 1.08e13]))["loss_divergence"]
    assert (found.step, found.severity) == (2, "error")
    assert "jumps at step 2" in found.message and "1.08e+13 at step 3" in found.message


@pytest.mark.parametrize(
    "losses",
    [
        [1.5, 1.4, 9.0],  # the last record alone: not yet a level
        [1.2, 1.1, 1.0, 9.0],  # a last record 8x: a spike as likely as a new level
        [2.0, 9.0, 1.9, 1.8, 1.7, 1.7],  # one spike, not a new level
        [0.0, 0.0, 2.1, 2.0, 1.9, 1.9],  # nothing positive before it to measure against
        [2.4, 2.1, 1.9, 1.8, 1.8, 1.7],  # a healthy fall
    ],
)
def test_a_spike_or_a_rise_from_zero_is_no_loss_jump(tmp_path: Path, losses: list[float]) -> None:
    assert "loss_divergence" not in findings_of(tmp_path, _loss_lines(losses))


@pytest.mark.parametrize(
    ("losses", "step"),
    [
        ([-5.5, -5.3, -5.4, -4.7, 40490.2, -3.5, -2.2, -1.7], 4),  # waveglow#38: never back below -4.7
        ([-4.07, -4.49, -4.45, -4.32, 4191.7, -2.41, -2.91], 4),  # a paste two records past the jump
        ([-4.07, -4.49, -4.45, -4.32, 4191.7, -4.41, -4.30, -4.38], None),  # a lone spike, back at its level
        ([-4.07, -4.49, -4.45, -4.32, -2.41, -2.40, -2.38], None),  # a rise from below 0 with no jump
        ([-4.07, -4.49, -4.45, -4.32, 4191.7, -2.41], None),  # one record after it: no level yet
    ],
)
def test_a_loss_below_zero_that_jumps_and_stays_above_its_range_is_a_divergence(
    tmp_path: Path, losses: list[float], step: int | None
) -> None:
    """A flow's negative log-likelihood has no ratio to its level: a jump of many times its size,
    after which the loss never comes back within the range it held, is the run leaving its level."""
    found = findings_of(tmp_path, _loss_lines(losses)).get("loss_divergence")
    assert (found and (found.step, found.severity)) == (step and (step, "warning"))


def test_episode_lengths_at_nan_beside_the_rewards_are_no_error(tmp_path: Path) -> None:
    """Stable Baselines without a Monitor wrapper: ``ep_rewmean`` and ``eplenmean`` are NaN (means
    over no finished episode) while every loss is finite: a warning, not an error."""
    table = "| approxkl | 6.6e-05 |\n| ep_rewmean | nan |\n| eplenmean | nan |\n| policy_loss | 0.0006 |\n"
    found = findings_of(tmp_path, table + "| total_timesteps | 24960 |\n| value_loss | 63.7 |\n")["nonfinite"]
    assert found.severity == "warning" and "episode statistics" in found.message


@pytest.mark.parametrize(
    ("perplexities", "step"),
    [
        ([86.35, 865.3, 949.7], 1),  # attention-is-all-you-need-pytorch#60's validation after a bad commit
        ([12792.6, 3770.8, 2268.1, 2482.6, 16091.5, 20872.7], 4),  # OpenNMT-py#709, the end of the paste
        ([86.35, 865.3], None),  # one record above: no level yet
        ([86.35, 865.3, 91.2], None),  # back down
        ([420.0, 180.3, 95.1, 88.7], None),  # a healthy fall
    ],
)
def test_a_perplexity_held_five_times_above_its_lowest_is_a_divergence(
    tmp_path: Path, perplexities: list[float], step: int | None
) -> None:
    text = "".join(f"epoch {i}, ppl: {v}, accuracy: 30.1\n" for i, v in enumerate(perplexities))
    found = findings_of(tmp_path, text).get("loss_divergence")
    assert (found and (found.step, found.severity)) == (step and (step, "warning"))


@pytest.mark.parametrize(("held", "found"), [(10, True), (9, False)])
def test_a_half_precision_loss_is_pinned_only_on_ten_records(tmp_path: Path, held: int, found: bool) -> None:
    """MiniGPT-4#67: 10.3750 (a bfloat16 number, ln of LLaMA's 32,000 tokens) on every record; a
    learning loss in bfloat16 stays within one step of the grid a record or two, by chance."""
    losses = [10.6250, 10.5625] + ["10.3750"] * held
    line = "Train: data epoch: [0]  [{}/5000]  lr: 0.000029  loss: {}  time: 0.4920\n"
    text = "".join(line.format(50 * i, v) for i, v in enumerate(losses))
    assert ("zero_grad" in findings_of(tmp_path, text)) == found


@pytest.mark.parametrize(
    ("accuracies", "found"),
    [
        (["0.5000"] * 5, True),  # a binary link predictor answering one class on balanced data
        (["0.2500"] * 3 + ["0.1000"] * 5, True),  # a ten-way classifier, at the end
        (["50.00"] * 5, True),  # as a percentage
        (["0.5000"] * 4, False),  # too few records
        (["0.5"] * 5, False),  # a print too coarse to see it move
        (["0.6838"] * 5, False),  # no 1/K
    ],
)
def test_an_accuracy_held_at_one_over_k_is_zero_grad(
    tmp_path: Path, accuracies: list[str], found: bool
) -> None:
    losses = [1.36, 1.34, 1.09, 0.77, 0.73, 1.03, 1.32, 1.39]
    text = "".join(
        f"epoch {i}, train loss: {loss}, train acc: {a}\n"
        for i, (loss, a) in enumerate(zip(losses, accuracies, strict=False))
    )
    assert ("zero_grad" in findings_of(tmp_path, text)) == found


def test_a_preference_runs_reward_accuracy_at_one_half_is_no_one_class_model(tmp_path: Path) -> None:
    """TRL's ``rewards/accuracies`` over a batch of two pairs is 0, 0.5 or 1: 0.5000 five times is chance."""
    record = (
        "{{'loss': 0.6931, 'rewards/chosen': 0.0{0}, 'rewards/rejected': -0.0{0}, "
        "'rewards/accuracies': 0.5000, 'epoch': 0.{0}}}\n"
    )
    assert "zero_grad" not in findings_of(tmp_path, "".join(record.format(i) for i in range(1, 7)))


def test_a_runs_best_loss_so_far_is_no_loss_to_judge(tmp_path: Path) -> None:
    """fairseq's ``best_loss`` holds between improvements by construction (DisCo#1: 5.95385 on every
    validation line, which read as a uniform guess among 385 classes)."""
    line = (
        "| epoch {} | valid on 'valid' subset | loss {} | ppl 300.93 | num_updates {} | best_loss 5.95385\n"
    )
    text = "".join(line.format(152 + i, 9.3 + 0.2 * i, 42491 + 280 * i) for i in range(6))
    assert "zero_grad" not in findings_of(tmp_path, text)


@pytest.mark.parametrize(
    ("scales", "severity"), [((32768, 16384, 8192, 4096), "info"), ((32768, 2**37, 2**36, 2**35), "warning")]
)
def test_overflows_opening_a_run_are_settling_only_while_the_scale_falls(
    scales: tuple, severity: str
) -> None:
    """The scaler halving from its start is a note; a scale raised within the episode (reset, or
    set too high) that overflows again is not the scaler settling."""
    steps = [{"step": i, S.LOSS_SCALE: float(v), S.SKIPPED: 1} for i, v in enumerate(scales)]
    steps += [{"step": i, S.LOSS_SCALE: float(scales[-1]), S.SKIPPED: 0} for i in range(4, 12)]
    (found,) = [f for f in diagnose(Trace(header={}, steps=steps)) if f.type == "overflow"]
    assert found.severity == severity and ("settling" in found.message) == (severity == "info")


@pytest.mark.parametrize(("scale", "found"), [("0.000", True), ("0.25", True), ("1", False), ("4096", False)])
def test_a_loss_scale_below_one_is_an_overflow_where_no_skipped_step_is_logged(
    tmp_path: Path, scale: str, found: bool
) -> None:
    """fairseq's epoch summary shows ``loss_scale 0.000`` without an overflow line before it stops at
    its minimum scale: a dynamic scaler only falls on overflows."""
    text = (
        "| epoch 028 | loss 3.976 | nll_loss 2.204 | ppl 4.61 | num_updates 9165 | lr 0.000330319 | "
        f"gnorm 0.635 | clip 0.000 | oom 0.000 | loss_scale {scale} | wall 4043\n"
    )
    overflow = findings_of(tmp_path, text).get("overflow")
    assert (overflow is not None) == found
    if found:
        assert (overflow.step, overflow.severity) == (9165, "error") and "below 1" in overflow.message


@pytest.mark.parametrize(("low", "severity"), [(2048, "info"), (32, "warning")])
def test_a_short_overflow_episode_is_a_warning_where_it_drove_the_scale_low(
    tmp_path: Path, low: int, severity: str
) -> None:
    """MiniLLM's PPO (microsoft/LMOps#130): two overflows on one iteration, 128 → 64 → 32, mid-run; at 32 the
    gradients overflow fp16 however the scaler started. The same two halvings at 2048 are a note.
    The step is the ``global iter`` counter, not the inner ones before it."""
    line = "train | inner iter:   {0}/  8 | global iter:     {1}/  5000| tot_loss: 3.21 | scale: {2:.2f}\n"
    alert = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {0}, reducing to {1}\n"
    text = line.format(7, 13, low * 4) + line.format(1, 14, low * 4)
    text += alert.format(low * 4, low * 2) + line.format(3, 15, low * 2) + alert.format(low * 2, low)
    found = findings_of(tmp_path, text)["overflow"]
    assert (found.step, found.severity) == (15, severity)


def test_an_overflow_is_dated_where_the_scale_first_fell_below_one(tmp_path: Path) -> None:
    """fairseq's old loop (facebookresearch/fairseq#515): the scale falls to 0.0625 by update 190,
    the largest episode of overflows comes at 486; the fault is there from 190 on."""
    warn = "| WARNING: overflow detected, setting loss scale to: {0}\n"
    line = "| epoch 001:    {0} / 1374 loss=14.35, num_updates={1}, gnorm=3.9, loss_scale={2}, wall=1061\n"
    text = warn.format(0.0625) + line.format(200, 190, 0.062) + line.format(300, 290, 0.062)
    text += (
        warn.format(0.03125) + line.format(400, 389, 0.031) + "".join(warn.format(2.0**-k) for k in (6, 7, 8))
    )
    text += line.format(500, 486, 0.004)
    found = findings_of(tmp_path, text)["overflow"]
    assert (found.step, found.severity) == (190, "error") and "from step 486" in found.message


@pytest.mark.parametrize(("skipped", "severity"), [((15, 16, 17), "error"), ((5, 5, 5), None)])
def test_deepspeeds_count_of_skipped_steps_equal_to_the_step_is_an_overflow(
    tmp_path: Path, skipped: tuple[int, ...], severity: str | None
) -> None:
    """DeepSpeed's ``step=16, skipped=16`` (liucongg/ChatGLM-Finetuning#130): every step so far
    skipped, no update has gone through, whether or not the overflow lines were pasted; a count
    that stays put after the scaler settled (``skipped=5``) is no finding."""
    line = "[INFO] [logging.py:96:log_dist] [Rank 0] step={0}, skipped={1}, lr=[0.0001], mom=[(0.9, 0.95)]\n"
    text = "".join(line.format(step, n) for step, n in zip((15, 16, 17), skipped, strict=True))
    found = findings_of(tmp_path, text).get("overflow")
    assert (found.severity if found else None) == severity
    if found:
        assert "every one of the 17 steps so far skipped" in found.message


@pytest.mark.parametrize(("loss", "found"), [("87.3365", True), ("87.3412", False)])
def test_caffes_clamped_softmax_loss_is_an_infinite_loss(tmp_path: Path, loss: str, found: bool) -> None:
    """caffe's ``loss = 87.3365`` (yaringal/DropoutUncertaintyCaffeModels#3, wy1iu/sphereface#103)
    is -ln(FLT_MIN), the softmax's clamp of a label probability of 0: an infinite loss, on one
    record; a loss near it but not at it is a number like any other; and a loss first met on the
    second record did not vanish from the first."""
    glog = "I0616 00:24:30.437563 10711 solver.cpp:228] "
    text = glog + "Iteration 55900, lr = 0.0024\n" + glog + f"Iteration 56000, loss = {loss}\n"
    nonfinite = findings_of(tmp_path, text).get("nonfinite")
    assert (nonfinite is not None) == found
    if found:
        assert (nonfinite.step, nonfinite.severity) == (
            56000,
            "error",
        ) and "smallest float" in nonfinite.message


def test_a_loss_of_any_name_above_the_ceiling_is_a_divergence(tmp_path: Path) -> None:
    """A segmentation head's ``loss_seg1`` (XingangPan/OCDA-Driving-Example#1) goes 2.9, 52.8, 644,
    then 2.7e13: whatever the loss measures, no healthy run logs that; four records suffice, and
    the error is dated where the loss left its level, its first jump."""
    line = "iter {0}: loss_seg1 = {1}, loss_adv = 0.7\n"
    text = "".join(
        line.format(i, v) for i, v in enumerate(("2.930", "52.802", "643.913", "26799679471616.000"))
    )
    found = findings_of(tmp_path, text)["loss_divergence"]
    assert (found.step, found.severity, found.evidence["key"]) == (1, "error", "loss_seg1")


def test_apex_overflows_that_leave_the_scale_where_it_was_are_at_its_floor(tmp_path: Path) -> None:
    """NeMo's QuartzNet under apex (NVIDIA/NeMo#1225): ``Loss is NaN or inf.`` and ``reducing
    loss scale to 1.0`` step after step. apex does not say what it tried, but two overflows in a
    row that leave the scale at 1 tried 1 and kept it: the scaler's floor, and the loss NaN."""
    text = (
        "[NeMo W 2020-09-26 17:52:50 actions:1479] Loss is NaN or inf.\n"
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.0\n"
    ) * 3
    found = findings_of(tmp_path, text)
    assert found["nonfinite"].severity == "error" and "Loss is NaN or inf" in found["nonfinite"].message
    assert found["overflow"].severity in ("warning", "error") and "floor" in found["overflow"].message


@pytest.mark.parametrize(
    ("ppl", "found"), [("26881171418161356094253400435962903554686976.00", True), ("45560.61", False)]
)
def test_a_perplexity_no_healthy_run_reaches_is_a_divergence(tmp_path: Path, ppl: str, found: bool) -> None:
    """OpenNMT-py with Adam at a learning rate of 2 (OpenNMT-py#869): ``ppl:`` at exp(100), the cap
    its report puts on a cross-entropy past 100 nats a token; an untrained model's 45,560 is none."""
    line = "[2018-08-01 18:29:48,221 INFO] Step {0}/100000000; acc:   0.00; ppl: {1}; lr: 2.00000; 52 sec\n"
    divergence = findings_of(tmp_path, line.format(50, ppl) + line.format(100, ppl)).get("loss_divergence")
    assert (divergence is not None) == found
    if found:
        assert (divergence.step, divergence.severity) == (50, "error")


def test_overflows_at_a_scale_that_never_moves_are_no_settling() -> None:
    """Megatron-LM#602: every iteration skipped at a loss scale of 16384 (a fixed scale: a dynamic
    one falls within a few overflows), so the optimizer never stepped."""
    steps = [{"step": i, S.LOSS_SCALE: 16384.0, S.SKIPPED: 1} for i in range(1, 5)]
    (found,) = [f for f in diagnose(Trace(header={}, steps=steps)) if f.type == "overflow"]
    assert found.severity == "warning" and "settling" not in found.message
    steps[-1][S.LOSS_SCALE] = 8192.0  # the scale fell: the scaler settling
    (found,) = [f for f in diagnose(Trace(header={}, steps=steps)) if f.type == "overflow"]
    assert found.severity == "info" and "settling" in found.message


def _dicts(rows: list[tuple[float, float]], extra: str = "") -> str:
    line = "{{'loss': {}, 'grad_norm': {}, 'learning_rate': 1e-05{}}}\n"
    return "".join(line.format(loss, norm, extra) for loss, norm in rows)


@pytest.mark.parametrize(
    ("rows", "step"),
    [
        ([(1.7328, 2e-05), (0.0, 4e-06)], 1),  # a short paste that ends on a loss of 0
        ([(0.0, 0.011), (0.0, 0.009), (0.0, 0.014), (0.0, 0.017)], 0),  # 0 on every record
        ([(2.1, 1.0), (1.9, 1.0), (0.0, 0.0), (0.0, 0.0)], 2),  # with the norm at 0 too
        ([(2.1, 1e-3), (-6.43825e-20, 1e-3), (-6.43825e-20, 1e-3)], 1),  # 0 but for a sum's rounding
        ([(0.684, 1.0), (0.642, 1.0), (1.129, 1.0), (1.284, 1.0), (31.45, 1.0), (0.0, 1e-3), (0.0, 1e-3)], 5),
    ],
)
def test_a_language_modelling_loss_held_at_zero_is_zero_grad(
    tmp_path: Path, rows: list[tuple[float, float]], step: int
) -> None:
    found = findings_of(tmp_path, _dicts(rows))["zero_grad"]
    assert (found.step, found.severity) == (step, "warning")


@pytest.mark.parametrize(
    ("rows", "extra"),
    [
        ([(0.0, 0.3), (0.0, 0.2), (0.0, 0.4)], ", 'reward': 0.5, 'kl': 0.0"),  # GRPO: a policy loss of 0
        ([(0.0, 1e-3), (0.0, 1e-3), (0.0, 1e-3)], ", 'rewards/margins': 42.3"),  # DPO: margins saturated
        ([(2.1, 1.0), (0.0, 1.0), (2.0, 1.0), (1.9, 1.0), (1.9, 1.0), (1.8, 1.0)], ""),  # once, recovered
        ([(1.46, "nan"), (0.0, "nan"), (0.0, "nan"), (0.0, "nan")], ""),  # the non-finite finding's
    ],
)
def test_a_loss_of_zero_that_rl_explains_or_the_log_leaves_is_no_zero_grad(
    tmp_path: Path, rows: list[tuple[float, object]], extra: str
) -> None:
    assert "zero_grad" not in findings_of(tmp_path, _dicts(rows, extra))


def test_a_zero_norm_held_under_a_nonzero_loss_is_zero_grad(tmp_path: Path) -> None:
    """Equal rewards would zero the loss too: a norm of 0 under a loss of 12 reaches no weight."""
    found = findings_of(tmp_path, _dicts([(12.10, 0.0), (12.06, 0.0), (12.00, 0.0), (12.07, 0.0)]))
    assert found["zero_grad"].step == 0
    once = _dicts([(0.012, 1e-07), (0.012, 0.0), (0.0098, 5e-08), (0.033, 39.2), (0.002, 1e-03)])
    assert "zero_grad" not in findings_of(tmp_path, once)  # one exact 0 among tiny norms


def _iterations(losses: list[float]) -> str:
    return "".join(
        f"iter {76 + i} step {38 + i // 2}: loss {x}, iter time: 197.87ms\n" for i, x in enumerate(losses)
    )


def test_a_loss_pinned_on_every_record_is_zero_grad(tmp_path: Path) -> None:
    """litgpt's loss at 10.8259 on 23 iterations (the log of a 50,304-token vocabulary): no batch moved it."""
    found = findings_of(tmp_path, _iterations([10.8259] * 23))["zero_grad"]
    assert (found.step, found.severity, found.evidence["value"]) == (76, "warning", 10.8259)


def test_a_loss_that_falls_once_then_holds_to_the_end_is_zero_grad(tmp_path: Path) -> None:
    """InsightFace_Pytorch#71: ``print(loss)`` shows 34.6456, then 3.6976 batch after batch (the
    ArcFace head's weights not updating)."""
    line = "tensor({}, device='cuda:0', grad_fn=<NllLossBackward>)\n"
    text = "".join(line.format(v) for v in [34.6456] + [3.6976] * 9)
    found = findings_of(tmp_path, text)["zero_grad"]
    assert (found.step, found.evidence["value"]) == (1, 3.6976) and "its last 9 records" in found.message


@pytest.mark.parametrize(
    "losses",
    [
        [2.3] * 20,  # printed to two digits: a plateau may repeat
        [10.8259] * 4,  # too few records to say
        [10.8259] * 19 + [10.8258],  # it moved
        [2.1043, 1.9981, 2.0412] + [47.3365] * 12,  # a jump that stays: loss_divergence's
        [3.5625, 3.2812, 3.3281] + [3.2969] * 6,  # bf16 printed to four decimals: 1/64 apart near 3
        [2.0859, 2.0898] + [2.0879] * 6,  # float16 so printed: 1/512 apart near 2, on a quiet plateau
    ],
)
def test_a_loss_that_repeats_without_being_pinned_is_no_zero_grad(
    tmp_path: Path, losses: list[float]
) -> None:
    assert "zero_grad" not in findings_of(tmp_path, _iterations(losses))


@pytest.mark.parametrize(
    ("accuracies", "found"),
    [((0.6446, 0.6448, 0.6448, 0.6448), True), ((0.6446, 0.6448, 0.6451, 0.6453), False)],
)
def test_a_loss_held_with_its_accuracy_on_three_records_is_zero_grad(
    tmp_path: Path, accuracies: tuple[float, ...], found: bool
) -> None:
    """Keras's ``loss: 5.7257 - acc: 0.6448`` epoch after epoch (keras-team/keras#2392): the loss and the
    accuracy held to their last digit on three records say the outputs no longer change, though
    a loss alone needs five; an accuracy that still moves leaves three records too few."""
    bar = "Epoch {0}/100\n89595/89595 [==============================] - 8s - loss: {1} - acc: {2}\n"
    text = "".join(
        bar.format(e, loss, acc)
        for e, (loss, acc) in enumerate(zip((5.7178, 5.7257, 5.7257, 5.7257), accuracies, strict=True), 1)
    )
    zero = findings_of(tmp_path, text).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert zero.step == 2 * 89595 and "(and acc with it) on its last 3 records" in zero.message


@pytest.mark.parametrize(("printed", "found"), [("4.600", True), ("0.712", False)])
def test_a_loss_is_pinned_by_the_digits_its_line_prints(tmp_path: Path, printed: str, found: bool) -> None:
    """Lightning's bar prints ``train_loss=4.600`` (Lightning-AI/pytorch-lightning#20344): read back
    it is 4.6, two digits, but the line shows four, enough for a pin; ``0.712`` shows three, a
    plateau's."""
    bar = "Epoch 0:  {0}%|█         | {1}/704 [00:{0:02d}<02:00,  5.10it/s, v_num=3, train_loss={2}]\n"
    text = "".join(bar.format(i, 9 * i + 1, printed) for i in range(1, 9))
    zero = findings_of(tmp_path, text).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert f"exactly {printed} on all 8 records" in zero.message


@pytest.mark.parametrize(("drift", "found"), [(6e-7, True), (2e-5, False)])
def test_a_loss_held_to_its_fifth_digit_is_pinned_where_printed_finer(
    tmp_path: Path, drift: float, found: bool
) -> None:
    """DINO's collapsed run (dino#246): ``train_loss`` 11.090327 to 11.090333 over 11 epochs, one
    JSON record an epoch; the epoch is the step."""
    line = '{{"train_loss": {}, "train_lr": 0.00026, "epoch": {}}}\n'
    text = "".join(line.format(repr(11.090327262878418 * (1 + drift * i / 10)), 201 + i) for i in range(11))
    zero = findings_of(tmp_path, text, "log.txt").get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert zero.step == 201 and "11.090 to 5 digits" in zero.message


@pytest.mark.parametrize(
    ("losses", "step", "classes"),
    [
        ([1.356284, 1.386393, 1.386381, 1.386379, 1.38633], 77, 4),  # r2c's VCR run: ln 4, 5th decimal moving
        ([6.91161, 6.90776, 6.90776, 6.90776, 6.90776], 77, 1000),  # caffe's MobileNet: ln 1000
        ([2.3026, 2.3019, 2.2987, 2.2871], None, None),  # a ten-way classifier leaving its start
        ([0.7012, 0.6925, 0.6952, 0.6978], None, None),  # near ln 2, moving in the third decimal
        ([10.8262, 10.8261, 10.8262, 10.8259], None, None),  # ln of a vocabulary: K ± 1 not told apart
        ([1.3863, 1.3863], None, None),  # two records: too few to say
    ],
)
def test_a_loss_held_at_a_uniform_guess_is_zero_grad(
    tmp_path: Path, losses: list[float], step: int | None, classes: int | None
) -> None:
    """A classifier's loss held at ln K on three records or more: its outputs are a uniform guess
    among K classes whatever the input (allenai/r2c's VCR model at 1.3863 epoch after epoch)."""
    zero = findings_of(tmp_path, _iterations(losses)).get("zero_grad")
    assert (zero and zero.step, zero and zero.evidence["classes"]) == (step, classes)
    if zero:
        assert f"ln {classes} =" in zero.message and "its last 4 records" in zero.message


def test_a_validation_loss_held_at_a_uniform_guess_is_zero_grad(tmp_path: Path) -> None:
    """Lasagne's MNIST CNN (its ``mnist.py`` example's report, an epoch a block): the training loss
    falls toward ln 10 while the validation loss sits there, 2.3032 to 2.3014, and the accuracy at
    10.64 %: the outputs are a uniform guess whatever the digit."""
    block = "Epoch {0} of 500 took 494.369s\n  training loss:\t\t{1}\n  validation loss:\t\t{2}\n"
    block += "  validation accuracy:\t\t10.64 %\n"
    rows = [
        (2.471961, 2.303229),
        (2.36691, 2.303151),
        (2.332428, 2.301815),
        (2.3193, 2.301806),
        (2.313726, 2.301416),
    ]
    zero = findings_of(tmp_path, "".join(block.format(e, *row) for e, row in enumerate(rows, 1)))["zero_grad"]
    assert zero.evidence["key"] == "validation loss" and zero.evidence["classes"] == 10


_ALBERT = [11.174, 11.174, 11.176, 11.171, 11.166, 11.17, 11.174, 11.177]  # moving in the last digit


@pytest.mark.parametrize(
    ("accuracy", "losses", "found"),
    [
        ([0.0] * 8, _ALBERT, True),
        ([0.0] * 8, [11.174, 10.9, 10.2, 9.8, 9.1, 8.7, 8.2, 7.9], False),  # the loss falls: it learns
        ([0.0] * 4, _ALBERT[:4], False),  # four records: too few to say
        ([0.0] * 7 + [0.001], _ALBERT, False),  # one prediction right at the end
    ],
)
def test_an_accuracy_of_zero_beside_a_loss_that_does_not_fall_is_zero_grad(
    tmp_path: Path, accuracy: list[float], losses: list[float], found: bool
) -> None:
    """ALBERT's pre-training after a TensorFlow upgrade: ``MLM_acc: 0.000`` on every record while
    the loss holds at 11.17, moving in its last digit: no prediction right, and no learning."""
    line = "INFO Train step {0} -- Loss: {1}, MLM_acc: {2:.3f}, SOP_acc: 0.521 -- It/s: 1.69\n"
    text = "".join(
        line.format(1040 + 10 * i, x, a) for i, (x, a) in enumerate(zip(losses, accuracy, strict=True))
    )
    zero = findings_of(tmp_path, text).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert zero.step == 1040 and "MLM_acc is 0 on all 8 records" in zero.message


_DDP = [3.332, 3.1906, 3.8844, 3.5551, 3.1906, 3.7001, 3.7451, 3.5551, 3.1906, 3.5551, 3.7001, 3.9202, 3.5086]


@pytest.mark.parametrize(
    ("losses", "step"),
    [
        ([*_DDP, 3.5551, 3.1906, 3.7451, 3.1906], 83),  # litgpt#834: a few values, again and again
        ([round(3.4 + 0.3 * math.sin(2.7 * i), 4) for i in range(30)], None),  # a plateau that moves
        ([round(x, 2) for x in [*_DDP, 3.5551, 3.1906, 3.7451, 3.1906]], None),  # three digits: by chance
        (_DDP[:9], None),  # nine records: too few to say
        ([*_DDP, 3.5551, 3.1906, 3.7451, 3.4417], None),  # the log ends on a value of its own
    ],
)
def test_a_loss_that_keeps_repeating_a_few_values_is_zero_grad(
    tmp_path: Path, losses: list[float], step: int | None
) -> None:
    """LoRA under DDP whose adapters never update (Lightning-AI/litgpt#834): the loss takes the same
    few values, to the last digit, in no fixed order, iteration after iteration."""
    zero = findings_of(tmp_path, _iterations(losses)).get("zero_grad")
    assert (zero and zero.step) == step
    if step is not None:
        assert "repeats, to the last digit, a value of the 10 records before" in zero.message


_EPOCH = [0.9741, 1.3742, 1.2390, 0.9670, 1.0386, 1.1681, 1.2240, 0.9610]  # TRACE#5's first epoch


@pytest.mark.parametrize(
    ("losses", "step"),
    [
        (_EPOCH + _EPOCH[:6], 76),  # the next epoch scores the same batches the same
        ([2.0871, 2.0533] + _EPOCH[:5] * 3, 78),  # a loop over five batches, after two that learned
        (_EPOCH + _EPOCH[:4], None),  # four in a row: too few to say
        (_EPOCH + _EPOCH[:6] + [0.9411], None),  # the repeat broke off before the log ended
        ([round(x, 2) for x in _EPOCH + _EPOCH[:6]], None),  # printed to three digits: chance repeats
        ([x - 0.0001 * i for i, x in enumerate(_EPOCH + _EPOCH[:6])], None),  # it learns a little
    ],
)
def test_a_loss_that_replays_its_own_earlier_values_is_zero_grad(
    tmp_path: Path, losses: list[float], step: int | None
) -> None:
    """TRACE#5: each epoch's per-step losses repeat the previous epoch's to the last digit, since
    the LoRA adapters never updated."""
    found = findings_of(tmp_path, _iterations(losses)).get("zero_grad")
    assert (found and found.step) == step
    if found:
        assert found.severity == "warning" and "repeats, to the last digit" in found.message


def test_a_preference_run_whose_log_probs_are_exactly_zero_is_zero_grad(tmp_path: Path) -> None:
    """ETO's DPO run: loss 0.6931 with every reward, margin and log-probability at 0 (no token scored)."""
    record = (
        "{{'loss': {loss}, 'learning_rate': 5e-07, 'rewards/chosen': 0.0, 'rewards/rejected': 0.0, "
        "'rewards/margins': 0.0, 'logps/rejected': {logps}, 'logps/chosen': {logps}, 'epoch': 0.59}}\n"
    )
    found = findings_of(tmp_path, record.format(loss=0.6931, logps=0.0))["zero_grad"]
    assert (found.step, found.evidence["key"]) == (0, "logps/chosen")
    scored = record.format(loss=0.6931, logps=-120.5)  # the first step of a healthy run
    assert "zero_grad" not in findings_of(tmp_path, scored)


@pytest.mark.parametrize(("rewards", "found"), [((0.0, 0.0, 0.0), True), ((0.0, 0.0312, -0.0125), False)])
def test_a_preference_run_whose_rewards_are_exactly_zero_is_zero_grad(
    tmp_path: Path, rewards: tuple[float, ...], found: bool
) -> None:
    """DPO on a LoRA-tuned Llama whose loss holds at 0.6932 with every reward exactly 0.0 while the
    responses are scored (log-probabilities near -75): the policy is the reference, step after
    step; rewards that move after a first record of 0 are a run that learns."""
    line = "{{'loss': 0.6932, 'rewards/chosen': {0}, 'rewards/rejected': {1}, 'logps/chosen': -76.8}}\n"
    zero = findings_of(tmp_path, "".join(line.format(r, -r) for r in rewards)).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert "rewards/chosen and rewards/rejected are exactly 0" in zero.message


@pytest.mark.parametrize(("q_values", "judged"), [(", mean_q: -207.46", True), ("", False)])
def test_a_value_based_rl_loss_is_a_level(tmp_path: Path, q_values: str, judged: bool) -> None:
    """keras-rl's DQN logs its temporal-difference loss as ``loss`` beside ``mean_q``: its blow-up
    is a divergence; a policy-gradient loss beside a reward (no Q-values) has no level to leave."""
    line = "{}/50000: episode: {}, episode steps: 144, mean reward: -1.568, loss: {}{}\n"
    losses = (8734.29, 16017920.0, 11685805.0, 3477850.5)
    text = "".join(line.format(8996 + 200 * i, 63 + i, x, q_values) for i, x in enumerate(losses))
    found = findings_of(tmp_path, text)
    assert ("loss_divergence" in found) is judged
    if judged:
        assert found["loss_divergence"].step == 9196


def test_a_null_reward_does_not_make_an_sft_log_rl(tmp_path: Path) -> None:
    """LLaMA-Factory's SFT trainer_log.jsonl writes ``"reward": null`` on every line."""
    line = '{{"current_steps": {0}, "loss": {1}, "reward": null, "learning_rate": 3e-05, "epoch": 1.37}}\n'
    found = findings_of(tmp_path, line.format(4440, 2.7044) + line.format(4450, 0.0))
    assert found["zero_grad"].step == 4450


_XL = "| epoch   3 step {0:8d} |   {1:4d} batches | lr 0.000239 | loss {2:5.2f} | ppl {3:.3f}\n"


@pytest.mark.parametrize(
    ("losses", "found"),
    [
        (
            [7.31, 7.30, 7.31, 7.30, 7.31, 7.32, 7.32, 7.32, 7.31, 7.33],
            True,
        ),  # transformer-xl#95 at ppl 1,500
        ([7.61 - 0.05 * i for i in range(10)], False),  # it falls: a model learning at that level
        ([3.71, 3.70, 3.71, 3.70, 3.71, 3.72, 3.72, 3.72, 3.71, 3.73], False),  # ppl 41: a plateau of a model
        ([7.31, 7.30, 7.31, 7.30, 7.31, 7.32, 7.32], False),  # seven records: too few to say
    ],
)
def test_a_language_model_held_at_a_unigrams_perplexity_is_zero_grad(
    tmp_path: Path, losses: list[float], found: bool
) -> None:
    text = "".join(_XL.format(26800 + 200 * i, 3860 + 200 * i, x, math.exp(x)) for i, x in enumerate(losses))
    zero = findings_of(tmp_path, text).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert zero.step == 26800 and "perplexity of about 1500" in zero.message


def test_a_loss_of_zero_beside_an_accuracy_of_zero_scores_nothing_whatever_the_norm(tmp_path: Path) -> None:
    """ms-swift#8142: ``loss 0.0`` and ``token_acc 0.0`` on every record, the gradient clipped to
    1.0: no token is scored. Without the accuracy, a norm that large says the loss is 0 by
    construction (a GRPO loss whose other keys the paste left out)."""
    line = '{{"current_steps": {0}, "loss": 0.0, "grad_norm": 1.0, "learning_rate": 5e-05{1}}}\n'
    text = "".join(line.format(s, ', "token_acc": 0.0') for s in (1, 10, 20, 30))
    zero = findings_of(tmp_path, text, "log.jsonl").get("zero_grad")
    assert zero is not None and zero.step == 1 and zero.evidence["loss_zero"]
    assert "zero_grad" not in findings_of(
        tmp_path, "".join(line.format(s, "") for s in (1, 10, 20, 30)), "log.jsonl"
    )


@pytest.mark.parametrize(("accuracy", "found"), [("0.1000", True), ("0.1164", False)])
def test_one_record_at_a_guess_s_loss_and_accuracy_is_zero_grad(
    tmp_path: Path, accuracy: str, found: bool
) -> None:
    """flower#1398: a federated CIFAR-10 model evaluated at ``loss: 2.3026 - accuracy: 0.1000``, the
    loss ln 10 and the accuracy 1/10 of a uniform guess on one record; a loss near ln 10 alone is
    an untrained start."""
    text = (
        "20/20 [==============================] - 5s 96ms/step - loss: 2.8006 - accuracy: 0.1164\n"
        f"313/313 [==============================] - 4s 10ms/step - loss: 2.3026 - accuracy: {accuracy}\n"
    )
    zero = findings_of(tmp_path, text).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert zero.step == 313 and "where accuracy is 1/10 too" in zero.message


@pytest.mark.parametrize(
    ("rounds", "accuracy", "found"), [(6, "0.673", True), (4, "0.673", False), (6, None, False)]
)
def test_a_loss_printed_to_three_digits_held_with_its_accuracy_on_five_records_is_zero_grad(
    tmp_path: Path, rounds: int, accuracy: str | None, found: bool
) -> None:
    """tensorflow-federated#2820: ``Eval metrics: loss=0.823, accuracy=0.673`` round after round; a
    three-digit loss repeats on a plateau by chance, but not with its accuracy on five records."""
    fields = f"loss=0.823, accuracy={accuracy}" if accuracy else "loss=0.823"
    text = "".join(f"Round {r}\nEval metrics: {fields}\n" for r in range(1, rounds + 1))
    zero = findings_of(tmp_path, text).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert "exactly 0.823 (and accuracy with it)" in zero.message


def test_a_log2_loss_scale_below_0_is_an_overflow(tmp_path: Path) -> None:
    """SegDiff#20: guided-diffusion's logger table with ``lg_loss_scale -0.821``, a scale of 0.57 that
    started at 2^20."""
    text = (
        "-" * 28
        + "\n| grad_norm     | 2.1      |\n| lg_loss_scale | -0.821   |\n| loss          | 5.99     |\n"
    )
    text += "| step          | 200      |\n" + "-" * 28 + "\n"
    overflow = findings_of(tmp_path, text)["overflow"]
    assert (
        overflow.step == 200
        and overflow.severity == "error"
        and overflow.evidence["lowest_scale"] == 2**-0.821
    )


def test_an_error_rate_held_at_one_beside_a_flat_loss_is_zero_grad(tmp_path: Path) -> None:
    """deep_avsr#43: ``Tr.CER: 1.000`` on every record from step 3 while the loss holds at 3.32."""
    line = "Step: {0:03d} || Tr.Loss: {1}  Val.Loss: 3.31 || Tr.CER: {2}  Val.CER: 1.000\n"
    rows = [(3.1358, "0.977"), (2.9118, "0.928")] + [(3.3232 + 0.0004 * (i % 3), "1.000") for i in range(5)]
    zero = findings_of(tmp_path, "".join(line.format(i, *row) for i, row in enumerate(rows)))["zero_grad"]
    assert zero.step == 2 and "Tr.CER is 1 on its last 5 records" in zero.message


def test_a_heads_loss_of_zero_beside_an_accuracy_of_zero_is_zero_grad(tmp_path: Path) -> None:
    """PaddleOCR (PaddleOCR#7791): ``acc: 0.000000, … CTCLoss: 0.000000, SARLoss: 1.69`` on every
    record: the CTC head scores nothing while the other head's loss moves."""
    line = "ppocr INFO: global_step: {0}, acc: {1}, CTCLoss: 0.000000, SARLoss: {2}, loss: {2}\n"
    rows = ((90, "0.000000", 1.6922), (93, "0.000000", 1.6756), (100, "0.000000", 1.6535))
    zero = findings_of(tmp_path, "".join(line.format(*row) for row in rows))["zero_grad"]
    assert zero.step == 90 and zero.evidence["key"] == "CTCLoss"
    learning = "".join(line.format(s, "0.012000", x) for s, _, x in rows)
    assert "zero_grad" not in findings_of(tmp_path, learning)


def test_warnings_alone_of_a_scale_fallen_far_below_one_are_an_overflow(tmp_path: Path) -> None:
    """icefall#1463: ``Grad scale is small: 1.29e-26`` on each rank, and nothing else pasted."""
    line = "2024-01-14 01:03:0{0},826 WARNING [train.py:1057] ({0}/4) Grad scale is small: 1.29e-26\n"
    text = "".join(line.format(r) for r in range(2))
    overflow = findings_of(tmp_path, text)["overflow"]
    assert overflow.severity == "error" and overflow.evidence["lowest_scale"] == 1.29e-26


@pytest.mark.parametrize(("accuracy_after", "found"), [(0.22, True), (0.45, False)])
def test_a_loss_that_doubles_while_the_accuracy_halves_is_a_divergence(
    tmp_path: Path, accuracy_after: float, found: bool
) -> None:
    """ms-swift#3617, a multi-image SFT run "degrading": the training loss 2.81 -> 5.29 while the token
    accuracy falls 0.46 -> 0.22; a loss that rises while the accuracy holds is a harder stretch of data."""
    line = '{{"loss": {1}, "token_acc": {2}, "grad_norm": 15.0, "learning_rate": 4.8e-06, "step": {0}}}\n'
    losses = [2.81, 2.85, 2.88, 2.83, 4.07, 4.16, 4.08, 4.13, 5.28, 5.23, 5.31, 5.22]
    accuracy = [*[0.46] * 4, *[0.29] * 4, *[accuracy_after] * 4]
    text = "".join(
        line.format(1500 + 20 * i, x, a) for i, (x, a) in enumerate(zip(losses, accuracy, strict=True))
    )
    worse = findings_of(tmp_path, text, "log.jsonl").get("loss_divergence")
    assert (worse is not None) == found
    if found:
        assert worse.step == 1580 and "the model gets worse at the data it trains on" in worse.message


def test_an_accuracy_that_falls_to_one_in_k_and_holds_three_records_is_zero_grad(tmp_path: Path) -> None:
    """tch-rs#244: CIFAR-10 test accuracy 72.32 % then exactly 10.00 % on three epochs: a model that
    had learned answers one class; three records at 1/K without that fall are too few."""
    line = "epoch: {0:4d} test acc: {1}%\n"
    fallen = "".join(
        line.format(e, a) for e, a in enumerate(["60.67", "71.65", "72.32", "10.00", "10.00", "10.00"], 1)
    )
    zero = findings_of(tmp_path, fallen)["zero_grad"]
    assert zero.step == 4 and zero.evidence["classes"] == 10
    start = "".join(line.format(e, "10.00") for e in range(1, 4))
    assert "zero_grad" not in findings_of(tmp_path, start)


def test_a_trainers_own_spike_guard_is_a_grad_spike(tmp_path: Path) -> None:
    """minFM#4: the trainer skips the update for a norm above its guard's threshold, four steps in
    a row, with too few norms logged to judge a spike by; a NaN norm the guard reports is non-finite."""
    line = "2025-08-23 06:19:20,889 - trainers.dit_trainer - WARNING - Step {}: detected nan/inf/spiky "
    line += "gradient (norm={}); skipping optimizer step.\n"
    text = "".join(line.format(s, n) for s, n in [(1557, 2.1967), (1558, 2.1643), (1559, 2.1794)])
    text += "2025-08-23 06:20:07,600 - trainers.dit_trainer - INFO - Step   1560 | Loss: 0.5275 | "
    text += "GradNorm: 2.29\n"
    spike = findings_of(tmp_path, text)["grad_spike"]
    assert spike.step == 1557 and spike.evidence["steps"] == [1557, 1558, 1559]
    assert "Step 1557: detected nan/inf/spiky gradient" in spike.message
    nan = findings_of(tmp_path, text.replace("2.1643", "nan"))
    assert nan["nonfinite"].step == 1558


@pytest.mark.parametrize(("loss", "found"), [("39307117.633155", True), ("2.9", False)])
def test_a_loss_far_above_the_best_its_record_names_is_a_divergence(
    tmp_path: Path, loss: str, found: bool
) -> None:
    """MeshMAE#11: one pasted epoch whose loss is 1.7e7 times the best loss the same line names."""
    text = f"Epoch 2 Pretrain | Loss: {loss} | Best Loss: 2.271230 | Best Epoch: 0 | Time: 2.4h\n"
    assert ("loss_divergence" in findings_of(tmp_path, text)) is found


def test_a_running_mean_that_is_not_finite_is_nonfinite_but_a_gradient_norms_is_fp16s(tmp_path: Path) -> None:
    """DINOv2#492: ``koleo_loss: 0.0315 (inf)``, the meter's mean infinite while the value is
    finite: a step before the paste gave Inf. Swin#47: ``grad_norm 2.1 (inf)`` is the step fp16
    loss scaling skipped, its norm inf, which the mean keeps: no finding."""
    line = (
        "I20250104 12:12:42 90 dinov2 helpers.py:102] Training  [{i:7d}/2500000]  lr: 0.0006 (0.0003)  "
        "total_loss: 6.72{i} ({mean})  koleo_loss: 0.0315 ({mean})  time: 1.363414\n"
    )
    text = "".join(line.format(i=i, mean="inf") for i in (1250, 1260, 1270))
    found = findings_of(tmp_path, text)["nonfinite"]
    assert found.step == 1250 and "koleo_loss (mean)" in found.message
    finite = "".join(line.format(i=i, mean="6.5") for i in (1250, 1260, 1270))
    assert "nonfinite" not in findings_of(tmp_path, finite)
    swin = "[2021-01-01 10:00:00 swin] (main.py 200): INFO Train: [0/300][{i}/5000]\tlr 0.000001\t"
    swin += "loss 4.{i} (4.2000)\tgrad_norm 2.1 (inf)\tmem 5000MB\n"
    assert "nonfinite" not in findings_of(tmp_path, "".join(swin.format(i=i) for i in (100, 200, 300)))


def test_statistics_of_nothing_before_the_first_update_are_a_warning(tmp_path: Path) -> None:
    """rlpyt#78: every statistic of the first summaries is NaN (nothing in the replay buffer yet),
    then finite; a NaN loss beside a finite learning rate is a run that went NaN."""
    block = "lossAverage               {v}\ngradNormAverage           {v}\ntdAbsErrAverage           {v}\n"
    text = block.format(v="nan") + block.format(v="0.011436")
    found = findings_of(tmp_path, text)["nonfinite"]
    assert found.severity == "warning" and found.evidence["empty_statistics"]
    lr = "lossAverage               {v}\nlearningRate              0.001\n"
    diverged = lr.format(v="nan") + lr.format(v="0.011436")
    assert findings_of(tmp_path, diverged)["nonfinite"].severity == "error"


def test_a_mean_reward_held_to_its_last_digit_is_no_signal(tmp_path: Path) -> None:
    """DDPG-HER#4: ``EP_reward:-50.000``, the floor of an episode that never reached its goal,
    epoch after epoch; a reward that moves, or one printed too coarsely to tell, is no verdict."""
    line = "Epoch:{e}| Running_reward:{r}| EP_reward:{r}| Actor_Loss:{a:.3f}| Critic_Loss:0.001\n"
    held = "".join(line.format(e=e, r="-50.000", a=0.5 + 0.4 * e) for e in range(8))
    found = findings_of(tmp_path, held)["no_signal"]
    assert found.step == 0 and found.severity == "warning" and len(found.evidence["steps"]) == 8
    moving = "".join(line.format(e=e, r=f"-{50 - e}.000", a=0.5 + 0.4 * e) for e in range(8))
    assert "no_signal" not in findings_of(tmp_path, moving)
    coarse = "".join(line.format(e=e, r="-50", a=0.5 + 0.4 * e) for e in range(8))
    assert "no_signal" not in findings_of(tmp_path, coarse)
    short = "".join(line.format(e=e, r="-50.000", a=0.5 + 0.4 * e) for e in range(4))
    assert "no_signal" not in findings_of(tmp_path, short)


def test_a_loss_that_grows_by_design_beside_an_accuracy_that_holds_is_no_divergence(tmp_path: Path) -> None:
    """LNL's sparse regulariser: the total loss grows every iteration while the test accuracy holds."""
    text = "".join(f"Iter {i}: loss={4.5e6 * 1.05**i:.4f}, test_acc=0.5{4 - i % 3}39\n" for i in range(12))
    assert "loss_divergence" not in findings_of(tmp_path, text)
    falling = "".join(
        f"Iter {i}: loss={4.5e6 * 1.05**i:.4f}, test_acc={0.54 - 0.04 * i:.4f}\n" for i in range(12)
    )
    assert findings_of(tmp_path, falling)["loss_divergence"].step == 1


def test_a_detectors_regression_loss_at_zero_beside_its_class_loss_is_zero_grad(tmp_path: Path) -> None:
    """Yet-Another-EfficientDet#723: the bar's description names the global step, the regression
    loss is 0 on every record beside a class loss that moves; a ``reg_loss`` without one may be a
    regulariser's."""
    line = (
        "Step: {s}. Epoch: 1999/2000. Iteration: {i}/35. Cls loss: 0.035{i}. Reg loss: 0.00000. Total loss: "
    )
    line += "0.035{i}:  54%|█████▍    | {i}/35 [01:14<00:24,  1.51s/it]\n"
    text = "".join(line.format(s=69964 + i, i=i) for i in range(19, 24))
    found = findings_of(tmp_path, text)["zero_grad"]
    assert found.step == 69983 and "Reg loss" in found.message
    alone = "".join(f"step {i} | loss 0.{40 - i} | reg_loss 0.0\n" for i in range(5))
    assert "zero_grad" not in findings_of(tmp_path, alone)
    # two records, each a mean over its logging interval (PaddleDetection's GFL at iterations 60 and 80)
    gfl = (
        "Epoch: [0] [ {0}/605] learning_rate: 0.028 loss_vfl: 0.{1} loss_bbox: 0.000000 loss_dfl: 0.000000\n"
    )
    assert findings_of(tmp_path, gfl.format(60, 187070) + gfl.format(80, 120860))["zero_grad"].step == 60


def test_a_loss_under_its_own_name_that_diverges_is_judged_once(tmp_path: Path) -> None:
    """MoBE#3: ``Scaled Loss`` and ``Real MSE Loss``, names no key map knows, both diverge: one
    finding, on the first; a GAN's generator loss, which swings by design, is no divergence."""
    scaled = [0.066, 0.054, 0.051, 0.048, 0.054, 0.061, 0.073, 0.089, 0.25, 19.8, 52.0, 150.0, 296.7]
    line = "Epoch {e}, Scaled Loss: {v:.10f}, Real MSE Loss: {m:.10f}\n"
    text = "".join(line.format(e=200 * (i + 1), v=v, m=1100 * v) for i, v in enumerate(scaled))
    path = tmp_path / "mobe.log"
    path.write_text(text, encoding="utf-8")
    found = [f for f in diagnose(read_log(path)) if f.type == "loss_divergence"]
    assert len(found) == 1 and found[0].step == 2000 and "Scaled Loss" in found[0].message
    gan = "".join(
        f"[Epoch {e}/50] [D loss: {1.5 / (e + 1):.4f}] [G loss: {v:.4f}]\n" for e, v in enumerate(scaled)
    )
    assert "loss_divergence" not in findings_of(tmp_path, gan)


@pytest.mark.parametrize(
    ("loss", "acc", "found"),
    [("0.6883", "0.5352", True), ("0.6883", "0.7352", False), ("0.5883", "0.5352", False)],
)
def test_a_loss_near_ln_k_beside_an_accuracy_near_1_over_k_is_a_guess(
    tmp_path: Path, loss: str, acc: str, found: bool
) -> None:
    """ConvNeXt#39: two classes after 300 epochs, the loss near ln 2 and the accuracy near 1/2 on
    the same record; either number away from the guess's is no finding."""
    text = (
        "Epoch: [0] Total time: 0:00:41 (1.1597 s / it)\n"
        "Averaged stats: lr: 0.003596  loss: 2.2043 (2.8601)  class_acc: 0.5234 (0.5078)\n"
        "Epoch: [299] Total time: 0:00:22 (0.6137 s / it)\n"
        f"Averaged stats: lr: 0.000010  loss: {loss} (0.6902)  class_acc: {acc} (0.5386)\n"
    )
    assert ("zero_grad" in findings_of(tmp_path, text)) is found


@pytest.mark.parametrize(("last", "found"), [("2.89", True), ("2.59", False)])
def test_two_error_rates_at_100_beside_a_loss_that_barely_falls_is_no_learning(
    tmp_path: Path, last: str, found: bool
) -> None:
    """speechbrain#2067: a wav2vec2 CTC model that emits only blanks, its CER and WER at 100 every
    epoch while the loss creeps down by a few percent; a loss that falls by a tenth is learning."""
    line = "epoch: {e} - train loss: {v} - valid loss: {h}, valid CER: 1.00e+02, valid WER: 1.00e+02\n"
    losses = zip(("3.11", "2.95", "2.92", last), ("2.99", "2.94", "2.94", "2.93"), strict=True)
    text = "".join(line.format(e=e, v=v, h=h) for e, (v, h) in enumerate(losses, 1))
    assert ("zero_grad" in findings_of(tmp_path, text)) is found


def test_a_word_error_rate_at_100_is_judged_beside_a_held_out_loss_alone(tmp_path: Path) -> None:
    """fairseq#2570: only validation records, ``valid_wer`` and ``valid_raw_wer`` at 100 while
    ``valid_loss`` moves by a percent or two."""
    line = (
        '2021-01-25 11:53:19 | INFO | valid | {{"epoch": {e}, "valid_loss": "{v}", "valid_uer": "200.395", '
        '"valid_wer": "100", "valid_raw_wer": "100", "valid_num_updates": "{u}"}}\n'
    )
    text = "".join(
        line.format(e=e, v=v, u=50 * e) for e, v in ((1, "898.216"), (2, "893.164"), (3, "885.232"))
    )
    assert "valid_loss" in findings_of(tmp_path, text)["zero_grad"].message


def test_an_infinite_perplexity_beside_a_huge_finite_loss_is_a_divergence(tmp_path: Path) -> None:
    """OpenNMT-tf#744: ``loss = 148890.718750 ; perplexity = inf`` is the exponential of a loss too
    large for a float, no NaN or Inf the model computed; a NaN loss beside it stays nonfinite."""
    text = (
        "INFO:tensorflow:Evaluation result for step 435000: loss = {v} ; perplexity = inf\n"
        "INFO:tensorflow:Step = 435100 ; steps/s = 2.97, source words/s = 12176 ; Loss = 185912.781250\n"
    )
    found = findings_of(tmp_path, text.format(v="148890.718750"))
    assert found["loss_divergence"].severity == "error" and "nonfinite" not in found
    assert "nonfinite" in findings_of(tmp_path, text.format(v="nan"))


def test_a_win_rate_that_falls_to_nothing_is_a_collapse_while_the_training_reward_holds(
    tmp_path: Path,
) -> None:
    """MARL-Algorithms#3 (QMIX on SMAC, a harder map): the evaluation's win rate falls from 0.7 to
    0 and stays there while the training reward still rises."""
    rates = [0.0, 0.7, 0.55, 0.7, 0.6, 0.65, 0.7, 0.55, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    line = "epoch: {e} avg_reward: {r} avg_winrate: 0.0 test_avg_reward {t} test_avg_winrate {w}\n"
    text = "".join(line.format(e=100 * i, r=1.5 + 0.1 * i, t=4 + 20 * w, w=w) for i, w in enumerate(rates))
    found = findings_of(tmp_path, text)["reward_collapse"]
    assert "test_avg_winrate" in found.message and found.step == 800


@pytest.mark.parametrize(
    ("rewards", "found"),
    [
        ("1 1 1 -1 1 -1 -1 -1 -1 1 -1 -1 -1 -1 -1", False),  # a policy at chance, its wins by luck
        ("1 1 1 1 1 1 1 1 1 1 -1 -1 -1 -1 -1 -1 -1 -1 -1 -1", True),  # every episode lost from the 11th on
    ],
)
def test_a_win_or_lose_reward_collapses_only_past_its_noise(
    tmp_path: Path, rewards: str, found: bool
) -> None:
    """dm-haiku#160: IMPALA on Catch, each episode won or lost (±1); its first three wins then a
    loss, a win and losses are the noise of a policy at chance, no collapse at the sixth episode."""
    line = "I0609 18:33:02.396359 1400 impala_lite.py:178] Episode ended with reward: {r}\n"
    text = "".join(line.format(r=r) for r in rewards.split())
    assert ("reward_collapse" in findings_of(tmp_path, text)) is found


def test_tensorflows_check_numerics_is_a_nonfinite_alert(tmp_path: Path) -> None:
    """FPN_Tensorflow#2: the Object Detection API's trainer stops on ``LossTensor is inf or nan. :
    Tensor had NaN values``, after its last finite records."""
    line = "INFO:tensorflow:global step {s}: loss = {v} (0.131 sec/step)\n"
    text = "".join(line.format(s=s, v=v) for s, v in ((124368, 0.114), (124369, 0.0992), (124370, 0.0627)))
    text += (
        "INFO:tensorflow:Error reported to Coordinator: <class 'tensorflow.python.framework.errors_impl."
        "InvalidArgumentError'>, LossTensor is inf or nan. : Tensor had NaN values\n"
    )
    assert findings_of(tmp_path, text)["nonfinite"].step == 124370


@pytest.mark.parametrize(("zeros", "found"), [(11, True), (3, False)])
def test_a_logs_one_loss_of_its_own_held_at_zero_is_zero_grad(
    tmp_path: Path, zeros: int, found: bool
) -> None:
    """SEC-MXNet#8: ``MultiLogisticLoss=0.000000`` batch after batch, the one loss the log names; a
    loss a key map does not know needs five records at 0, not two."""
    line = "Epoch[1] Batch[{b}]\tSpeed: 29.01 samples/sec\t\tMultiLogisticLoss={v}\n"
    values = ["0.100427"] + ["0.000000"] * zeros
    text = "".join(line.format(b=10 * (i + 1), v=v) for i, v in enumerate(values))
    assert ("zero_grad" in findings_of(tmp_path, text)) is found


@pytest.mark.parametrize(
    ("accuracies", "found"),
    [("0.42 0.41 0.39 0.37 0.35 0.34", True), ("0.42 0.41 0.43 0.40 0.44 0.45", False)],
)
def test_a_loss_that_climbs_while_the_accuracy_falls_on_every_record_diverges(
    tmp_path: Path, accuracies: str, found: bool
) -> None:
    """keras#932 (rmsprop): the loss rises on five records in a row and the accuracy falls on every
    one; an accuracy that does not fall with it leaves a climb this small unjudged."""
    line = "Epoch {e}/20\n370784/370784 [==============================] - 6700s - loss: {v} - acc: {a}\n"
    losses = (1.8887, 1.9328, 1.9986, 2.0482, 2.1057, 2.1578)
    text = "".join(
        line.format(e=e, v=v, a=a) for e, (v, a) in enumerate(zip(losses, accuracies.split(), strict=True), 1)
    )
    assert ("loss_divergence" in findings_of(tmp_path, text)) is found


def test_a_loss_named_cross_entropy_is_judged_as_a_loss(tmp_path: Path) -> None:
    """horovod#1737: TF DeepLab logs its loss as ``cross_entropy``, thousands of times its level on
    the record a paste ends on."""
    line = "INFO:tensorflow:cross_entropy = {v}, learning_rate = 0.0139, train_px_accuracy = 0.6 (7.3 sec)\n"
    text = "".join(line.format(v=v) for v in (3.2, 3.4, 3.3, 3.1, 3.2, 3936.9))
    assert findings_of(tmp_path, text)["loss_divergence"].evidence["key"] == "cross_entropy"


@pytest.mark.parametrize(("reward", "found"), [("3.799999999999999", True), ("500.0", False)])
def test_an_unrounded_reward_repeated_every_episode_is_no_signal_without_a_loss(
    tmp_path: Path, reward: str, found: bool
) -> None:
    """hardikbansal/Qlearning#2: ``Total rewards in episode 73 is 3.799999999999999`` episode after
    episode, the same play again and again; a solved CartPole's 500.0 on every evaluation, with no
    update logged, says nothing of learning."""
    line = "Total rewards in episode {e} is {r} total number of steps are {n}\n"
    text = "".join(line.format(e=e, r=reward, n=49 * e) for e in range(73, 81))
    assert ("no_signal" in findings_of(tmp_path, text)) is found


@pytest.mark.parametrize(("last", "found"), [("87.3365", True), ("9.4123", False)])
def test_a_loss_held_at_a_softmaxs_clamp_is_zero_grad_beside_nonfinite(
    tmp_path: Path, last: str, found: bool
) -> None:
    """sphereface#103: ``softmax_loss = 87.3365`` iteration after iteration, the
    label's probability 0 on every sample: the clamp is ``nonfinite``, and held, no update moves it."""
    line = "I0101 10:00:00.000000 1 solver.cpp:228] Iteration {i}, loss = {v}\n"
    text = "".join(line.format(i=i, v=v) for i, v in ((26400, "87.3365"), (26500, "87.3365"), (26600, last)))
    assert ("zero_grad" in findings_of(tmp_path, text)) is found


def test_a_jump_to_a_softmaxs_clamp_that_stays_is_a_divergence_and_zero_grad(tmp_path: Path) -> None:
    """A captioner's caffe loss at 9.4 and 9.39, then 87.3365 to the end: the jump dates the
    divergence, and the clamp held says no update brings the label's probability back."""
    line = "I0101 10:00:00.000000 1 solver.cpp:228] Iteration {i}, loss = {v}\n"
    values = ("9.4123", "9.3871", "87.3365", "87.3365", "87.3365")
    text = "".join(line.format(i=100 * i, v=v) for i, v in enumerate(values))
    assert {"loss_divergence", "zero_grad"} <= findings_of(tmp_path, text).keys()


def test_a_boosting_librarys_metric_that_blows_up_is_a_divergence(tmp_path: Path) -> None:
    """xgboost#2754: ``train-rmse`` falls to 0.17, then jumps to 26.6 and to the thousands with
    ``gpu_hist``: the objective a booster minimises, judged as a loss."""
    values = (0.473405, 0.283467, 0.169742, 26.6116, 1039.72, 627.03, 441.193, 303.379, 1226.3, 1257.13)
    text = "".join(f"[{10 * i}]\ttrain-rmse:{v}\n" for i, v in enumerate(values))
    assert findings_of(tmp_path, text)["loss_divergence"].step == 30


@pytest.mark.parametrize(("last", "found"), [("933870", True), ("21104.2", False)])
def test_a_held_out_loss_that_jumps_far_above_its_level_is_a_divergence(
    tmp_path: Path, last: str, found: bool
) -> None:
    """LightGBM#3794: a custom objective's ``valid_0's l2`` 20996.4, then 933870, then 3.01e+09: no
    overfitting moves a held-out loss that far in two rounds; one that holds is no finding."""
    text = f"[1]\tvalid_0's l2: 20996.4\n[2]\tvalid_0's l2: {last}\n[3]\tvalid_0's l2: {last}\n"
    assert ("loss_divergence" in findings_of(tmp_path, text)) is found


def test_a_gradscalers_infinite_norm_beside_a_finite_loss_is_an_overflow_not_a_nan(tmp_path: Path) -> None:
    """VideoMAE#130: ``grad_norm: inf`` at the first step beside ``loss_scale: 32768.0000`` and a
    finite loss, then finite: the step PyTorch's GradScaler skipped and the scale it halved."""
    line = (
        "Epoch: [0]  [{i:5d}/17227]  lr: 0.000001  loss: 6.{i:04d} (6.0000)  "
        "loss_scale: {s:.4f} (22341.8182)  grad_norm: {g} (inf)  time: 3.0352\n"
    )
    rows = ((0, 32768.0, "inf"), (10, 16384.0, "6.5337"), (20, 16384.0, "6.5185"))
    found = findings_of(tmp_path, "".join(line.format(i=i, s=s, g=g) for i, s, g in rows))
    assert "nonfinite" not in found and found["overflow"].step == 0


@pytest.mark.parametrize(("term", "found"), [("88.0000", True), ("0.1891", False), ("88.0012", False)])
def test_a_loss_term_held_at_a_bound_while_the_loss_moves_is_zero_grad(
    tmp_path: Path, term: str, found: bool
) -> None:
    """Cross-Modal-Re-ID-baseline: the triplet term ``TLoss: 88.0000`` batch after batch (its
    distances clamped at 88) while the total moves: no gradient from it. A term that holds at a
    running mean's fourth decimal (FairMOT's ``off_loss 0.1891``), or off a whole number, is no bound."""
    line = (
        "Epoch: [4][{i}/695] Time: 0.274 (0.275) lr:0.050 Loss: {t} iLoss: 0.3515 TLoss: {term} Accu: 43.75\n"
    )
    totals = ("88.3515", "88.5411", "88.2826", "88.2636", "88.1958", "88.3473")
    text = "".join(line.format(i=350 + 50 * i, t=t, term=term) for i, t in enumerate(totals))
    assert ("zero_grad" in findings_of(tmp_path, text)) is found


@pytest.mark.parametrize(
    "said",
    [
        "/site-packages/pyro/infer/traceenum_elbo.py:419: UserWarning: Encountered NaN: loss",
        "NaN detected in gradient of embedding.weight",
        "Stopping epoch because loss is NaN",
        "terminate called recursively\n  what():  Encountered NaN.terminate called recursively",
    ],
)
def test_pyros_and_a_loops_own_nan_check_are_nonfinite_alerts(tmp_path: Path, said: str) -> None:
    """CellBender#52: Pyro's ``UserWarning: Encountered NaN: loss`` after the last finite epoch;
    PyxLSTM#26: a loop's own check, ``NaN detected in gradient of embedding.weight``; CIBHash#7: the
    trainer's ``Stopping epoch because loss is NaN``; fastText#385: its ``Encountered NaN.`` thrown as
    it aborts."""
    line = "cellbender:remove-background: [epoch {e:03d}]  average training loss: {v}\n"
    text = "".join(line.format(e=e, v=v) for e, v in ((33, 1531.2), (34, 1529.0032))) + said + "\n"
    assert findings_of(tmp_path, text)["nonfinite"].step == 34


def test_kpconvs_loss_held_at_zero_is_zero_grad(tmp_path: Path) -> None:
    """KPConv-PyTorch#159: ``e001-i0607 => L=0.000 acc= 82% / t(ms): …`` on every record while the
    accuracy jumps about: a loss of 0 carries no signal."""
    line = "e001-i{i:04d} => L=0.000 acc= {a}% / t(ms):  38.8  35.4  38.7)\n"
    text = "".join(line.format(i=607 + 10 * k, a=a) for k, a in enumerate((82, 89, 95, 76, 83, 90, 85)))
    assert findings_of(tmp_path, text)["zero_grad"].step == 607


@pytest.mark.parametrize(("accuracy_after", "found"), [("0.076458", True), ("0.402111", False)])
def test_a_two_record_paste_whose_loss_doubles_as_its_accuracy_halves_diverges(
    tmp_path: Path, accuracy_after: str, found: bool
) -> None:
    """fastai#1736: a Transformer-XL's ``fit_one_cycle`` table, epoch 1 at ``2.760716 … 0.442434``,
    epoch 2 at ``6.228361 … 0.076458``: too short for thirds, the last jump says it; a loss that
    doubles while the accuracy holds may be a harder stretch of data."""
    text = (
        "epoch\ttrain_loss\tvalid_loss\taccuracy\n1\t2.760716\t2.756633\t0.442434\n"
        f"2\t6.228361\t6.220452\t{accuracy_after}\n"
    )
    worse = findings_of(tmp_path, text).get("loss_divergence")
    assert (worse is not None) == found
    if found:
        assert worse.step == 2 and "lost what it had learned" in worse.message


@pytest.mark.parametrize(("held", "found"), [("0.2000", True), ("0.2173", False)])
def test_a_held_out_loss_held_at_a_round_value_while_the_loss_moves_is_zero_grad(
    tmp_path: Path, held: str, found: bool
) -> None:
    """FaceNet#3 (Keras): ``val_loss: 0.2000``, the triplet margin, epoch after epoch while the
    training loss creeps down: every embedding one point. A held-out loss held at digits of its
    own is a logger repeating its last evaluation, no bound."""
    epochs = "".join(
        f"Epoch {e}/15\n1539/1539 [==============================] - 3427s 2s/step - loss: {x} - "
        f"val_loss: {held}\n"
        for e, x in enumerate(("0.1902", "0.1872", "0.1844", "0.1820", "0.1794", "0.1777"), 2)
    )
    zero = findings_of(tmp_path, epochs).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert zero.evidence["key"] == "val_loss" and "round value" in zero.message


def test_an_accuracy_fallen_from_learned_to_zero_is_zero_grad_unless_the_loss_went_nan(
    tmp_path: Path,
) -> None:
    """CnOCR#46: MXNet's Speedometer, ``accuracy=0.96`` batch after batch, then 0.4258, then
    0.000000 to the end, no loss logged; where the loss beside the zeros is NaN, ``nonfinite`` says
    why and the accuracy adds nothing."""
    line = "Epoch[0] Batch [{0}-{1}]\tSpeed: 336.10 samples/sec\taccuracy={2}\n"
    values = ("0.964531", "0.963750", "0.968594", "0.425781", "0.000000", "0.000000", "0.000000")
    text = "".join(line.format(10350 + 50 * i, 10400 + 50 * i, v) for i, v in enumerate(values))
    zero = findings_of(tmp_path, text)["zero_grad"]
    assert zero.step == 10600 and zero.evidence["key"] == "accuracy"
    keras = "".join(
        f"Epoch {e}/5\n100/100 [==============================] - 2s - loss: {x} - acc: {a}\n"
        for e, (x, a) in enumerate(
            (("0.6242", "0.6295"), ("nan", "0.0000"), ("nan", "0.0000"), ("nan", "0.0000"))
        )
    )
    assert "zero_grad" not in findings_of(tmp_path, keras)


def test_a_top_1_accuracy_at_one_in_k_beside_a_top_5_at_five_in_k_is_a_guess(tmp_path: Path) -> None:
    """FixMatch-pytorch#54: one evaluation, ``top-1 acc: 10.00`` and ``top-5 acc: 50.00`` behind
    Python's logging (HF's ``%m/%d/%Y`` date): two numbers naming the uniform guess among 10
    classes; a top-1 at 10.00 beside a top-5 of 61.20 is one record of a model that may yet learn."""
    line = "09/02/2024 16:49:42 - INFO - __main__ -   {0}: {1}\n"
    guess = line.format("top-1 acc", "10.00") + line.format("top-5 acc", "50.00")
    zero = findings_of(tmp_path, guess)["zero_grad"]
    assert zero.evidence["classes"] == 10 and "top-5 acc is 5/10" in zero.message
    learning = line.format("top-1 acc", "10.00") + line.format("top-5 acc", "61.20")
    assert "zero_grad" not in findings_of(tmp_path, learning)


def test_paddles_and_apexs_overflow_lines_leave_the_last_scale_they_name(tmp_path: Path) -> None:
    """PaddleOCR#10365: Paddle's AMP scaler, ``Found inf or nan, current scale is: 0.001953125,
    decrease to: 0.001953125*0.5`` three times after a record; CVPR2021_PLOP#15: apex's ``reducing
    loss scale to 1.0``, then to 0.5, before one record. The scale is the last one named, below 1:
    an error."""
    paddle = (
        "[2023/07/12 16:23:54] ppocr INFO: epoch: [1/500], global_step: 80, lr: 0.000007, loss: 18.245018\n"
        + "".join(
            f"Found inf or nan, current scale is: {s}, decrease to: {s}*0.5\n"
            for s in ("0.001953125", "0.0009765625", "0.00048828125")
        )
    )
    overflow = findings_of(tmp_path, paddle)["overflow"]
    assert overflow.severity == "error" and overflow.evidence["lowest_scale"] == 0.000244140625
    # a record line as long as the one before reads as wrapped at that width: a warning is no piece of it
    path = tmp_path / "paddle.log"
    path.write_text(paddle + paddle.splitlines(keepends=True)[0].replace("step: 80", "step: 90"))
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [80, 90] and "current scale" not in steps[0]
    apex = (
        "".join(
            f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {s}\n"
            for s in ("1.0", "0.5")
        )
        + "INFO:rank0: Epoch 28, Batch 10/22, Loss=4.541375775728374\n"
    )
    assert findings_of(tmp_path, apex)["overflow"].evidence["lowest_scale"] == 0.5


def test_a_flows_bits_per_dim_is_its_loss_and_a_test_loss_keeps_its_split(tmp_path: Path) -> None:
    """survae_flows: ``Training. Epoch: 1/10, Datapoint: 320/50000, Bits/dim: 1161562190115273424502784.000``
    after 8.7 (the loss itself, far past any healthy value); flows_ood: ``train loss 10171.217 bpd
    4.777 test loss 552956.313 bpd 259.683``, the test loss its own, not a second ``loss``."""
    line = "Training. Epoch: 1/10, Datapoint: {0}/50000, Bits/dim: {1}\n"
    values = ("9.041", "8.964", "8.857", "1161562190115273424502784.000")
    found = findings_of(tmp_path, "".join(line.format(64 * (i + 1), v) for i, v in enumerate(values)))
    assert found["loss_divergence"].severity == "error"
    path = tmp_path / "flow.log"
    path.write_text("Epoch 0 train loss 10171.217 bpd 4.777 test loss 552956.313 bpd 259.683\n")
    step = read_log(path).steps[0]
    assert step[S.ACTOR_LOSS] == 10171.217 and step["test loss"] == 552956.313


def test_a_loss_held_to_its_last_digit_after_a_small_climb_is_zero_grad(tmp_path: Path) -> None:
    """Pokemon-Generator: a VAE's ``loss: 335.504883`` at epoch 1, then 335.553253, 335.553284 and
    335.553345 to the end, epoch after epoch: not held within the spread from its start, and not a
    climb either, held to the last digit."""
    values = ("335.504883", "335.553253", "335.553284", *["335.553345"] * 6)
    text = "".join(f"Epoch: {200 * i or 1:04d}   loss: {v}\n" for i, v in enumerate(values))
    zero = findings_of(tmp_path, text)["zero_grad"]
    assert zero.step == 600 and "exactly 335.553345" in zero.message


def test_a_gan_whose_every_loss_holds_its_value_is_zero_grad(tmp_path: Path) -> None:
    """Social GAN#63: ``t = 71 / 4200`` then ``[D] D_data_loss: 1.386`` and ``[G] G_discriminator_loss:
    0.693`` behind the logger's ``[INFO: train.py:  280]:`` at every report (the file and line no
    metric); a GAN at its balance swings about those values, and is no finding."""

    def text(d: list[str], g: list[str]) -> str:
        return "".join(
            f"[INFO: train.py:  278]: t = {71 + 5 * i} / 4200\n"
            f"[INFO: train.py:  280]:   [D] D_data_loss: {a}\n"
            f"[INFO: train.py:  283]:   [G] G_discriminator_loss: {b}\n"
            for i, (a, b) in enumerate(zip(d, g, strict=True))
        )

    frozen = findings_of(tmp_path, text(["1.386"] * 5, ["0.693"] * 5))
    assert frozen["zero_grad"].step == 71 and "both networks" in frozen["zero_grad"].message
    path = tmp_path / "sgan.log"
    path.write_text(text(["1.386"] * 2, ["0.693"] * 2))
    assert list(read_log(path).steps[0]) == ["step", "D_data_loss", "G_discriminator_loss", "raw"]
    swinging = text(
        ["1.386", "1.391", "1.379", "1.388", "1.383"], ["0.693", "0.701", "0.688", "0.690", "0.697"]
    )
    assert "zero_grad" not in findings_of(tmp_path, swinging)


def test_a_loss_at_zero_beside_a_norm_that_never_moves_is_zero_grad(tmp_path: Path) -> None:
    """DiffusionVL#7: ``{'loss': 16.2405, 'grad_norm': 2.0, …}`` then ``'loss': 0.0`` on every record
    with the norm still 2.0: a norm that does not move while the loss goes from 16 to 0 measures no
    gradient, so the loss at 0 is judged alone."""
    line = "{{'loss': {0}, 'grad_norm': 2.0, 'learning_rate': {1}, 'epoch': 0.0}}\n"
    text = line.format(16.2405, 0.0) + "".join(line.format(0.0, 2.88e-08 * i) for i in range(1, 6))
    zero = findings_of(tmp_path, text)["zero_grad"]
    assert zero.step == 1 and zero.evidence["loss_zero"]


@pytest.mark.parametrize(
    ("start", "spread", "found"),
    [(54000, 0.012, True), (0, 0.012, False), (54000, 0.06, False)],
)
def test_a_loss_that_wanders_about_ln_k_past_the_runs_start_is_zero_grad(
    tmp_path: Path, start: int, spread: float, found: bool
) -> None:
    """DeepRobust#106: PGD training at ``Loss: 2.310779`` … ``2.288609`` batch after batch (ln 10 =
    2.3026) from 90 % into epoch 1 on; the same at the run's first records is a model yet to learn,
    and a loss that strays a quarter of the way to ln 9 or ln 11 is no guess's."""
    line = "Train Epoch: {e} [{i}/60000 ({p}%)]\tLoss: {v:.6f}\tAccuracy:{a:.2f}%\n"
    text = "".join(
        line.format(
            e=1 + (start + 2000 * k) // 60000,
            i=(start + 2000 * k) % 60000,
            p=(start + 2000 * k) % 60000 * 100 // 60000,
            v=math.log(10) + spread * math.sin(1.7 * k),
            a=10.5 + 0.03 * (k % 4),  # an accuracy held to its last digit would be one class's
        )
        for k in range(16)
    )
    zero = findings_of(tmp_path, text).get("zero_grad")
    assert (zero is not None) == found
    if found:
        assert zero.evidence["classes"] == 10


def test_an_evaluation_score_alone_gone_nan_is_a_warning(tmp_path: Path) -> None:
    """PaddleSeg: ``[EVAL] #Images: 200 mIoU: 0.5000 Acc: 1.0000 Kappa: nan`` beside a finite training
    loss: Cohen's kappa of predictions all of one class is 0/0, which says what the model predicts,
    not that its updates broke; a loss gone NaN stays an error."""
    text = (
        "[TRAIN] epoch: 7, iter: 1300/90000, loss: 0.1503, lr: 0.001296\n"
        "[EVAL] #Images: 200 mIoU: 0.5000 Acc: 1.0000 Kappa: nan\n"
        "[TRAIN] epoch: 8, iter: 1400/90000, loss: {0}, lr: 0.001265\n"
    )
    undefined = findings_of(tmp_path, text.format("0.1503"))["nonfinite"]
    assert undefined.severity == "warning" and undefined.evidence["evaluation_only"]
    assert findings_of(tmp_path, text.format("nan"))["nonfinite"].severity == "error"


def test_a_learning_rate_printed_0_after_one_already_vanished_is_zero_grad(tmp_path: Path) -> None:
    """ParlAI (PR 2547): Adafactor's relative step drives the rate to ``1.565e-31``, then the table
    prints ``0``, its ``gnorm`` and ``lr`` columns one space apart; its ``total_train_updates`` is
    the step. A coarse ``0`` alone may be a small rate rounded."""
    block = (
        "[ time:37.0s total_exs:25222 epochs:2.8 time_left:30.0s ]\n"
        "    clip  exs  gnorm        lr  mean_loss  total_train_updates  tpb  updates\n"
        "       1   22  {g} {lr}      {x}                   {n}    1       22\n\n"
    )
    rows = (("404.1", "1.565e-31", "7.839"), ("419.0", "0", "7.894"), ("400.0", "0", "6.12"))
    text = "".join(block.format(g=g, lr=lr, x=x, n=22 * (i + 1)) for i, (g, lr, x) in enumerate(rows))
    zero = findings_of(tmp_path, text)["zero_grad"]
    assert zero.step == 22 and zero.evidence["key"] == S.LR
    coarse = "".join(block.format(g=g, lr="0", x=x, n=22 * (i + 1)) for i, (g, _, x) in enumerate(rows))
    assert "zero_grad" not in findings_of(tmp_path, coarse)


def test_a_short_paste_whose_loss_doubles_from_its_best_as_its_accuracy_halves_diverges(
    tmp_path: Path,
) -> None:
    """keras#7603: a CIFAR-10 CNN at ``loss: 0.8906 - acc: 0.6864`` in epoch 16, ``1.5519 - acc:
    0.4880`` in epoch 380 and ``1.8483 - acc: 0.3402`` in epoch 800: the last record against the
    best, not the one before it."""
    line = "Epoch {0}/800\n1562/1562 [==============================] - 49s - loss: {1} - acc: {2}\n"
    rows = (
        (15, "0.9050", "0.6827"),
        (16, "0.8906", "0.6864"),
        (380, "1.5519", "0.4880"),
        (381, "1.5416", "0.4897"),
    )
    text = "".join(line.format(*row) for row in rows)
    assert "loss_divergence" not in findings_of(tmp_path, text)
    worse = findings_of(tmp_path, text + line.format(800, "1.8483", "0.3402"))["loss_divergence"]
    assert worse.step == 800 * 1562 and "from 0.891 to 1.85" in worse.message


def test_rllibs_results_with_no_episode_finished_are_no_signal(tmp_path: Path) -> None:
    """ray#10416: RLlib's result printed as YAML, ``episode_reward_mean: .nan`` beside
    ``episodes_total: 0``: no episode ever finished (an environment that never says done), so
    nothing is scored; YAML's ``.nan`` is a NaN."""
    text = "episode_len_mean: .nan\nepisode_reward_mean: .nan\nepisodes_this_iter: 0\nepisodes_total: 0\n"
    found = findings_of(tmp_path, text)
    assert found["no_signal"].evidence["key"] == "episodes_this_iter"
    assert found["nonfinite"].evidence["rewards_only"]
    finished = text.replace(
        "episodes_this_iter: 0\nepisodes_total: 0", "episodes_this_iter: 3\nepisodes_total: 3"
    )
    assert "no_signal" not in findings_of(tmp_path, finished)


@pytest.mark.parametrize(
    ("entropies", "found"), [(("0.0051370724", "2.776626e-09"), True), (("0.66", "0.0"), False)]
)
def test_a_policy_entropy_near_zero_is_a_collapse_but_one_of_exactly_zero_is_not_judged(
    tmp_path: Path, entropies: tuple[str, str], found: bool
) -> None:
    """RLTrader#130: stable-baselines' PPO2 table, ``policy_entropy`` 0.0051 then 2.8e-09 beside
    ``approxkl`` 0: one action every time; an entropy of exactly 0 is a statistic of no sample.
    ``explained_variance | nan`` (every return the same) is a warning, not a broken update."""
    table = (
        "--------------------------------------\n| approxkl           | 0.0           |\n"
        "| explained_variance | {ev}           |\n| nupdates           | {n}            |\n"
        "| policy_entropy     | {e}  |\n| policy_loss        | 7.4659073e-07 |\n"
        "--------------------------------------\n"
    )
    text = "".join(table.format(ev="nan", n=16 + k, e=e) for k, e in enumerate(entropies))
    result = findings_of(tmp_path, text)
    assert ("entropy_collapse" in result) is found
    assert result["nonfinite"].severity == "warning" and result["nonfinite"].evidence["evaluation_only"]


def test_every_score_held_leaves_out_one_the_last_record_has_not_printed_yet(tmp_path: Path) -> None:
    """DeepLung: ``ep 136 tracc 0.560175054705 lr 0.1 gbtacc 0.890590809628`` and the same epoch after
    epoch, its ``teacc`` line not yet printed for the last epoch: the held scores are read (names
    glued to their split, ``tracc``, are accuracies)."""
    text = "".join(
        f"INFO:root:ep {e} tracc 0.560175054705 lr 0.1 gbtacc 0.890590809628\n"
        + ("INFO:root:teacc 46.6666666667 bestacc 57.7777777778\n" if e < 140 else "")
        for e in range(136, 141)
    )
    zero = findings_of(tmp_path, text)["zero_grad"]
    assert zero.step == 136 and "tracc" in zero.message


def test_an_accuracy_that_collapses_on_one_record_is_zero_grad(tmp_path: Path) -> None:
    """A BERT tagger's ``val_acc=99.718%`` in epoch 7 and ``val_acc=0.030%`` in epoch 8: every token
    one class (a percentage's series read as one); a fall to half is no collapse."""
    line = "Epoch {0}/10: 150.57s/it, val_acc={1}% (53391/53542), val_f1={2}%\n"
    collapsed = line.format(7, "99.718", "71.366") + line.format(8, "0.030", "0.060")
    assert findings_of(tmp_path, collapsed)["zero_grad"].step == 8
    assert "zero_grad" not in findings_of(
        tmp_path, line.format(7, "99.718", "71.366") + line.format(8, "49.0", "30.1")
    )


def test_a_loss_at_ln_10_under_epoch_and_batch_counts_is_a_guess(tmp_path: Path) -> None:
    """A BERT run_classifier's fp16 bug: ``Epoch 1 - Batch 1600/287417 - Training Acc. 0.106250 -
    Training Loss 2.295977`` and on, the batch the step: past the run's start, at ln 10."""
    text = "".join(
        f"Epoch 1 - Batch {1600 * k}/287417 - Training Acc. 0.09{k % 10} - "
        f"Training Loss {2.3026 + 0.005 * math.sin(k):.6f}\n"
        for k in range(1, 13)
    )
    zero = findings_of(tmp_path, text)["zero_grad"]
    assert zero.step == 1600 and zero.evidence["classes"] == 10


def test_a_success_rate_said_to_be_0_on_every_epoch_is_no_signal(tmp_path: Path) -> None:
    """DDPG with HER on FetchPush: ``epoch is: 1, eval success rate is: 0.000`` epoch after epoch
    (the sentence's ``is`` no part of the names): no episode reached its goal; one success in
    the run is a signal."""
    line = "[2021-02-08 11:06:21.069528] epoch is: {0}, eval success rate is: {1}\n"
    never = "".join(line.format(e, "0.000") for e in range(1, 7))
    found = findings_of(tmp_path, never)["no_signal"]
    assert found.evidence["key"] == "eval success rate" and found.step == 1
    once = "".join(line.format(e, "0.100" if e == 4 else "0.000") for e in range(1, 7))
    assert "no_signal" not in findings_of(tmp_path, once)


def test_a_critics_loss_that_runs_away_while_the_reward_holds_diverges(tmp_path: Path) -> None:
    """mbrl-lib#137: MBPO's SAC on Humanoid, ``CLOSS`` climbing a millionfold while its batch and
    episode rewards hold (the Q-values feed on their own targets); a critic's loss that climbs with
    its reward is learning."""
    line = "| train | E: {0} | S: {0}000 | R: {1:.1f} | BR: {2:.4f} | ALOSS: {3:.4f} | CLOSS: {4:.4f} |\n"
    closs = [1.91, 5.2, 140.8, 6120.0, 198400.0, 2.3e6]
    held = "".join(
        line.format(k, 120.0 + k, 3.51 + 0.001 * k, -5.0 * 3**k, c) for k, c in enumerate(closs, 1)
    )
    found = findings_of(tmp_path, held)["loss_divergence"]
    assert found.step == 2000 and found.evidence["key"] == "critic_loss"
    rising = "".join(line.format(k, 30.0 * 4**k, 0.3 * 4**k, -5.0 * 3**k, c) for k, c in enumerate(closs, 1))
    assert "loss_divergence" not in findings_of(tmp_path, rising)


def test_episodes_that_never_end_are_no_signal_by_a_sentence_or_a_nan_length(tmp_path: Path) -> None:
    """AnimalAI-Olympics#4 (ML-Agents' ``No episode was completed since last summary``, summary after
    summary) and MARLlib#239 (Tune's table, ``episode_len_mean`` and ``reward`` NaN)."""
    said = "".join(
        f"INFO:mlagents.trainers: run-0: Learner: Step: {k}000. No episode was completed since last summary. "
        "Training.\n"
        for k in range(1, 4)
    )
    assert findings_of(tmp_path, said)["no_signal"].step == 1000
    table = (
        "| Trial name          | status   | loc           |   iter |   reward |   episode_len_mean |\n"
        "|---------------------+----------+---------------+--------+----------+--------------------|\n"
        "| PPO_env_1a2b3_00000 | RUNNING  | 10.0.0.7:4242 |      1 |      nan |                {0} |\n"
    )
    found = findings_of(tmp_path, table.format("nan"))
    assert found["no_signal"].evidence["key"] == "episode_len_mean"
    assert found["nonfinite"].severity == "warning"
    assert "no_signal" not in findings_of(tmp_path, table.format("88.1"))


def test_a_loss_of_exactly_zero_beside_an_accuracy_short_of_one_is_zero_grad(tmp_path: Path) -> None:
    """farizrahman4u/seq2seq#189: Keras's ``val_loss: 0.0000e+00`` beside ``val_acc: 0.3672``, then
    ``loss: 0.0000e+00`` beside ``acc: 0.3610``: no loss of the predictions. A loss of 0 beside an
    accuracy of 1 is a task learned."""
    line = "{n}/{n} [=======] - 700s - loss: {0} - acc: {1} - val_loss: {2} - val_acc: {3}\n"
    rows = [("1.4557", "0.5114", "1.4287", "0.5372"), ("0.6278", "0.4339", "0.0000e+00", "0.3672")]
    text = "".join(f"Epoch {e}/100\n" + line.format(*r, n=20455) for e, r in enumerate(rows, 3))
    zero = findings_of(tmp_path, text)["zero_grad"]
    assert (
        zero.evidence["key"] == "val_loss" and zero.step == 4 * 20455
    )  # epoch 4 ends, its bar counted on across epochs
    learned = text.replace("0.3672", "1.0000")
    assert "zero_grad" not in findings_of(tmp_path, learned)


def test_a_jump_to_the_softmax_clamp_diverges_on_two_records(tmp_path: Path) -> None:
    """video-caffe#11: the test loss 3.31, then 87.3366 (-ln FLT_MIN, averaged over batches) with
    the top-1 accuracy fallen: read by neither rule before (a jump to the clamp was left to the
    divergence rule, which needs three records)."""
    block = (
        "Iteration {0}, Testing net (#0)\nTest net output #0: accuracy/top-1 = {1}\n"
        "Test net output #1: loss = {2} (* 1 = {2} loss)\n"
    )
    text = block.format(8000, "0.31", "2.91004") + block.format(9000, "0.004", "87.3366")
    found = findings_of(tmp_path, text)["loss_divergence"]
    assert found.step == 9000 and found.severity == "error"


@pytest.mark.parametrize(
    ("tail", "found"), [((-61.2, -88.0, -97.5, -120.4), True), ((-61.2, -8.0, 1.5, 9.3), False)]
)
def test_a_negative_reward_that_falls_fivefold_and_stays_there_collapses(
    tmp_path: Path, tail: tuple[float, ...], found: bool
) -> None:
    """mbrl-lib#97: MBPO's episode reward, -0.85 at first, falling to -180 (a CSV logger's rows);
    a dip below zero that the log sees recover is exploration."""
    rewards = (-0.91, -0.77, -0.83, -0.95, -0.8, -3.4, -7.1, -19.9, -35.0, -50.2, *tail)
    text = "env_step,episode_reward,step\n" + "".join(
        f"{999 + 1000 * i},{r},{i + 1}\n" for i, r in enumerate(rewards)
    )
    assert ("reward_collapse" in findings_of(tmp_path, text, "log.csv")) is found


def test_a_loss_at_ln_k_on_two_records_past_the_start_beside_a_guessing_accuracy_is_zero_grad(
    tmp_path: Path,
) -> None:
    """A Keras Tuner trial on MNIST (ey's autokeras thread): ``loss: 2.3015 - accuracy: 0.1122`` in
    both epochs of 1875 steps, the most frequent digit's share; an accuracy that learned is not."""
    line = "1875/1875 [==============================] - 80s 43ms/step - loss: {0} - accuracy: {1}\n"
    text = "".join(
        f"Epoch {e}/2\n" + line.format(loss, acc)
        for e, (loss, acc) in enumerate([("2.3016", "0.1119"), ("2.3014", "0.1123")], 1)
    )
    assert findings_of(tmp_path, text)["zero_grad"].evidence["classes"] == 10
    assert "zero_grad" not in findings_of(tmp_path, text.replace("0.1123", "0.9123"))


def test_a_training_and_a_held_out_loss_that_leap_together_diverge_on_two_records(tmp_path: Path) -> None:
    """braindecode#4: ``train_loss 0.10569`` and ``valid_loss 0.15377`` in epoch 0, 19.9 and 19.8 in
    epoch 1, one metric a line; the training loss alone leaping is no verdict on two records."""
    line = "2017-10-19 10:41:27,791 INFO : {0:<24}{1:.5f}\n"
    text = "".join(
        line.format("train_loss", t) + line.format("valid_loss", v)
        for t, v in ((0.10412, 0.15266), (18.4511, 18.9032))
    )
    assert findings_of(tmp_path, text)["loss_divergence"].step == 1
    assert "loss_divergence" not in findings_of(tmp_path, text.replace("18.9032", "0.16011"))


def test_a_reward_held_at_a_floor_with_no_spread_on_three_summaries_is_no_signal(tmp_path: Path) -> None:
    """ml-agents#1877: ``Mean Reward: -5.000. Std of Reward: 0.000`` summary after summary (a car
    that never moves forward); one episode a summary, its mean moving, is a healthy run."""
    line = (
        "INFO:mlagents.trainers: race-0: Brain: Step: {0}. Mean Reward: {1}. Std of Reward: 0.000. Training\n"
    )
    held = "".join(line.format(1000 * k, "-5.000") for k in range(21, 25))
    assert findings_of(tmp_path, held)["no_signal"].step == 21000
    moving = "".join(line.format(1000 * k, f"{-41.1 + 3.5 * k:.3f}") for k in range(21, 25))
    assert "no_signal" not in findings_of(tmp_path, moving)


def test_an_accuracy_held_at_a_small_share_for_ten_epochs_is_one_class(tmp_path: Path) -> None:
    """mlx#188: MLX's MNIST example at a learning rate of 0.1, ``Epoch N: Test accuracy 0.113`` ten
    epochs running, the share of its most frequent digit (no 1/K: classes are not balanced); nine
    epochs, or a share above a fifth, are no verdict."""
    line = "Epoch {0}: Test accuracy {1}\n"
    held = "".join(line.format(e, "0.113") for e in range(10))
    assert findings_of(tmp_path, held)["zero_grad"].evidence["key"] == "Test accuracy"
    assert "zero_grad" not in findings_of(tmp_path, "".join(line.format(e, "0.113") for e in range(9)))
    assert "zero_grad" not in findings_of(tmp_path, held.replace("0.113", "0.413"))


def test_scaledadams_norm_quartiles_and_scaled_steps_show_a_spike(tmp_path: Path) -> None:
    """ZipVoice#49: icefall's ScaledAdam warnings alone, the quartiles of its recent gradient norms
    (the largest 49 times the median), or a step it scaled by 0.073 (a norm 14 times the threshold,
    27 times the median); quartiles whose largest is twice the median, and a step scaled by 0.4 (a
    norm five times the median), are a healthy run's clipping."""
    head = "2025-07-16 15:27:26,157 WARNING [optim.py:{0}] (0/2) "
    quartiles = "Clipping_scale=2.0, grad-norm quartiles 2.485e-02 3.150e-02 3.570e-02 4.058e-02 {0}, "
    quartiles += "threshold=7.139e-02, percent-clipped=10.0\n"
    scaled = "Scaling gradients by {0}, model_norm_threshold=0.0713903084397316\n"
    text = head.format(600) + quartiles.format("1.745e+00")
    found = findings_of(tmp_path, text)["grad_spike"]
    assert found.evidence["baseline"] == 0.0357 and found.evidence["value"] == 1.745
    healthy = head.format(600) + quartiles.format("7.100e-02")
    assert "grad_spike" not in findings_of(tmp_path, healthy)
    later = healthy + head.format(616) + scaled.format("0.4")
    assert "grad_spike" not in findings_of(tmp_path, later)
    found = findings_of(tmp_path, later.replace("by 0.4,", "by 0.07326850295066833,"))["grad_spike"]
    assert found.step == 1 and round(found.evidence["value"], 3) == 0.974
    # a factor of 0: the optimizer zeroed a gradient whose norm was NaN or Inf; a NaN's fill is a NaN
    assert findings_of(tmp_path, later.replace("by 0.4,", "by 0.0,"))["nonfinite"].step == 1
    assert findings_of(tmp_path, later.replace("by 0.4,", "by nan07,"))["nonfinite"].step == 1
