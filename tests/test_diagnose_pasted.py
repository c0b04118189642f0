"""The pasted-excerpt corpus: every file of ``tests/data/logs/pasted`` read and diagnosed as a user
would paste it, against what its source thread concluded (``tests/data/logs/SOURCES.md``); healthy
runs raise no error-severity finding; bad input is one sentence or findings, never a traceback."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from moescope import schema as S
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import read_log
from moescope.cli import main

LOGS = Path(__file__).parent / "data" / "logs"
PASTED = LOGS / "pasted"

# file → the finding types it must raise at warning or error (empty: a healthy control)
EXPECTED: dict[str, set[str]] = {
    "xtuner_grad_norm_nan.log": {"nonfinite"},
    "xtuner_healthy_epochs.log": set(),
    "homemade_epoch_loop.log": {"nonfinite"},
    "megatron_lbl_recompute.log": set(),
    "megatron_lbl_healthy.log": set(),
    "megatron_iteration_healthy.log": set(),
    "torchtitan_topk_print.log": {"load_collapse"},
    "topk_print_healthy.log": set(),
    "dschat_step3_inf.log": {"nonfinite"},
    "dschat_reward_flat.log": set(),
    "nemo2_reduced_loss_nan.log": {"nonfinite"},
    "nemo2_healthy.log": set(),
    "torchtune_healthy.log": set(),
    "automodel_steps_nan.log": {"nonfinite"},
    "automodel_dead_experts.log": {"load_collapse"},
    "llamafactory_console_nan.log": {"nonfinite"},
    "llamafactory_trainer_log.jsonl": set(),
    "hf_train_runtime.log": set(),
    "trl_wrapped_sampling.log": {"rollout_mismatch"},
    "verl_ranks_and_prose.log": {"nonfinite"},
    "verl_one_line_dead.log": {"no_signal"},
    "verl_rollout_corr.log": {"rollout_mismatch"},
    "wandb_run_summary.log": {"no_signal"},
    "two_runs_pasted.log": set(),
    "nemo_rl_gen_kl.log": {"rollout_mismatch"},
    "areal_stats_table.log": {"rollout_mismatch"},
    "roll_metrics_tag.log": {"nonfinite"},
    "tqdm_postfix_healthy.log": set(),
    "tinker_moe_watch.log": {"load_collapse"},
    "trl_notebook_table_kl_nan.log": {"nonfinite"},
    "swift_console_dead_groups.log": {"no_signal"},
    "verl_warn_only.log": {"nonfinite"},
    "openrlhf_vllm_kl.log": {"rollout_mismatch"},
    "swift_bare_dict_zero_grad.log": {"zero_grad"},
    "megatron_fp16_calibration.log": set(),
    "mmocr_amp_skipped_step.log": set(),
    "mlagents_summary_healthy.log": set(),
    "charrnn_counter_healthy.log": set(),
    "llmc_loss_nan_aside.log": {"nonfinite"},
    "dreamer_bracket_steps.log": {"nonfinite", "loss_divergence"},  # image_loss 6.1e+30: blown up too
    "verl_pairs_one_a_line.log": set(),
    "cjk_fullwidth_loop.log": set(),
    "json_indented_metrics.log": set(),
    "lightning_bar_restart.log": set(),
    "megatron_bf16_loss_dropped.log": {"nonfinite"},
    "epoch_loop_loss_nan.log": {"nonfinite"},
    "rslrl_iteration_blocks.log": {"nonfinite"},
    "trl_dict_over_lines.log": {"no_signal"},
    "deepspeed_overflow_settling.log": set(),
    "deepspeed_overflow_at_floor.log": {"overflow"},
    "swift_cut_record_grad_nan.log": {"nonfinite"},
    "trl_grpo_cut_dead_record.log": {"no_signal"},
    "litgpt_iter_step_loss_jump.log": {"loss_divergence"},
    "dschat_overflow_floor_then_nan.log": {"nonfinite", "overflow"},
    "baselines_ppo_table_kl_jump.log": {"kl_blowup"},
    "baselines_ppo_table_healthy.log": set(),
    "mlx_lm_grpo_dead.log": {"no_signal"},
    "mlx_lm_grpo_healthy.log": set(),
    "imagenet_progress_loss_nan.log": {"nonfinite"},
    "llamafactory_sft_loss_zero.log": {"zero_grad"},
    "detectron2_loss_nan_at_iteration.log": {"nonfinite"},
    "fairseq_overflow_to_minimum_scale.log": {"overflow"},
    "fairseq_overflow_notes_healthy.log": set(),
    "seqtagging_train_loss_nan_trailer.log": {"nonfinite"},
    "torchforge_kl_divergence_snapshot.log": {"kl_blowup"},
    "torchforge_kl_snapshot_healthy.log": set(),
    "mmdet_grad_norm_millions.log": {"grad_spike"},
    "modded_llama_pipe_rows_healthy.log": set(),
    "modded_llama_pipe_rows_nan.log": {"nonfinite"},
    "deepspeed_bar_scale_minimum_exit.log": {"overflow"},
    "caffe_loss_saturated_87.log": {"loss_divergence"},
    "hand4whole_epoch_itr_loss_nan.log": {"nonfinite"},
    "vmamba_train_brackets_healthy.log": set(),
    "hf_bar_dict_between_overflows.log": {"overflow"},
    "yolov3_giou_loss_nan.log": {"nonfinite"},
    "tf_garden_controller_output_dict_healthy.log": set(),
    "rllm_verl_scores_zero.log": {"no_signal"},
    "videor1_dict_rewards_zero.log": {"no_signal"},
    "trl_grpo_zero_std_zero_grad.log": {"no_signal"},
    "mlagents_mean_reward_series_collapse.log": {"reward_collapse"},
    "mlagents_mean_reward_series_healthy.log": set(),
    "mlagents_mean_reward_peak_lost.log": {"reward_collapse"},
    "mlagents_mean_reward_peak_halved_healthy.log": set(),
    "coursia_episode_rows_reward_decline.log": set(),
    "trlx_ppo_bars_ds_overflow.log": {"overflow"},  # read; a 39 % fall is under reward_collapse's bar
    "ds_bar_overflow_scale_one.log": {"overflow"},
    "ds_bar_overflow_warmup_healthy.log": set(),
    "keras_old_epoch_loss_diverges.log": {"loss_divergence"},
    "keras_old_epoch_healthy.log": set(),
    "tensor_print_loss_nan.log": {"nonfinite"},
    "accelerate_bar_loss_nan_repeats.log": {"nonfinite"},
    "tqdm_epoch_summary_loss_nan.log": {"nonfinite"},
    "minfm_spike_guard_skips.log": {"grad_spike"},
    "neuraltalk_cost_exploding.log": {"loss_divergence"},
    "tqdm_epoch_summary_healthy.log": set(),
    "ppo_beginners_iteration_nan.log": {"nonfinite"},
    "ppo_beginners_iteration_healthy.log": set(),
    "nemo_gpt_bar_global_step_nan.log": {"nonfinite"},
    "nemo_gpt_bar_global_step_healthy.log": set(),
    "rlkit_sac_tabular_qf_loss_inf.log": {"nonfinite"},
    "rlkit_sac_tabular_healthy.log": set(),
    "rlkit_sac_tabular_snapshot_qf_loss_1e19.log": {"loss_divergence"},
    "rlkit_sac_tabular_snapshot_large_q_healthy.log": set(),
}
# file → (finding, the step its thread puts the onset at): where the log says it
ONSET: dict[str, tuple[str, int]] = {
    "llmc_loss_nan_aside.log": ("nonfinite", 97),
    "dreamer_bracket_steps.log": ("nonfinite", 21000),
    "mmocr_amp_skipped_step.log": ("nonfinite", 50),
    "swift_bare_dict_zero_grad.log": ("zero_grad", 6),
    "megatron_bf16_loss_dropped.log": ("nonfinite", 14),
    "epoch_loop_loss_nan.log": ("nonfinite", 1208),
    "rslrl_iteration_blocks.log": ("nonfinite", 5121),
    "swift_cut_record_grad_nan.log": ("nonfinite", 2),
    "trl_grpo_cut_dead_record.log": ("no_signal", 1),
    "litgpt_iter_step_loss_jump.log": ("loss_divergence", 2393),
    "dschat_overflow_floor_then_nan.log": ("overflow", 4479),
    "imagenet_progress_loss_nan.log": ("nonfinite", 2 * 1251 + 920),  # epochs from 0: Epoch: [2][ 920/1251]
    "detectron2_loss_nan_at_iteration.log": ("nonfinite", 41),
    "fairseq_overflow_to_minimum_scale.log": ("overflow", 10198),
    "seqtagging_train_loss_nan_trailer.log": ("nonfinite", 4),  # records in order from 0: the 5th
    "torchforge_kl_divergence_snapshot.log": ("kl_blowup", 0),
    "mmdet_grad_norm_millions.log": ("grad_spike", 2 * 912 + 100),  # Epoch(train) [3][100/912]
    "caffe_loss_saturated_87.log": ("loss_divergence", 50),
    "yolov3_giou_loss_nan.log": ("nonfinite", 1215),
    "hf_bar_dict_between_overflows.log": ("overflow", 282),  # the bar each overflow line is glued to
    "hand4whole_epoch_itr_loss_nan.log": ("nonfinite", 2 * 2417 + 1209),  # Epoch 2/12 itr 1209/2417
    "modded_llama_pipe_rows_nan.log": ("nonfinite", 150),  # "150 | loss nan | …"
    "mlagents_mean_reward_series_collapse.log": ("reward_collapse", 20),
    "mlagents_mean_reward_peak_lost.log": ("reward_collapse", 15),  # the first line under a fifth of ~70
    "trlx_ppo_bars_ds_overflow.log": (
        "overflow",
        1171,
    ),  # the training bar's count, not the rollout bar's  # the 21st line, counted from 0
    "ds_bar_overflow_scale_one.log": ("overflow", 212),  # the first bar an overflow is glued to
    "keras_old_epoch_loss_diverges.log": ("loss_divergence", 8),  # the bare "Epoch 8" above the jump
    "tensor_print_loss_nan.log": ("nonfinite", 3),  # after three finite prints, counted from 0
    "accelerate_bar_loss_nan_repeats.log": ("nonfinite", 34),  # not 36, the last bar showing nan
    "tqdm_epoch_summary_loss_nan.log": ("nonfinite", 4),  # "Epoch 4: 100%|…" and its summary
    "minfm_spike_guard_skips.log": ("grad_spike", 1557),  # the guard's first skip, on the step it names
    "neuraltalk_cost_exploding.log": ("loss_divergence", 255),  # the guard stopped the run there
    "ppo_beginners_iteration_nan.log": ("nonfinite", 15),  # "---- Iteration #15 ----", not the 4th block
    "nemo_gpt_bar_global_step_nan.log": ("nonfinite", 3),  # the postfix's global_step=3.000, not its count
    "rlkit_sac_tabular_qf_loss_inf.log": ("nonfinite", 41),  # the table's closing "Epoch  41" row
    "rlkit_sac_tabular_snapshot_qf_loss_1e19.log": ("loss_divergence", 212),
}
# file → the finding its evidence makes decisive on its own: error severity
DECISIVE: dict[str, str] = {
    "torchforge_kl_divergence_snapshot.log": "kl_blowup",  # a per-token KL of 2.3e+06 nats
    "mmdet_grad_norm_millions.log": "grad_spike",  # a gradient norm of 4.8e+06
    "rlkit_sac_tabular_snapshot_qf_loss_1e19.log": "loss_divergence",  # a Q-loss of 8.9e+18
    "deepspeed_bar_scale_minimum_exit.log": "overflow",  # "... already at minimum ... Exiting run."
    "caffe_loss_saturated_87.log": "loss_divergence",  # 87.3365 on every record after the jump
    "rllm_verl_scores_zero.log": "no_signal",  # every score 0 on every step: the reward never paid
    "videor1_dict_rewards_zero.log": "no_signal",  # reward 0.0, reward_std 0.0, all_wrong 1.0
    "trl_grpo_zero_std_zero_grad.log": "no_signal",  # frac_reward_zero_std 1.0 and grad_norm 0.0
    "ds_bar_overflow_scale_one.log": "overflow",  # "reducing to 1" from 1 on every step logged
    "keras_old_epoch_loss_diverges.log": "loss_divergence",  # 0.77 to 24.3 and held there
    "tqdm_epoch_summary_loss_nan.log": "nonfinite",  # "Mean Training loss : nan" two epochs running
}


def test_every_pasted_file_is_expected_and_has_its_source() -> None:
    assert {p.name for p in PASTED.iterdir()} == set(EXPECTED)
    sources = (LOGS / "SOURCES.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`pasted/([^`]+)`", sources))
    assert listed == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_excerpt_gets_the_finding_its_thread_concluded(name: str) -> None:
    findings = diagnose(read_log(PASTED / name))
    raised = {f.type for f in findings if f.severity != "info"}
    expected = EXPECTED[name]
    assert expected <= raised, (name, raised)
    if not expected:  # a healthy control: nothing of error severity
        assert not [f for f in findings if f.severity == "error"], (name, findings)
    else:  # and nothing unrelated of error severity beside what the thread found
        assert {f.type for f in findings if f.severity == "error"} <= expected, (name, findings)


@pytest.mark.parametrize("name", sorted(ONSET))
def test_each_finding_starts_where_the_log_says(name: str) -> None:
    kind, step = ONSET[name]
    assert [f.step for f in diagnose(read_log(PASTED / name)) if f.type == kind] == [step]


@pytest.mark.parametrize("name", sorted(DECISIVE))
def test_decisive_evidence_is_an_error(name: str) -> None:
    found = [f for f in diagnose(read_log(PASTED / name)) if f.type == DECISIVE[name]]
    assert [f.severity for f in found] == ["error"], (name, found)


def test_rows_that_open_with_their_step_before_a_bar_are_steps() -> None:
    """``250 | loss 4.09 | lr 3e-04 | 13707.39ms``: every row a step, not one merged record."""
    trace = read_log(PASTED / "modded_llama_pipe_rows_healthy.log")
    assert [rec["step"] for rec in trace.steps] == list(range(0, 220, 10))
    assert trace.steps[-1]["actor/loss"] < trace.steps[1]["actor/loss"]


def test_one_metric_repeated_line_after_line_is_a_series() -> None:
    """``Mean Reward: 66.3`` printed again and again with no step (ml-agents#101): each line a
    record, steps counted in order, not one snapshot whose last value wins."""
    trace = read_log(PASTED / "mlagents_mean_reward_series_collapse.log")
    assert [rec["step"] for rec in trace.steps] == list(range(25))
    assert [rec["reward/mean"] for rec in trace.steps[4:6]] == [7.392857142857143, 66.31428571428572]
    assert any("counted" in note for note in trace.notes)


def test_iteration_banners_with_a_hash_are_the_steps() -> None:
    """PPO-for-Beginners' ``-------- Iteration #12 --------`` over its ``Average Loss: …`` lines:
    each banner is its block's step, not the block's place in the paste."""
    trace = read_log(PASTED / "ppo_beginners_iteration_healthy.log")
    assert trace.header["format"] == "key-values"
    assert [rec["step"] for rec in trace.steps] == [12, 13, 14, 15, 16]
    assert trace.steps[0]["Average Loss"] == 0.00731 and trace.steps[-1]["Timesteps So Far"] == 76800


def test_a_postfix_that_logs_its_global_step_is_on_that_step() -> None:
    """NeMo's Lightning bar redraws each count with the old postfix, then the new one carrying
    ``global_step=1.000``: every logged step is one record, none merged with the next."""
    trace = read_log(PASTED / "nemo_gpt_bar_global_step_nan.log")
    assert [rec["step"] for rec in trace.steps] == list(range(6))
    assert [rec["reduced_train_loss"] for rec in trace.steps[:3]] == [10.9, 10.71, 10.38]
    assert all(math.isnan(rec["reduced_train_loss"]) for rec in trace.steps[3:])  # "nan.0"


def test_a_two_column_table_per_epoch_is_a_record_on_its_epoch() -> None:
    """rlkit's ``dump_tabular``: ``name   value`` rows between rules of dashes, names with spaces
    and slashes kept as logged (but the first Q-network's loss, read as the critic's), each table
    on the epoch its closing ``Epoch`` row names."""
    trace = read_log(PASTED / "rlkit_sac_tabular_healthy.log")
    assert trace.header["format"] == "key-values"
    assert [rec["step"] for rec in trace.steps] == [37, 38, 39, 40, 41]
    first = trace.steps[0]
    assert first[S.VF_LOSS] == 3.61204 and first["time/epoch (s)"] == 21.4
    assert first["exploration/num steps total"] == 38000 and first["trainer/Policy Loss"] == -97.4412


def test_episode_counters_before_bars_are_steps_and_asides_stay_in_names() -> None:
    """``Episode  50/500 | Reward moyen (100 ep): 24.1`` (CoursIA#2368): the episode counter is
    the step, the field keeps its name as logged, aside and all; every row read in order."""
    trace = read_log(PASTED / "coursia_episode_rows_reward_decline.log")
    assert trace.header["format"] == "records"
    rows = [(rec["step"], rec["Reward moyen (100 ep)"]) for rec in trace.steps]
    assert rows[:3] == [(50, 24.1), (100, 21.7), (150, 18.4)]
    assert [step for step, _ in rows] == list(range(50, 550, 50)) and rows[-1] == (500, 14.7)


def test_the_last_bar_of_a_line_counts_and_a_glued_overflow_joins_its_step() -> None:
    """trlx's ``[rollout 128 / 128]: 100%|…| 128/128 […]`` bar glued before the training bar
    ``[losses/…]:  18%|…| 1171/6400 […]``, then DeepSpeed's ``OVERFLOW!`` (trlx#342): the step
    is the training bar's count, the losses its description's, the overflow that step's."""
    trace = read_log(PASTED / "trlx_ppo_bars_ds_overflow.log")
    assert [rec["step"] for rec in trace.steps] == [1152, *range(1171, 1176)]
    second = trace.steps[1]
    assert (second["losses/value_loss"], second["optim/skipped"], second["optim/loss_scale"]) == (
        7.88,
        1,
        128.0,
    )
    assert "OVERFLOW!" in second["health/alerts"] and "optim/skipped" not in trace.steps[0]


def test_an_epoch_and_its_iteration_in_brackets_are_one_step() -> None:
    """Swin's ``Train: [41/300][1840/2502]``, epochs counted from 0: epoch × per-epoch + i."""
    trace = read_log(PASTED / "vmamba_train_brackets_healthy.log")
    assert [rec["step"] for rec in trace.steps] == [41 * 2502 + i for i in range(1840, 1900, 10)]


def test_a_trainer_record_among_deepspeed_overflow_lines_is_read() -> None:
    """HF's ``{'loss': …}`` between bars with DeepSpeed's overflow lines glued on: the record is
    read, each overflow on the step its bar counts."""
    trace = read_log(PASTED / "hf_bar_dict_between_overflows.log")
    assert trace.header["format"] == "trl-console"
    assert [(rec["step"], rec.get("actor/loss")) for rec in trace.steps] == [
        (282, None),
        (283, None),
        (284, 1.8734),
        (285, None),
        (286, None),
    ]


def test_a_detectors_nan_loss_is_no_policy_loss() -> None:
    """``giou_loss: nan`` in a YOLOv3 log: the message names a loss, not an RL policy's."""
    (found,) = [f for f in diagnose(read_log(PASTED / "yolov3_giou_loss_nan.log")) if f.type == "nonfinite"]
    assert " in loss (" in found.message and "policy" not in found.message


def test_a_dict_a_step_line_announces_is_that_steps_metrics() -> None:
    """``train | step: 300 | … | output:`` over a dict printed one pair a line: its step's metrics."""
    trace = read_log(PASTED / "tf_garden_controller_output_dict_healthy.log")
    assert [(rec["step"], rec.get(S.ACTOR_LOSS)) for rec in trace.steps] == [
        (300, 0.5128833),
        (320, 0.50417316),
        (340, 0.49731052),
    ]
    assert not [n for n in trace.notes if "also has" in n]  # the dicts are read, no other format's


def test_a_gradient_nan_the_run_recovers_from_is_a_warning_that_says_so() -> None:
    (found,) = diagnose(read_log(PASTED / "mmocr_amp_skipped_step.log"))
    assert (found.type, found.severity, found.evidence["recovered"]) == ("nonfinite", "warning", True)
    assert "recovered at once" in found.message


def test_megatron_intervals_of_skipped_iterations_lose_no_loss() -> None:
    """fp16 loss-scale calibration skips every iteration of the first interval: no loss to log."""
    trace = read_log(PASTED / "megatron_fp16_calibration.log")
    assert not [n for n in trace.notes if "omits a NaN" in n]
    assert [f.type for f in diagnose(trace)] == ["overflow"]


def test_overflows_that_open_a_run_and_leave_the_scale_high_are_a_note() -> None:
    """fp16's dynamic loss scale halves from its 2^16 start until it fits: no fault, but said."""
    (found,) = diagnose(read_log(PASTED / "deepspeed_overflow_settling.log"))
    assert (found.type, found.severity) == ("overflow", "info")
    assert "settling" in found.message


def test_overflows_at_the_scalers_floor_are_a_warning_even_at_scale_one() -> None:
    """``reducing loss scale from 1 to 1``: fp16 is on and each overflow now loses its update."""
    (found,) = diagnose(read_log(PASTED / "deepspeed_overflow_at_floor.log"))
    assert (found.type, found.severity) == ("overflow", "warning")
    assert found.evidence["at_floor"] and "floor" in found.message


def test_overflows_glued_to_bars_are_on_their_counts_and_one_before_joins_the_first() -> None:
    """DeepSpeed's overflow lines behind HF's bare bars, and one on a line of its own before them
    (transformers#14531): each on the count of its bar, the first on the bar after it."""
    trace = read_log(PASTED / "ds_bar_overflow_scale_one.log")
    steps = [(rec["step"], rec[S.SKIPPED]) for rec in trace.steps]
    assert steps == [(212, 2), *((n, 1) for n in range(213, 217))]


def test_the_settling_scaler_behind_bars_stays_a_note() -> None:
    """The same glued overflows while the scale falls from 65536 (transformers#9996): no error."""
    (found,) = diagnose(read_log(PASTED / "ds_bar_overflow_warmup_healthy.log"))
    assert (found.type, found.severity, found.step) == ("overflow", "info", 3)


def test_the_first_of_two_pasted_runs_is_read_on_request() -> None:
    first = diagnose(read_log(PASTED / "two_runs_pasted.log", run=0))
    assert [f.type for f in first if f.severity == "error"] == ["nonfinite"]


def test_each_of_two_pasted_runs_is_diagnosed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(PASTED / "two_runs_pasted.log")]) == 0
    out = capsys.readouterr().out
    assert "2 runs pasted one after another, each diagnosed on its own" in out
    first, second = out.split("\nrun 1: ")
    assert "run 0: 3 steps" in first and "[error] step 3 nonfinite" in first
    assert "no findings" in second and "[error]" not in second


def test_each_run_has_its_own_findings_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["diagnose", str(PASTED / "two_runs_pasted.log"), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run"] for r in runs] == [0, 1] and [r["steps"] for r in runs] == [3, 3]
    assert [[f["type"] for f in r["findings"] if f["severity"] == "error"] for r in runs] == [
        ["nonfinite"],
        [],
    ]


def test_run_n_still_diagnoses_one_run_alone(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["diagnose", str(PASTED / "two_runs_pasted.log"), "--json", "--run", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "runs" not in result and result["steps"] == 3
    assert [f["type"] for f in result["findings"] if f["severity"] == "error"] == ["nonfinite"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "is empty"),
        (bytes(range(256)) * 64, "is binary, not a text log"),
        (b"Collecting numpy\n  Downloading numpy-2.1.0.tar.gz (18.9 MB)\nSuccessfully installed\n", None),
        (
            b"GET /index.html HTTP/1.1 200 1532\nGET /favicon.ico HTTP/1.1 404 0\n",
            "no line attaches a number",
        ),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2_or_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str | None
) -> None:
    path = tmp_path / "input.log"
    path.write_bytes(content)
    code = main(["diagnose", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 2:
        assert err.count("\n") == 1 and (words is None or words in err)
    else:
        assert code == 0 and words is None and "steps" in out


MEASURE = """
import resource, sys
from moescope.cli import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = main(["diagnose", sys.argv[1]])
print(code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_a_huge_single_line_is_one_sentence_in_bounded_memory(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "one_line.log"
    with path.open("wb") as f:  # 64 MiB without a newline: a megabyte of it is read, not all
        chunk = b"x" * (1 << 20)
        for _ in range(64):
            f.write(chunk)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, check=True
    )
    code, grown_kib = (int(x) for x in done.stdout.split()[-2:])
    assert code == 2 and "Traceback" not in done.stderr
    assert grown_kib < 32 * 1024  # far below the file's 64 MiB (ru_maxrss is in KiB on Linux)
