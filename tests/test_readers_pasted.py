"""The tolerant front end: what users paste — rank labels, wrapped lines, prose, summaries, one
metric a line, home-made loops — read into steps under the one vocabulary."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from moescope import schema as S
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import keymap, read_log, read_runs, table
from moescope.analyze.readers.records import pairs
from moescope.errors import MoescopeError


def read_text(tmp_path: Path, text: str, name: str = "paste.log"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return read_log(path)


def test_mmengine_iter_lines_are_records_with_the_common_names(tmp_path: Path) -> None:
    trace = read_log(Path(__file__).parent / "data" / "logs" / "xtuner_iter.log")
    assert trace.header["format"] == "records" and trace.header["framework"] == "mmengine"
    assert [s["step"] for s in trace.steps] == [500, 510, 520, 530]
    first = trace.steps[0]
    assert (first[S.LR], first[S.ACTOR_LOSS], first[S.GRAD_NORM]) == (1.7692e-04, 0.6813, 1.2210)
    assert "eta" not in first  # a clock time is no number
    assert math.isnan(trace.steps[1][S.GRAD_NORM])


@pytest.mark.parametrize(
    ("line", "step", "values"),
    [
        ("Epoch:[1/10](100/500) loss:0.1234 lr:0.0001 grad_norm:1.23", 600, {S.ACTOR_LOSS: 0.1234}),
        (
            "10/30 22:18:02 - mmengine - INFO - Epoch(train) [2][200/735]  lr: 1.98e-04  loss: 2.75  "
            "grad_norm: 3.06",
            935,
            {S.GRAD_NORM: 3.06},
        ),
        (
            "Training epoch 0, iteration 120/149 | lr: 3e-05 | global_step: 120 | reduced_train_loss: 1.233",
            120,
            {S.ACTOR_LOSS: 1.233, S.LR: 3e-05},
        ),
        (
            "1|10|Loss: 1.2345678: 10%|█         | 10/100 [00:10<01:30,  1.0s/it]",
            10,
            {S.ACTOR_LOSS: 1.2345678},
        ),
        (" 45%|████▌     | 45/100 [01:10<01:25,  1.55s/it, loss=0.523, lr=2e-05]", 45, {S.ACTOR_LOSS: 0.523}),
        # the same bar as a notebook's text output keeps it, without the bar itself
        ("Epoch 1:  45% 45/100 [01:10<01:25,  1.55s/it, loss=0.523, v_num=3]", 45, {S.ACTOR_LOSS: 0.523}),
        ("iteration 30: load_balancing_loss: 2.120842E+00", 30, {S.AUX_LOSS: 2.120842}),
        ("2025-03-01 10:00:00 | INFO | iter 7 | gnorm=0.5 | loss=1.5", 7, {S.GRAD_NORM: 0.5}),
        ("268/446 (epoch 0), train_loss = 2.097, time/batch = 0.194", 268, {S.ACTOR_LOSS: 2.097}),
        ("episode 6264 score -73.42 average score -178.85", 6264, {S.REWARD_MEAN: -178.85, "score": -73.42}),
        ("Current loss is: 133.4565371299845, Iteration: 92", 92, {S.ACTOR_LOSS: 133.4565371299845}),
        ("[5000] expl_amount 0.3 / model_grad_norm 61.0 / value_loss 6.3", 5000, {"model_grad_norm": 61.0}),
        (
            "INFO:mlagents.trainers: PPO-0: Learner: Step: 19000. Mean Reward: -57.270. "
            "Std of Reward: 0.000. Training.",
            19000,
            {S.REWARD_MEAN: -57.27, "Std of Reward": 0.0},
        ),
        (
            "2025-06-08 16:06:06,307 - mmdet - INFO - Iter [50/84384]\tlr: 3.189e-04, eta: 1 day, 3:39:18, "
            "time: 1.181, loss_cls: 1.3917, loss: 4.1620, grad_norm: 37.2051",
            50,
            {S.ACTOR_LOSS: 4.162, S.GRAD_NORM: 37.2051},
        ),
        # keras-rl's episode line: its counter before the colon; "episode steps: 144" is no step
        (
            "  9140/50000: episode: 64, duration: 4.841s, episode steps: 144, steps per second: 30, "
            "episode reward: -225.739, loss: 16017920.000000, mean_q: -207.461914",
            9140,
            {S.ACTOR_LOSS: 16017920.0},
        ),
        # PyTorch's ImageNet ProgressMeter and DeiT / MAE's MetricLogger count epochs from 0
        (
            "Epoch: [2][ 900/1251]\tTime  0.412 ( 0.420)\tLoss 2.1843e+00 (2.2310e+00)",
            3402,
            {S.ACTOR_LOSS: 2.1843},
        ),
        (
            "Epoch: [1]  [ 10/582]  lr: 0.000002  loss: 0.6931 (0.6931)  grad_norm: 0.3857 (inf)",
            592,
            {S.GRAD_NORM: 0.3857},
        ),
        (  # WS-DAN's loop: a bar an epoch, its count starting over (read from epoch 0)
            "Epoch 85/300: 100%|██████████| 8144/8144 [1:24:14<00:00, 1.61 batches/s, Loss 6.2739]",
            86 * 8144,
            {S.ACTOR_LOSS: 6.2739},
        ),
        ("epoch:\t5\treward:\t0.978083610534668", 0, {S.REWARD_MEAN: 0.978083610534668}),  # sep="\t"
        (  # XLM's logger: the iteration after the time elapsed, a language's MLM loss by its name
            "INFO - 08/01/19 14:20:30 - 2:02:14 -    3555 -    6.83 sent/s -   260.45 words/s - "
            "MLM-en:  7.4089 -  - model LR: 1.0000e-04",
            3555,
            {"MLM-en": 7.4089, S.LR: 1e-4},
        ),
    ],
)
def test_step_markers_of_home_made_loops_and_frameworks(tmp_path: Path, line: str, step: int, values) -> None:
    trace = read_text(tmp_path, line + "\n")
    assert trace.header["format"] == "records"
    assert trace.steps[0]["step"] == step
    assert {k: trace.steps[0][k] for k in values} == values


@pytest.mark.parametrize(
    "line",
    [
        "Episode: 4 | Return: -80.337008 | Learner steps: 40 | Actor steps: 4995",  # acme
        "step = 126000: Average Return = 15.300000190734863",  # tf-agents
        "| ep_rewmean | 21.4 |",  # Stable Baselines' table row
    ],
)
def test_classic_rl_returns_are_the_mean_reward(tmp_path: Path, line: str) -> None:
    trace = read_text(tmp_path, line + "\n")
    assert isinstance(trace.steps[0][S.REWARD_MEAN], float)


def test_fairseq_s_validation_line_keeps_its_loss_apart(tmp_path: Path) -> None:
    train = "| epoch 028 | loss 3.976 | nll_loss 2.204 | num_updates 9165 | lr 0.000330319 | gnorm 0.635\n"
    valid = "| epoch 028 | valid on 'valid' subset | loss 9.329 | nll_loss 8.088 | num_updates 9165\n"
    (step,) = read_text(tmp_path, train + valid).steps
    assert (step["step"], step[S.ACTOR_LOSS], step["valid/loss"]) == (9165, 3.976, 9.329)


def test_keras_rl_intervals_count_on_as_keras_epochs_do(tmp_path: Path) -> None:
    interval = (
        "Interval {} ({} steps performed)\n10000/10000 [==============================] - 44s - reward: {}\n"
    )
    episodes = "50 episodes - episode_reward: {} [-954.513, -2.126] - loss: 3.513 - mean_q: -74.608\n\n"
    text = "Training for 1000000 steps ...\n" + "".join(
        interval.format(k, 10000 * (k - 1), r) + episodes.format(e)
        for k, r, e in ((1, -6.69, -1338.7), (2, "nan", "nan"))
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [10000, 20000]
    assert math.isnan(trace.steps[1][S.REWARD_MEAN]) and trace.steps[0][S.ACTOR_LOSS] == 3.513


def test_one_metric_a_line_of_one_step_is_one_record(tmp_path: Path) -> None:
    text = "iteration 10: lm loss: 1.2E+00\niteration 10: grad norm: 0.5\niteration 11: lm loss: 1.1E+00\n"
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [10, 11]
    assert trace.steps[0][S.GRAD_NORM] == 0.5 and not any(
        "appeared in more than one" in n for n in trace.notes
    )


def test_lines_without_a_step_count_in_order_and_prose_names_no_metric(tmp_path: Path) -> None:
    trace = read_text(tmp_path, "I got loss=0.52 grad_norm=1.1 here\nthen loss=0.49 grad_norm=nan\n")
    assert [s["step"] for s in trace.steps] == [0, 1] and math.isnan(trace.steps[1][S.GRAD_NORM])
    assert pairs("the loss is NaN at 3 pm") == {}  # prose: no metric named 'is' or 'at'
    assert pairs("loss 0.5 grad_norm 1.2") == {"loss": 0.5, "grad_norm": 1.2}


def test_lines_a_user_set_in_bold_are_read_as_written(tmp_path: Path) -> None:
    """A user pasting into an issue bolds the lines that matter (NVIDIA/tacotron2#485:
    ``**Train loss 12001 0.166141** Grad Norm 0.372761 2.51s/it``): the asterisks are no part of
    the log, and the bolded records are read as the others."""
    line = "Train loss {0} {1} Grad Norm {2} 1.78s/it"
    text = " **" + line.format(12001, 0.166141, 0.37).replace(" Grad", "** Grad") + "\n"
    text += "**" + line.format(12002, 4.972964, "inf") + "**\n" + line.format(12003, 5.318559, 29.48) + "\n"
    trace = read_text(tmp_path, text)
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [
        (12001, 0.166141),
        (12002, 4.972964),
        (12003, 5.318559),
    ]


def test_a_log_quoted_in_markdown_is_read_as_the_log(tmp_path: Path) -> None:
    """A user quotes the pasted log (``> `` on every line, nested quotes too): the YOLO table's
    header and rows were read as text, and no step was found."""
    header = "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size"
    row = "      {0}/20      8.07G      {1}      1.257      1.646         23        512: 100% 86/86 1.5it/s"
    quoted = "".join(f"> {header}\n> {row.format(e, loss)}\n>\n" for e, loss in [(13, 1.674), (14, "nan")])
    for text in (quoted, quoted.replace("> ", "> > ")):
        trace = read_text(tmp_path, text)
        assert [s["step"] for s in trace.steps] == [13, 14]
        assert [f.type for f in diagnose(trace)][:1] == ["nonfinite"]
    kept = read_text(tmp_path, "> Epoch 1 loss: 2.5\nEpoch 2 loss: 2.4\n")  # not every line quoted: as it is
    assert kept.steps[0]["raw"].startswith("> Epoch 1")


def test_rank_labels_are_removed_before_any_reader(tmp_path: Path) -> None:
    text = (
        " 0: step:1 - actor/pg_loss:0.01 - actor/grad_norm:0.4\n"
        "[rank3]: step:2 - actor/pg_loss:0.02 - actor/grad_norm:nan\n"
        "[1,0]<stdout>: step:3 - actor/pg_loss:0.02 - actor/grad_norm:0.3\n"
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "verl-console" and [s["step"] for s in trace.steps] == [1, 2, 3]


def test_a_dict_wrapped_at_a_fixed_terminal_width_is_rejoined(tmp_path: Path) -> None:
    record = (
        "{'loss': 0.0123, 'grad_norm': nan, 'learning_rate': 1e-06, 'reward': 0.44, 'reward_std': 0.31, "
        "'sampling/sampling_logp_difference/mean': 0.0412, 'sampling/importance_sampling_ratio/max': 3.25, "
        "'epoch': 0.01}"
    )
    wrapped = "\n".join(record[i : i + 80] for i in range(0, len(record), 80))
    trace = read_text(tmp_path, "some prose first: " + wrapped + "\n")
    step = trace.steps[0]
    assert (
        step[S.LOGPROB_MISMATCH] == 0.0412 and step[S.IS_RATIO_MAX] == 3.25 and math.isnan(step[S.GRAD_NORM])
    )


@pytest.mark.parametrize("date", ["2024/06/12 09:31:02", "10/30 22:18:02", "06/12"])
def test_a_date_opening_a_line_is_no_step_counter(tmp_path: Path, date: str) -> None:
    trace = read_text(tmp_path, f"{date} - INFO - step 7 - loss: 0.5\n")
    assert [s["step"] for s in trace.steps] == [7]


def test_a_dict_record_whose_braces_the_paste_lost_is_read(tmp_path: Path) -> None:
    trace = read_text(tmp_path, "'loss': -0.0, 'grad_norm': 0.0, 'global_step/max_steps': '5/3766'\n")
    assert trace.header["format"] == "trl-console"
    assert [(s["step"], s[S.GRAD_NORM]) for s in trace.steps] == [(5, 0.0)]


def test_llamafactory_s_rounded_echo_of_a_record_is_merged_into_it(tmp_path: Path) -> None:
    echo = "11:24:33 - INFO - llmtuner.callbacks - {{'loss': 0.0000, 'learning_rate': {}, 'epoch': {}}}"
    full = "{{'loss': 0.0, 'grad_norm': nan, 'learning_rate': {}, 'epoch': {}}}"
    lines = [
        echo.format("3.0000e-02", 0.01),
        full.format(0.029999871, 0.01),
        echo.format("2.9997e-02", 0.02),
        full.format(0.029996914, 0.02),
    ]
    trace = read_text(tmp_path, "\n".join(lines) + "\n")
    assert len(trace.steps) == 2 and all(math.isnan(s[S.GRAD_NORM]) for s in trace.steps)
    same_epoch = "{'loss': 0.0, 'grad_norm': 0.1, 'learning_rate': 1e-06, 'epoch': 0.01}\n"
    assert len(read_text(tmp_path, same_epoch * 2).steps) == 2  # two steps logged alike stay two


def test_a_verl_step_pasted_one_pair_a_line_is_one_record() -> None:
    (step,) = read_log(Path(__file__).parent / "data" / "logs" / "pasted" / "verl_pairs_one_a_line.log").steps
    assert (step["step"], step[S.GRAD_NORM], step[S.ENTROPY]) == (3, 98.6, 0.7915)


def test_an_aside_after_a_bare_value_is_passed_over_but_not_after_a_unit(tmp_path: Path) -> None:
    trace = read_text(tmp_path, "step 97/120 | loss     nan (+nanz)| norm 0.91 (+0.01z)| gen 2.5s (39.2%)\n")
    (step,) = trace.steps
    assert math.isnan(step[S.ACTOR_LOSS]) and step["norm"] == 0.91 and "gen" not in step


def test_a_wandb_run_summary_is_one_record_on_its_global_step() -> None:
    trace = read_log(Path(__file__).parent / "data" / "logs" / "wandb_summary.log")
    assert trace.header["format"] == "wandb-summary" and trace.header["framework"] == "trl"
    (step,) = trace.steps
    assert step["step"] == 120 and step[S.NO_SIGNAL_FRAC] == 1.0 and math.isnan(step[S.GRAD_NORM])


def test_a_wandb_summary_key_with_a_space_keeps_its_value(tmp_path: Path) -> None:
    """A loop that logs ``{"train loss": …}`` gets the key printed with its space: its training loss."""
    text = "wandb: Run summary:\nwandb:      epoch 0\nwandb:       step 458\nwandb: train loss nan\n"
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "wandb-summary"
    (step,) = trace.steps
    assert step["step"] == 458 and math.isnan(step[S.ACTOR_LOSS])
    assert read_text(tmp_path, "wandb: Tracking run with wandb version 0.12.11\n" + text).steps == trace.steps


def test_deepspeed_chat_reward_line_joins_its_step(tmp_path: Path) -> None:
    text = (
        "epoch: 0|step: 3183|ppo_ep: 1|act_loss: 30.92|cri_loss: 30.51|unsuper_loss: 0.0\n"
        "average reward score: -7.80859375\n"
        "-------------------------------------------------------------------------------------\n"
        "epoch: 0|step: 3184|ppo_ep: 1|act_loss: inf|cri_loss: inf|unsuper_loss: 0.0\n"
        "average reward score: -6.359375\n"
    )
    trace = read_text(tmp_path, text)
    assert trace.header["framework"] == "deepspeed-chat"
    last = trace.steps[-1]
    assert last["step"] == 3184 and last[S.PG_LOSS] == math.inf and last[S.REWARD_MEAN] == -6.359375


def test_an_epoch_summary_adds_to_its_step_and_never_replaces_what_the_step_logged(tmp_path: Path) -> None:
    """MetricLogger's ``Averaged stats:`` after an epoch's last step joins that step (it names
    none) but its averages must not stand in for the step's own values: a NaN loss stays."""
    text = (
        "Epoch: [0]  [20/40]  eta: 0:00:20  lr: 0.000010  loss: 2.1044 (2.2183)  time: 0.9920\n"
        "Epoch: [0]  [39/40]  eta: 0:00:00  lr: 0.000010  loss: nan (nan)  time: 0.9871\n"
        "Epoch: [0] Total time: 0:00:41 (1.0312 s / it)\n"
        "Averaged stats: lr: 0.000010  loss: 2.1901 (2.1901)  acc1: 61.25 (61.25)\n"
        "Epoch: [1]  [ 0/40]  eta: 0:01:01  lr: 0.000010  loss: 2.0100 (2.0100)  time: 1.5230\n"
    )
    last_of_epoch = read_text(tmp_path, text).steps[1]
    assert last_of_epoch["step"] == 39 and math.isnan(last_of_epoch[S.ACTOR_LOSS])
    assert last_of_epoch["acc1"] == 61.25  # what the step did not log is added


@pytest.mark.parametrize(
    ("framework", "key", "canonical"),
    [
        ("areal", "rollout_train_k3_kl", S.MISMATCH_KL),
        ("areal", "compute_logp/r3/rollout_train_k3_kl/avg", S.MISMATCH_KL),
        ("verl", "rollout_corr/rollout_is_eff_sample_size", S.IS_ESS),
        ("verl", "rollout_corr/rollout_rs_max", S.IS_RATIO_MAX),
        ("trl", "sampling/sampling_logp_difference/mean", S.LOGPROB_MISMATCH),
        ("nemo-automodel", "moe/dead_expert_frac", S.DEAD_EXPERT_FRAC),
        ("tinker", "e_max_violation", S.MAX_VIOLATION),
        ("tinker", "e_frac_with_tokens", S.USED_EXPERT_FRAC),
        ("nemo", "reduced_train_loss", S.ACTOR_LOSS),
        ("deepspeed-chat", "average reward score", S.REWARD_MEAN),
    ],
)
def test_the_listed_keys_are_mapped(framework: str, key: str, canonical: str) -> None:
    assert keymap.canonical(framework, key) == canonical


def test_prose_and_a_non_training_log_say_no_step(tmp_path: Path) -> None:
    text = "GET /index.html 200 1532\nconnected to db in 3 ms\nuser logged out\n"
    with pytest.raises(MoescopeError, match="no line attaches a number to a metric name"):
        read_text(tmp_path, text, "access.log")


def test_printed_top_k_ids_become_each_layers_expert_load(tmp_path: Path) -> None:
    trace = read_log(Path(__file__).parent / "data" / "logs" / "topk_indices.log")
    assert trace.header["format"] == "topk-indices"
    (step,) = trace.steps
    assert step[S.EXPERT_LOAD_LAYERS] == [1, 2, 3, 4] and step[S.MAX_LOAD_SHARE] == 1.0
    two_passes = "layer 0 experts: [[1, 5], [5, 7]]\nlayer 1 experts: [[2, 3], [3, 0]]\n" * 2
    trace = read_text(tmp_path, two_passes, "debug.txt")
    assert [s["step"] for s in trace.steps] == [0, 1]  # the layer numbers start over: a new pass
    assert trace.steps[0][S.EXPERT_LOAD][0][5] == 0.5


def test_two_pasted_runs_are_split_and_the_last_is_read(tmp_path: Path) -> None:
    text = (
        "step:1 - actor/pg_loss:0.01 - actor/grad_norm:0.4\n"
        "step:2 - actor/pg_loss:nan - actor/grad_norm:nan\n"
        "and the rerun with a lower lr:\n"
        "step:1 - actor/pg_loss:0.01 - actor/grad_norm:0.4\n"
        "step:2 - actor/pg_loss:0.02 - actor/grad_norm:0.3\n"
    )
    path = tmp_path / "two.log"
    path.write_text(text)
    last, first = read_log(path), read_log(path, run=0)
    assert last.steps[-1][S.GRAD_NORM] == 0.3 and math.isnan(first.steps[-1][S.GRAD_NORM])
    assert any("holds 2 runs" in n and "line 4" in n for n in last.notes)
    with pytest.raises(MoescopeError, match="holds 2 runs; pass run= from 0 to 1"):
        read_log(path, run=2)


@pytest.mark.parametrize(
    "line",
    [
        "Epoch {e}, Step {s}, Loss: {x}:   1%|          | 2/144 [00:02<02:20,  1.01it/s]",
        "epoch: {e}|step: {s}|ppo_ep: 1|act_loss: {x}|cri_loss: 0.2",  # DeepSpeed-Chat
    ],
)
def test_a_step_counted_within_its_epoch_is_counted_on_across_epochs(tmp_path: Path, line: str) -> None:
    """TRACE's loop and DeepSpeed-Chat start the step over each epoch: one run, not a run per epoch."""
    rows = [(1, s, 1.0 + s / 10) for s in range(3)] + [(2, s, 0.5 + s / 10) for s in range(2)]
    trace = read_text(tmp_path, "\n".join(line.format(e=e, s=s, x=x) for e, s, x in rows) + "\n")
    assert [s["step"] for s in trace.steps] == [0, 1, 2, 3, 4]
    assert trace.steps[3]["raw"] == line.format(e=2, s=0, x=0.5) and trace.steps[3]["epoch"] == 2
    assert any("counted on across epochs" in n for n in trace.notes)
    again = [(1, s, 1.0 + s / 10) for s in range(3)] * 2  # the same epoch pasted twice: two runs
    pasted = read_text(tmp_path, "\n".join(line.format(e=e, s=s, x=x) for e, s, x in again) + "\n")
    assert any("holds 2 runs" in n for n in pasted.notes)


def test_olmo_step_lines_take_the_metric_lines_below_them(tmp_path: Path) -> None:
    """OLMo's trainer prints ``[step=N/M,epoch=E]`` over one indented ``name=value`` line a metric
    (OLMo#692: the cross-entropy falls to 0 within three steps)."""
    record = (
        "2024-08-06 09:59:26.181 intern-studio-160750:0  olmo.train:908  INFO    [step={}/739328,epoch=0]\n"
        "    optim/total_grad_norm={}\n    train/CrossEntropyLoss={}\n    train/Perplexity=195,153\n"
        "    throughput/total_tokens=1,048,576\n"
    )
    text = (
        record.format(1, 231.7, 12.18) + record.format(2, 0.0002, 1.79e-06) + record.format(3, 7.7e-08, 0.0)
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [1, 2, 3]
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [12.18, 1.79e-06, 0.0]
    assert trace.steps[0][S.GRAD_NORM] == 231.7


def test_log_history_elements_pasted_without_their_head_are_records(tmp_path: Path) -> None:
    """open_llama#63: a ``trainer_state.json`` pasted from its fields on, each record an element of
    ``log_history`` ending in ``},``."""
    element = '    {{\n      "epoch": {},\n      "learning_rate": 0.0002,\n'
    element += '      "loss": {},\n      "step": {}\n    }},\n'
    text = '  "global_step": 750,\n  "log_history": [\n' + "".join(
        element.format(round(0.05 * k, 2), loss, 10 * k) for k, loss in enumerate([1.1005, 1.0258, 0.9423], 1)
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [10, 20, 30] and trace.steps[2][S.ACTOR_LOSS] == 0.9423


def test_numbers_a_json_logger_quoted_are_numbers(tmp_path: Path) -> None:
    """fairseq's JSON log writes every value as a string (fairseq#2613's wav2vec2 run: ``"nan"``)."""
    line = '2020-10-01 10:25:50 | INFO | train | {{"epoch": {}, "train_loss": "{}", "train_lr": "5e-05"}}\n'
    trace = read_text(tmp_path, line.format(72, "4.125") + line.format(73, "nan"))
    assert trace.steps[0]["train_loss"] == 4.125 and trace.steps[0]["train_lr"] == 5e-05
    assert math.isnan(trace.steps[1]["train_loss"])
    flat = read_text(tmp_path, '{"epoch": 1, "train_loss": "4.125", "version": "v1.2"}\n', "log.jsonl")
    assert flat.steps[0][S.ACTOR_LOSS] == 4.125 and flat.steps[0]["version"] == "v1.2"


def test_a_quoted_name_amid_plain_fields_is_read_but_a_wrapped_dict_stays_a_dict(tmp_path: Path) -> None:
    """PaddleOCR's old trainer quotes some names and not their values (PaddleOCR#1138: ``acc`` 0
    on every record); a dict a terminal wrapped has such pieces too, and stays one record."""
    line = (
        "2020-11-14 23:12:55,685-INFO: epoch: 0, iter: {}, lr: 0.001000, 'loss': {}, 'acc': 0.0, time: 57.4\n"
    )
    trace = read_text(tmp_path, line.format(2760, 18201.227) + line.format(2770, 18276.615))
    assert [(s["step"], s[S.ACTOR_LOSS], s["acc"]) for s in trace.steps] == [
        (2760, 18201.227, 0.0),
        (2770, 18276.615, 0.0),
    ]
    wrapped = "{'loss': 0.0213, 'grad_norm': 0.4471, 'completions/mean_l\nength': 612.4, 'epoch': 0.12}\n"
    dicts = read_text(tmp_path, wrapped + wrapped.replace("0.12", "0.13"))
    assert dicts.header["format"] == "trl-console" and len(dicts.steps) == 2


def test_list_numbers_before_keras_rl_lines_leave_them_records(tmp_path: Path) -> None:
    """A paste numbered as a list (``20.  43587/50000: episode: 588, …``) is no column file."""
    line = "{}.  {}/50000: episode: {}, episode reward: {}.000, loss: {}, mean_q: 37.1\n"
    text = "".join(line.format(20 + i, 43587 + 300 * i, 588 + i, 180 + i, (49 - i) / 10) for i in range(3))
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "records" and trace.steps[1][S.ACTOR_LOSS] == 4.8


def test_litgpt_fine_tuning_lines_name_their_training_loss(tmp_path: Path) -> None:
    """litgpt's ``finetune``: ``Epoch 1 | iter 2 step 0 | loss train: 6.647, val: n/a | …``."""
    line = "Epoch 1 | iter {} step {} | loss train: {}, val: n/a | iter time: 7818.10 ms\n"
    trace = read_text(tmp_path, line.format(1, 0, 2.424) + line.format(2, 0, 6.647))
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(1, 2.424), (2, 6.647)]


def test_right_aligned_values_after_their_colon_are_read(tmp_path: Path) -> None:
    """wav2letter pads each value to its column: ``loss:        inf``."""
    line = "epoch:       {} | lr: 0.100000 | runtime: 00:04:26 | loss:    {} | train-TER:  2.19\n"
    trace = read_text(tmp_path, line.format(83, "0.87373") + line.format(84, "    inf"))
    assert [s["step"] for s in trace.steps] == [83, 84] and trace.steps[0][S.ACTOR_LOSS] == 0.87373
    assert math.isinf(trace.steps[1][S.ACTOR_LOSS])


def test_tacotrons_iteration_before_its_loss_is_the_step(tmp_path: Path) -> None:
    """NVIDIA tacotron2: ``Train loss 0 48.220909 Grad Norm 13.484264 5.71s/it``; no loss of 0, 1, 2."""
    line = "Train loss {} {} Grad Norm 13.484264 5.71s/it\n"
    trace = read_text(
        tmp_path, "".join(line.format(i, v) for i, v in enumerate([48.220909, 35.229748, 16.508]))
    )
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [
        (0, 48.220909),
        (1, 35.229748),
        (2, 16.508),
    ]
    assert trace.steps[0][S.GRAD_NORM] == 13.484264


@pytest.mark.parametrize(
    "line",
    [
        "{}:\t{:.9f}\n",  # NVIDIA WaveGlow's train.py
        "step_{}:\tloss_{:.9f}\n",  # a fork of it, each value glued to its name
    ],
)
def test_a_counter_and_its_unnamed_or_glued_loss_are_read(tmp_path: Path, line: str) -> None:
    """WaveGlow prints ``123873:\t-5.480178833``, the iteration and its loss, nothing else; a fork
    prints ``step_78540:\tloss_-4.065555573``."""
    losses = [-5.480178833, -5.3522892, 40490.1796875]
    trace = read_text(tmp_path, "".join(line.format(123873 + i, v) for i, v in enumerate(losses)))
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [
        (123873 + i, v) for i, v in enumerate(losses)
    ]


def test_a_loops_print_of_step_and_loss_glued_behind_a_bar_is_that_bars_loss(tmp_path: Path) -> None:
    """unsloth#1169's loop prints ``step, loss`` behind the trainer's bar: ``…| 1/600 [00:17<2:54:35,
    17.49s/it]0, 11.2299``."""
    bar = "  0%|          | {}/600 [00:17<2:54:35, 17.49s/it]{}, {}\n"
    trace = read_text(
        tmp_path, "".join(bar.format(i + 1, i, v) for i, v in enumerate([11.2299, 11.3888, 9.294]))
    )
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(1, 11.2299), (2, 11.3888), (3, 9.294)]


def test_a_name_glued_to_an_integer_stays_a_name(tmp_path: Path) -> None:
    """Only a count after ``step_`` and a value with a decimal point are unglued: ``top_5`` is a name."""
    trace = read_text(tmp_path, "step_10:\tloss_0.52\tacc_top_5 0.91\nstep_20:\tloss_0.48\tacc_top_5 0.93\n")
    assert [(s["step"], s[S.ACTOR_LOSS], s["acc_top_5"]) for s in trace.steps] == [
        (10, 0.52, 0.91),
        (20, 0.48, 0.93),
    ]


def test_edsrs_counter_under_its_epoch_header_is_the_step_and_its_bracketed_loss_the_loss(
    tmp_path: Path,
) -> None:
    """EDSR-PyTorch: ``[Epoch 2]\tLearning rate: …`` over ``[1200/10500]\t[L1: nan]\t20.2+46.7s``
    (samples counted on across epochs); several terms are each ``<term>_loss``, ``Total`` the loss."""
    text = (
        "[Epoch 1]\tLearning rate: 1.00e-4\n[1200/10500]\t[L1: 11.2929]\t21.0+60.3s\n"
        "[2400/10500]\t[L1: 8.8598]\t20.0+63.7s\n\nEvaluation:\n[Epoch 2]\tLearning rate: 1.00e-4\n"
        "[1200/10500]\t[L1: nan]\t20.2+46.7s\n"
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [1200, 2400, 11700]
    assert trace.steps[0][S.ACTOR_LOSS] == 11.2929 and math.isnan(trace.steps[2][S.ACTOR_LOSS])
    terms = read_text(
        tmp_path, "[Epoch 1]\tLearning rate: 1e-4\n[800/800]\t[L1: 0.02]\t[VGG54: 0.3]\t[Total: 0.32]\t1+1s\n"
    )
    assert {k: v for k, v in terms.steps[0].items() if k not in ("step", "raw")} == {
        "L1_loss": 0.02,
        "VGG54_loss": 0.3,
        S.ACTOR_LOSS: 0.32,
    }


def test_a_metric_printed_nan_on_a_line_no_reader_reads_is_counted(tmp_path: Path) -> None:
    """A NaN in a line of a shape the log's reader skips is kept as a non-finite count on its
    step, not dropped with the line; darknet's statistics of an empty YOLO layer are no NaN."""
    records = "".join(f"step {i} | loss {v} | lr 1e-05\n" for i, v in enumerate([2.1, 2.0, 1.9]))
    trace = read_text(tmp_path, records + ">> [seq x2] l1_term: nan | 20.2+46.7s\n")
    assert trace.steps[-1][S.NONFINITE] == 1 and any("print a metric as NaN" in n for n in trace.notes)
    found = {f.type: f for f in diagnose(trace)}["nonfinite"]
    assert "in the log's text" in found.message  # not "in gradients": the line names none
    region = "Region 82 Avg IOU: -nan, Class: -nan, Obj: -nan, No Obj: 0.000002, count: 0\n"
    assert S.NONFINITE not in read_text(tmp_path, records + region).steps[-1]


def test_a_value_ending_a_sentence_and_a_loggers_source_location_are_read_right(tmp_path: Path) -> None:
    """TensorFlowTTS: ``2020-09-10 11:52:14,447 (base_trainer:831) INFO: (Step: 95400)
    train_f0_loss = 0.0659.``: the period ends the sentence, ``base_trainer`` is no metric, and a
    ``= nan.`` on such a line is a NaN at that step."""
    head = "2020-09-10 11:52:14,448 (base_trainer:831) INFO: (Step: 95400) "
    trace = read_text(tmp_path, head + "train_f0_loss = 0.0659.\n" + head + "train_mel_loss_before = nan.\n")
    (step,) = trace.steps
    assert step["step"] == 95400 and step["train_f0_loss"] == 0.0659 and "base_trainer" not in step
    assert step[S.NONFINITE] == 1


@pytest.mark.parametrize(
    ("line", "step", "values"),
    [
        (  # icefall: the batch within the epoch, its AMP scaler's scale
            "2025-05-20 02:38:47,195 INFO [train_phone.py:1056] (7/8) Epoch 1, batch 14300, "
            "loss[loss=0.6675, simple_loss=0.6511, over 19153.00 frames. ], grad_scale: 6.103515625e-05",
            14300,
            {S.LOSS_SCALE: 6.103515625e-05},
        ),
        ("It: 240, Loss: 8.126e+00, Time: 0.11", 240, {S.ACTOR_LOSS: 8.126}),  # Raissi's PINNs
        (  # LAVIS's MetricLogger (MiniGPT-4, BLIP-2)
            "Train: data epoch: [1]  [3950/5000]  eta: 0:08:37  lr: 0.000029  loss: 10.3750  time: 0.4920",
            8950,
            {S.ACTOR_LOSS: 10.375},
        ),
    ],
)
def test_icefall_pinn_and_lavis_step_lines(tmp_path: Path, line: str, step: int, values: dict) -> None:
    (read,) = read_text(tmp_path, line + "\n").steps
    assert read["step"] == step and {k: read[k] for k in values} == values


@pytest.mark.parametrize(
    ("text", "steps", "column"),
    [
        (  # a CSV logger's rows under its header (onnxruntime's BERT convergence baseline)
            "step,total_loss,mlm_loss,nsp_loss\n0,11.2422,10.5228,0.717476\n5,10.1875,7.75453,2.43238\n",
            [0, 5],
            ("mlm_loss", [10.5228, 7.75453]),
        ),
        (  # Stable Baselines' progress.csv: alphabetical, its step a column among the others
            "rollout/ep_rew_mean,time/fps,time/total_timesteps,train/loss\n21.3,900,2048,0.52\n,910,4096,nan\n",
            [2048, 4096],
            ("rollout/ep_rew_mean", [21.3, None]),
        ),
        (  # DeepXDE: a code fence's backtick glued on, each loss printed as an array
            "`Step      Train loss    Test loss     Test metric\n"
            "0         [5.47e+03]    [6.44e+03]    [1.00e+00]\n"
            "2000      [nan]         [nan]         [nan]\n",
            [0, 2000],
            ("Test loss", [6440.0, math.nan]),
        ),
    ],
)
def test_csv_and_array_cell_tables_are_read(
    tmp_path: Path, text: str, steps: list[int], column: tuple
) -> None:
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "step-table" and [s["step"] for s in trace.steps] == steps
    name, values = column
    read = [s.get(name) for s in trace.steps]
    assert [None if v is None else round(v, 6) if v == v else "nan" for v in read] == [
        None if v is None else "nan" if v != v else v for v in values
    ]


def test_espnet2s_epoch_batches_are_the_step(tmp_path: Path) -> None:
    """ESPnet2: ``1epoch:train:1021-2040batch: iter_time=…, loss=5.321, …, optim0_lr0=1.533e-04``;
    its ``optim_step_time=nan`` (a timer over no optimizer step) is no non-finite value."""
    line = (
        "INFO: 1epoch:train:{}-{}batch: iter_time=1.5e-04, loss={}, optim_step_time={}, optim0_lr0=4.4e-04\n"
    )
    text = line.format(1, 1020, 6.474, 0.097) + line.format(1021, 2040, 5.321, "nan")
    trace = read_text(tmp_path, text)
    assert [(s["step"], s[S.ACTOR_LOSS], s[S.LR]) for s in trace.steps] == [
        (1020, 6.474, 4.4e-4),
        (2040, 5.321, 4.4e-4),
    ]
    assert "nonfinite" not in {f.type for f in diagnose(trace)}


def test_a_number_a_terminal_wrapped_in_two_is_rejoined_not_read_as_a_counter(tmp_path: Path) -> None:
    """fairseq's epoch line wrapped at the terminal's width inside ``gnorm 0.580``: the rest, ``0 |
    clip 0.000 | …``, looks like a loop's counter but names none of the line's fields."""
    head = (
        "| epoch {:03d} | loss {} | nll_loss 9.14 | ppl 565.41 | wps 24271 | ups 7 | num_updates {} "
        "| lr 0.0003 | gnorm 0.58"
    )
    rest = "0 | clip 0.000 | oom 0.000 | wall 1692 | train_wall 1499\n"
    lines = [head.format(9 + i, loss, 10909 + 1101 * i) for i, loss in enumerate(["9.753", "9.748", "9.744"])]
    assert len(set(map(len, lines))) == 1  # one width, the terminal's
    text = "".join(line + "\n" + rest for line in lines)
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [10909, 12010, 13111]
    assert all(s[S.GRAD_NORM] == 0.58 for s in trace.steps)


@pytest.mark.parametrize(
    ("text", "steps", "key", "values"),
    [
        (  # OpenNMT-py's early trainer, the batch within the epoch (epochs from 1)
            "Epoch  1, 12850/37527; acc:   3.99; ppl: 12792.57; xent:   9.46; 3438 src tok/s\n"
            "Epoch  2, 50/37527; acc:   4.48; ppl: 35173.75; xent:  10.47; 3599 src tok/s\n",
            [12850, 37577],
            "xent",
            [9.46, 10.47],
        ),
        (  # rasbt's notebooks: epochs from 1, TensorFlow 1's "Cost"
            "Epoch: 001/010 | Batch 0350/0391 | Cost: 2.3035\n"
            "Epoch: 002/010 | Batch 0000/0391 | Cost: 2.3032\n",
            [350, 391],
            S.ACTOR_LOSS,
            [2.3035, 2.3032],
        ),
        (  # a loop's print(epoch, "Loss :", loss) between a notebook's progress bars
            "1335 Loss : 0.0499\n100% 6/6 [00:01<00:00,  3.93it/s]\n1336 Loss : 1.4627\n",
            [1335, 1336],
            S.ACTOR_LOSS,
            [0.0499, 1.4627],
        ),
        (  # an epoch's banner over its tagged lines: the validation line's names held out
            "[ Epoch 0 ]\n  - (Training)   ppl:  69.89619, accuracy: 48.127 %, elapse: 9.800 min\n"
            "  - (Validation) ppl:  86.35283, accuracy: 20.530 %, elapse: 3.096 min\n[ Epoch 1 ]\n"
            "  - (Training)   ppl:  135.71178, accuracy: 32.377 %, elapse: 10.807 min\n",
            [0, 1],
            "valid/ppl",
            [86.35283, None],
        ),
    ],
)
def test_more_loops_step_lines(tmp_path: Path, text: str, steps: list[int], key: str, values: list) -> None:
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == steps and [s.get(key) for s in trace.steps] == values


def test_marians_valid_lines_are_held_out(tmp_path: Path) -> None:
    """``[valid]`` after the time stamp: Marian's validation cross-entropy is no training cost."""
    text = (
        "[2021-07-17 13:49:01] Ep. 1 : Up. 20000 : Sen. 1,212,903 : Cost 5.85167885 : Time 984.07s\n"
        "[2021-07-17 13:50:36] [valid] Ep. 1 : Up. 20000 : cross-entropy : 130.97 : new best\n"
    )
    (step,) = read_text(tmp_path, text).steps
    assert step[S.ACTOR_LOSS] == 5.85167885 and step["valid/cross-entropy"] == 130.97


@pytest.mark.parametrize(
    "text",
    [
        "LOSS      P       R       F       A\n" + "0.000   0.000   0.000   0.000   0.889\n" * 2,
        "Learning Rate\tTrain Loss\tTheta Loss\t\n0.000200\t-0.023201\t0.223515\t\n"
        "0.000200\t-0.082967\t0.149054\t\n",
    ],
)
def test_a_header_of_names_over_rows_of_numbers_cut_at_spaces_or_tabs_is_a_table(
    tmp_path: Path, text: str
) -> None:
    """spaCy's ``LOSS      P       R       F       A`` and TimeCycle's tab-separated header: rows in order."""
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "step-table" and [s["step"] for s in trace.steps] == [0, 1]


def test_guided_diffusions_lg_loss_scale_lines_are_overflows(tmp_path: Path) -> None:
    """improved- / guided-diffusion keep log2 of the fp16 scale: ``Found NaN, decreased
    lg_loss_scale to 16.929`` is a skipped update at a scale of 2 ** 16.929."""
    table = "----------------------------\n| loss          | 0.842    |\n| step          | 10900    |\n"
    trace = read_text(
        tmp_path, table + "----------------------------\nFound NaN, decreased lg_loss_scale to 16.929\n"
    )
    assert trace.steps[-1][S.SKIPPED] == 1 and trace.steps[-1][S.LOSS_SCALE] == pytest.approx(2**16.929)


def test_a_logger_line_after_records_of_one_length_is_no_wrapped_piece(tmp_path: Path) -> None:
    """mmengine's records can share one length by chance (mmselfsup's MoCo v3 run: 165 characters),
    which reads like a terminal's wrap width; the ``Exp name`` line after one opens with the
    logger's time stamp, so it is no piece of that record."""
    head = "2022/12/22 15:21:{} - mmengine - INFO - "
    record = "Epoch(train) [5][{}/230]  lr: 1.3951e-01  eta: 1 day, 17:02:12  time: 0.3213  loss: {}"
    text = (
        head.format(14)
        + record.format(150, 13.2568)
        + "\n"
        + head.format(30)
        + record.format(200, 13.4066)
        + "\n"
        + head.format(40)
        + "Exp name: mocov3_resnet50_pretrain_8xb512-amp-coslr-800e_in1k_20221222\n"
    )
    trace = read_text(tmp_path, text)
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [13.2568, 13.4066]
    assert "Exp name" not in trace.steps[-1]["raw"]


def test_every_pasted_run_is_read_as_its_own_trace() -> None:
    from moescope.analyze.readers import read_runs

    path = Path(__file__).parent / "data" / "logs" / "pasted" / "two_runs_pasted.log"
    first, second = read_runs(path)
    assert [s["step"] for s in first.steps] == [1, 2, 3] == [s["step"] for s in second.steps]
    assert math.isnan(first.steps[2][S.GRAD_NORM]) and second.steps[2][S.GRAD_NORM] == 0.77
    assert first.steps == read_log(path, run=0).steps and second.steps == read_log(path).steps
    assert any("run 1 of the 2" in n and "from line 6" in n for n in second.notes)
    assert len(read_runs(Path(__file__).parent / "data" / "logs" / "megatron.log")) == 1


def test_a_line_over_the_cap_is_read_in_part(tmp_path: Path) -> None:
    from moescope.analyze.readers._text import MAX_LINE

    path = tmp_path / "long.log"
    with path.open("w") as f:
        f.write("step:1 - actor/grad_norm:0.4\n")
        f.write("x" * (MAX_LINE * 3) + "\n")
        f.write("step:2 - actor/grad_norm:nan\n")
    trace = read_log(path)
    assert [s["step"] for s in trace.steps] == [1, 2]
    assert any("longer than 1 MiB were read only in part" in n for n in trace.notes)


def _finite_values(trace) -> list[dict]:
    """The steps' values without raw text and NaNs (which compare unequal), for comparing reads."""
    return [
        {k: v for k, v in s.items() if k != "raw" and not (isinstance(v, float) and math.isnan(v))}
        for s in trace.steps
    ]


@pytest.mark.parametrize("width", [80, 100, 137])
def test_record_lines_a_terminal_wrapped_at_its_width_are_rejoined(tmp_path: Path, width: int) -> None:
    path = Path(__file__).parent / "data" / "logs" / "xtuner_iter.log"
    wrapped = [
        line[i : i + width] for line in path.read_text().splitlines() for i in range(0, len(line), width)
    ]
    trace = read_text(tmp_path, "\n".join(wrapped) + "\n")
    assert _finite_values(trace) == _finite_values(read_log(path))
    assert sum(math.isnan(s[S.GRAD_NORM]) for s in trace.steps) == 3


def test_a_pipe_table_without_a_step_column_is_read_row_by_row(tmp_path: Path) -> None:
    """OpenAI baselines' PPO table: names over rows of numbers, one row an optimisation epoch."""
    text = (
        "********* Iteration 3 ************\nOptimizing...\n"
        "     pol_surr |    pol_entpen |       vf_loss |            kl |           ent\n"
        "     -0.00120 |      -0.00000 |      5.10e+01 |       0.00090 |       0.69100\n"
        "     -0.00510 |      -0.00000 |      4.80e+01 |       0.00350 |       0.69020\n"
        "Evaluating losses...\n"
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "step-table" and [s["step"] for s in trace.steps] == [0, 1]
    assert trace.steps[1][S.KL] == 0.0035 and trace.steps[1]["vf_loss"] == 48.0


_YOLO_HEADER = "     Epoch   gpu_mem       box       obj       cls     total    labels  img_size\n"
_YOLO_ROW = "    {}/299     65.1G       {}   0.01516         0       {}      1869       320: 100%|███| 7/7\n"
_YOLO_VALIDATION = (
    "               Class      Images      Labels           P           R      mAP@.5  mAP@.5:.95: "
    "100%|███| 41/41\n                 all       20987      129965       0.848       0.542       0.609"
    "       0.332\n\n"
)


def test_yolo_epoch_rows_under_their_header_are_read_on_their_epoch(tmp_path: Path) -> None:
    """YOLOv5 / v7 print a header over each epoch's row and a validation table below it; a paste
    may start at a row, above the first header (yolov7#613: box and total loss nan from epoch 41)."""
    text = _YOLO_ROW.format(40, 0.0312, 0.0464) + _YOLO_VALIDATION
    text += "".join(_YOLO_HEADER + _YOLO_ROW.format(e, "nan", "nan") + _YOLO_VALIDATION for e in (41, 42))
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "step-table" and [s["step"] for s in trace.steps] == [40, 41, 42]
    assert trace.steps[0][S.ACTOR_LOSS] == 0.0464 and trace.steps[0]["box_loss"] == 0.0312
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS]) and "gpu_mem" not in trace.steps[1]  # 65.1G: a size
    (found,) = [f for f in diagnose(trace) if f.type == "nonfinite"]
    assert (found.step, found.severity) == (41, "error")


@pytest.mark.parametrize(
    "text",
    [
        "| approxkl | 6.6e-05 |\n| clipfrac | 0.0 |\n| policy_loss | 0.0006 |\n",  # one step's stats
        "| model | acc | f1 |\n|---|---|---|\n| base | 0.81 | 0.77 |\n| tuned | 0.86 | 0.80 |\n",  # results
    ],
)
def test_a_pipe_table_of_names_and_text_is_no_step_table(text: str) -> None:
    assert table.header(text.splitlines()) is None


def test_spaced_names_a_key_map_knows_are_read_without_a_colon(tmp_path: Path) -> None:
    """mlx-lm's GRPO report: ``Total rewards mean 0.625``; spaced names no map knows stay unread."""
    line = (
        "Iter 5: Train loss 0.012, Total rewards mean 0.625, Total rewards std 0.484, "
        "Grouped rewards std 0.354, KL 0.002, Learning Rate 1.000e-05, Peak mem 20.1 GB\n"
    )
    step = read_text(tmp_path, line).steps[0]
    assert step["step"] == 5
    assert (step[S.REWARD_MEAN], step[S.REWARD_STD], step[S.KL]) == (0.625, 0.354, 0.002)
    assert step[S.LR] == 1e-05 and step[S.ACTOR_LOSS] == 0.012
    assert not {"Total rewards std", "Peak mem"} & step.keys()
    assert pairs("the reward mean is 3, as expected") == {}


def test_deepspeed_overflow_lines_between_progress_bars_join_the_record_before(tmp_path: Path) -> None:
    """A trainer's bars over DeepSpeed's log: each overflow (one a terminal wrapped too) is read
    into the record after it, and no note sends the user to a format that would drop the bars."""
    bar = "[losses/total_loss: {2} | losses/value_loss: 0.31]:   {0}%| | {1}/900 [01:10<1:10:00, 4.12s/it]\n"
    overflow = (
        "[2024-03-02 10:00:{:02d},101] [INFO] [stage_1_and_2.py:1762:step] [deepspeed] OVERFLOW! Rank 0 "
        "Skipping step. Attempted loss scale: {}, reducing to {}\n"
    )
    text = bar.format(1, 10, 0.91)
    for i, scale in enumerate((4096, 2048, 1024, 512)):
        line = overflow.format(i, float(scale), float(scale // 2))
        wrapped = line if i else line[:100] + "\n" + line[100:]  # at a terminal's width: two lines
        text += wrapped + bar.format(1, 11 + i, 0.9)
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [10, 11, 12, 13, 14]
    assert [s.get(S.LOSS_SCALE) for s in trace.steps] == [None, 2048.0, 1024.0, 512.0, 256.0]
    assert trace.steps[1][S.SKIPPED] == 1 and not any("format='megatron'" in n for n in trace.notes)


def test_a_validation_loss_without_a_colon_is_no_training_loss(tmp_path: Path) -> None:
    """mlx-lm prints ``Iter N: Val loss x`` beside ``Iter N: Train loss y``: the validation loss
    keeps its own name, and the step's training loss is the train line's, whichever comes last."""
    text = (
        "Iter 1: Val loss 2.912, Val took 12.345s\n"
        "Iter 10: Train loss 2.701, Learning Rate 1.000e-05, It/sec 0.412, Peak mem 9.120 GB\n"
        "Iter 20: Train loss 2.532, Learning Rate 1.000e-05, It/sec 0.415, Peak mem 9.120 GB\n"
        "Iter 20: Val loss 9.870, Val took 12.101s\n"
    )
    first, _, last = read_text(tmp_path, text).steps
    assert S.ACTOR_LOSS not in first and first["Val loss"] == 2.912
    assert last[S.ACTOR_LOSS] == 2.532 and last["Val loss"] == 9.87


def test_a_validation_line_labelled_val_keeps_its_own_loss(tmp_path: Path) -> None:
    """A loop that prints ``Step N stats, train: loss = …`` then ``Step N stats, val: loss = …``:
    the val line, printed last, no longer replaces the step's training loss."""
    text = "".join(
        f"[2020-07-29T13:59:21] Step {step} stats, train: loss = {train}\n"
        f"[2020-07-29T13:59:27] Step {step} stats, val: loss = {val}\n"
        for step, train, val in ((100, 1.13, 3.32), (200, 0.92, 3.54))
    )
    steps = read_text(tmp_path, text).steps
    assert [(s[S.ACTOR_LOSS], s["val loss"]) for s in steps] == [(1.13, 3.32), (0.92, 3.54)]


def test_a_parallelism_line_is_no_expert_load_row(tmp_path: Path) -> None:
    """``tp=1 pp=1 dp=4 cp=1`` above one Megatron line: four integer columns, but no data row, so
    it no longer outvotes the record and the paste is read as Megatron's."""
    text = (
        "tp=1 pp=1 dp=4 cp=1\n"
        " [2025-02-20 11:18:36] iteration        1/250000000 | consumed samples:            4 | "
        "learning rate: 1.000000E-05 | global batch size:     4 | lm loss: 6.612992E+00 | "
        "loss scale: 1.0 | grad norm: 111.173 | number of skipped iterations:   0 |\n"
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "megatron" and trace.steps[0][S.GRAD_NORM] == 111.173


def test_bars_on_lines_of_their_own_give_the_records_their_steps(tmp_path: Path) -> None:
    """Carriage returns pasted as new lines: each record sits between its step's bar drawn and
    redrawn (the first record's drawing cut off); a lone data-loading bar gives no step."""
    bar = "  2%|▏         | {0}/390 [01:46<1:24:37, 13.26s/it]\n"
    record = "{{'loss': {0}, 'grad_norm': 0.0, 'learning_rate': 0.0, 'epoch': {1}}}\n"
    text = record.format(12.10, 0.15) + "\n" + bar.format(6) + bar.format(7) + "   \n"
    text += record.format(12.06, 0.18) + "\n" + bar.format(7) + bar.format(8) + record.format(12.0, 0.21)
    assert [s["step"] for s in read_text(tmp_path, text).steps] == [6, 7, 8]
    loading = "100%|██████████| 7/7 [00:00<00:00, 1809.34it/s]\n" + record.format(0.15, 0.04) * 3
    assert [s["step"] for s in read_text(tmp_path, loading).steps] == [0, 1, 2]


def test_an_evaluation_record_takes_the_bar_of_its_training_step(tmp_path: Path) -> None:
    """HF's evaluation record follows the training record of its step, each with the bar redrawn
    after it at the same count: both are that step; the overflows glued to the bars after them
    go on the bars' counts."""
    bar = "  3%|▎         | {0}/387 [02:58<1:51:02, 17.67s/it]"
    overflow = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {0}, reducing to {1}\n"
    text = "{'loss': 2.3578, 'learning_rate': 0, 'epoch': 0.08}\n" + bar.format(10)
    text += "[INFO|trainer.py:3081] 2023-07-26 15:16:54,262 >> ***** Running Evaluation *****\n"
    text += "[INFO|trainer.py:3083] 2023-07-26 15:16:54,262 >>   Num examples = 499\n"
    text += (
        "{'eval_loss': 2.3535, 'eval_runtime': 5.47, 'epoch': 0.08}\n"
        + bar.format(10)
        + overflow.format(128, 64)
    )
    text += "".join(bar.format(n) + overflow.format(s, s // 2) for n, s in ((11, 64), (12, 32), (13, 16)))
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [10, 11, 12, 13] and trace.steps[0]["eval_loss"] == 2.3535
    kinds = {f.type: f.severity for f in diagnose(trace)}
    assert kinds.get("overflow") == "warning"  # four skipped updates in a row, down to a scale of 8


def test_a_record_pasted_before_the_first_bar_is_the_step_before_it(tmp_path: Path) -> None:
    """ChatGLM-Efficient-Tuning's PPO paste (hiyouga/ChatGLM-Efficient-Tuning#49) starts on a record
    whose bar was left out, then records glued behind bars 1, 2, 3: the first is step 0, at the
    interval the bars show, not merged into step 1 (its loss overwritten by step 1's NaN)."""
    bar = "  0%|          | {0}/13000 [00:10<36:34:36, 10.13s/it]"
    record = "{{'loss': {0}, 'reward': -2.03, 'learning_rate': 5e-05}}\n"
    text = record.format(0.329) + "".join(
        bar.format(n) + record.format(v) for n, v in ((1, "nan"), (2, 0.25), (3, 0.15))
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [0, 1, 2, 3] and trace.steps[0][S.ACTOR_LOSS] == 0.329
    once = (
        record.format(0.329) + bar.format(75) + record.format("nan")
    )  # one bar: no interval to step back by
    assert [s["step"] for s in read_text(tmp_path, once).steps] == [75]


def test_a_record_every_host_of_a_multi_node_launch_prints_is_one_step(tmp_path: Path) -> None:
    """pdsh puts the host before each line: one record per host, in any order, is one step."""
    text = "".join(
        f"{host}: {{'loss': {loss}, 'learning_rate': 2e-05, 'epoch': 0.01}}\n"
        for loss, hosts in ((1.52, ("node-a", "node-b")), (1.31, ("node-b", "node-a")), (1.31, ("node-a",)))
        for host in hosts
    )
    trace = read_text(tmp_path, text)
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [1.52, 1.31, 1.31]  # node-a's next record is a step
    assert any("several hosts" in n for n in trace.notes)


def test_equal_records_without_a_host_stay_steps_of_their_own(tmp_path: Path) -> None:
    text = "{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.5}\n" * 3
    assert len(read_text(tmp_path, text).steps) == 3


def test_a_notebook_progress_table_is_read_by_its_column_names() -> None:
    trace = read_log(Path(__file__).parent / "data" / "logs" / "trl_notebook_table.log")
    assert trace.header["format"] == "step-table" and [s["step"] for s in trace.steps] == [10, 20, 30]
    first, last = trace.steps[0], trace.steps[-1]
    assert first[S.ACTOR_LOSS] == 0.0012 and first[S.LENGTH_MEAN] == 402.125 and first[S.KL] == 0.00031
    assert S.KL not in last  # 'No Log' is not logged, not a value


def test_a_config_dump_does_not_outvote_a_metrics_line_without_a_step(tmp_path: Path) -> None:
    """A progress bar's postfix pasted without the bar, above the run's YAML config: the config's
    ``max_epochs: 100`` lines name no metric, so the one line that does is the record read."""
    text = (
        "log:\n [0:12:31<9:20:05, 88.20s/it, env/reward=0.012, rollout/advantages_mean=nan, "
        "train/actor/grad_norm=nan, train/actor/policy_loss=nan, train/actor/lr=1e-5,\n\n"
        "runner:\n  max_epochs: 100\n  max_steps: -1\n  save_interval: 20\n  seq_length: 256\n"
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "records" and len(trace.steps) == 1
    assert math.isnan(trace.steps[0][S.GRAD_NORM]) and "max_epochs" not in trace.steps[0]


def test_a_snapshot_of_metrics_still_outvotes_a_stray_record(tmp_path: Path) -> None:
    """Lines that name metrics outvote a record line among them, as before."""
    text = (
        "actor/entropy: 0.41\nactor/pg_loss: 0.012\ncritic/score/mean: 0.53\n"
        "earlier: loss=0.31 grad_norm=1.2\n"
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "key-values" and trace.steps[0][S.ENTROPY] == 0.41


def test_a_postfix_redrawn_around_its_update_is_one_step_and_one_drawn_per_count_is_not(
    tmp_path: Path,
) -> None:
    """OpenRLHF sets a step's postfix, then updates: each postfix shows on two counts, and is the
    step of the later one. A loop that draws its bar once a step repeats a stuck postfix on
    every count: each is a step, so a NaN starts on the first bar that shows it."""
    bar = "Episode [1/1]:  {n}%|#| {n}/50 [00:{n}0<09:00, 30.0s/it, policy_loss={loss}, reward=0.5]\n"
    redrawn = "".join(bar.format(n=n, loss=loss) for n, loss in [(0, 0.1), (1, 0.1), (1, "nan"), (2, "nan")])
    assert [s["step"] for s in read_text(tmp_path, redrawn).steps] == [1, 2]
    once = "".join(
        f"Steps:   0%|#| {n}/900 [00:{n}0<1:20:00, 2.9s/it, lr=0, step_loss={loss}]\n"
        for n, loss in [(5, 0.2), (6, "nan"), (7, "nan"), (8, "nan")]
    )
    assert [s["step"] for s in read_text(tmp_path, once).steps] == [5, 6, 7, 8]


def test_an_epochs_summary_under_its_bar_is_read_into_that_epoch(tmp_path: Path) -> None:
    """``Mean Training loss : nan`` under ``Epoch 4: 100%|…| 90/90 […, loss=3e+3]``
    (crossattention_radar_detector#3): that epoch's, the bar's description its step; a
    framework's own warning among them stays the alerts' to read."""
    bar = "Epoch {e}: 100%|#####| 90/90 [00:15<00:00,  6.0it/s, loss={loss}]\n"
    text = bar.format(e=3, loss="2.9e+3") + "Mean Training loss : 2871.5\nnumber of nan iterations: 1\n"
    text += bar.format(e=4, loss="3.4e+3") + "Training time for one epoch: 15.2 s\nMean Training loss : nan\n"
    first, second = read_text(tmp_path, text).steps
    assert (first["step"], first["Mean Training loss"], second["step"]) == (3, 2871.5, 4)
    assert math.isnan(second["Mean Training loss"]) and "number of nan iterations" not in first
    assert S.ALERTS in second  # read as the alerts read it: onto the record after it


def test_an_old_keras_bare_epoch_header_is_the_step(tmp_path: Path) -> None:
    """An old Keras prints ``Epoch 0`` alone over ``600/600 [====] - 1s - loss: …``, the sample
    counter the same every epoch (keras#21): the epochs are the steps, not one merged record."""
    text = "".join(
        f"Epoch {e}\n600/600 [==============================] - 1s - loss: {loss}\n"
        for e, loss in enumerate((0.9, 0.8, 0.7))
    )
    trace = read_text(tmp_path, text)
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(0, 0.9), (1, 0.8), (2, 0.7)]


def test_names_in_brackets_before_their_numbers_are_fields(tmp_path: Path) -> None:
    """A home-made loop's ``[Loss] 2.5 | [lr] 1e-4 | [step] 300``: each bracketed name labels the
    number after it (the step too); a bracketed tag before words or a clock stays no field."""
    text = "".join(
        f"[rank0] 12:00:0{i} [Loss] {v} | [lr] 0.0001 | [step] {i * 100}\n"
        for i, v in enumerate(("2.5", "2.4", "nan"))
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [0, 100, 200] and trace.steps[1][S.ACTOR_LOSS] == 2.4
    assert math.isnan(trace.steps[2][S.ACTOR_LOSS]) and not any("rank0" in key for key in trace.steps[0])


def test_an_epoch_counter_before_bars_is_the_step(tmp_path: Path) -> None:
    """A loop's ``Epoch 144/1000 | Loss 2214.4102 | Epsilon 0.00 | Win count 66``: the epoch is
    the step, as an episode counter there is."""
    text = "".join(
        f"Epoch {e}/1000 | Loss {v} | Epsilon 0.00 | Win count 65\n"
        for e, v in ((143, 2214.4), (144, 6.05e21))
    )
    trace = read_text(tmp_path, text)
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(143, 2214.4), (144, 6.05e21)]


def test_a_logger_table_gives_its_step_in_a_row_of_its_own(tmp_path: Path) -> None:
    """OpenAI's logger (baselines, guided-diffusion) dumps a boxed table of its keys in order, the
    ``step`` row among them: each table is a record on that step, its metric rows the record."""
    box = "-" * 29 + "\n| lg_loss_scale | {0}   |\n| loss          | {1}       |\n"
    box += "| samples       | 3.92e+07  |\n| step          | {2}  |\n" + "-" * 29 + "\n"
    text = box.format(-16199.0, 0.031, "1.53e+05") + "Found NaN, decreased lg_loss_scale to -16200.354\n"
    trace = read_text(tmp_path, text + box.format(-16200.0, "nan", "1.54e+05"))
    assert [s["step"] for s in trace.steps] == [153000, 154000] and trace.steps[0][S.ACTOR_LOSS] == 0.031
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS])


def test_the_mnist_example_lines_count_samples_across_epochs(tmp_path: Path) -> None:
    """PyTorch's MNIST example, copied into countless loops: ``Train Epoch: 1 [640/60000 (1%)]\tLoss:
    2.214``; the sample counter starts over each epoch (from 1), so epochs are counted on."""
    rows = ((1, 0, "2.305"), (1, 640, "2.214"), (2, 0, "nan"))
    text = "".join(f"Train Epoch: {e} [{i}/60000 ({i // 600}%)]\tLoss: {v}\n" for e, i, v in rows)
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [0, 640, 60000] and trace.steps[1][S.ACTOR_LOSS] == 2.214


def test_paddle_iter_brackets_and_values_printed_as_arrays(tmp_path: Path) -> None:
    """PaddlePaddle's ``Iter[110]; train loss: nan`` names its step in brackets, and its fetched
    tensors print as arrays, ``loss: [nan]``: an array's value is its mean (NaN where any is)."""
    text = "Iter[100]; train loss: 2.213; sub4_loss: 1.871\nIter[110]; train loss: nan; sub4_loss: nan\n"
    assert [s["step"] for s in read_text(tmp_path, text).steps] == [100, 110]
    text = "".join(
        f"INFO: Total iter: {i}, epoch: 0, loss: [{v}], acc: [0.5, 0.7]\n"
        for i, v in ((10, 2.3), (20, "nan"))
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [10, 20] and trace.steps[0][S.ACTOR_LOSS] == 2.3
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS]) and trace.steps[0]["acc"] == pytest.approx(0.6)


def test_caffe_glog_lines_are_read_without_their_prefix(tmp_path: Path) -> None:
    """caffe logs through glog: ``I0413 12:53:29.562093 22206 solver.cpp:242] Iteration 6480 (…),
    loss = …`` then a line per net output. The prefix names no metric (``solver.cpp``), starts no
    wrapped piece of the line above it, and each output is read under its own name."""
    glog = "I0413 12:5{0}:29.56209{1} 22206 {2}] "
    text = "".join(
        glog.format(i, 3, "solver.cpp:242")
        + f"Iteration {s} (0.268 iter/s, 149.0s/40 iter), loss = 0.5\n"
        + glog.format(i, 8, "solver.cpp:261")
        + f"    Train net output #0: loss_bbox = 0.{i} (* 2 = 0.{i} loss)\n"
        + glog.format(i, 9, "sgd_solver.cpp:106")
        + f"Iteration {s}, lr = 1e-05\n"
        for i, s in ((1, 6480), (2, 6520), (3, 6560))
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [6480, 6520, 6560]
    assert [s["loss_bbox"] for s in trace.steps] == [0.1, 0.2, 0.3]
    assert not any(".cpp" in key for s in trace.steps for key in s)


def test_a_caffe_net_output_named_like_the_smoothed_loss_is_the_iteration_s_loss(tmp_path: Path) -> None:
    """With ``average_loss`` above 1, caffe's ``Iteration 20 (…), loss = 6.90501`` is a running
    mean and the ``Train net output #0: loss = 6.90776`` below it the iteration's own value, of
    the same name: the output is the step's loss (a loss pinned at ln 1000, hidden before by the
    moving mean), not a record of its own that was dropped."""
    lines = [
        "I0515 11:05:{0}.873651 37636 solver.cpp:239] Iteration {1} (1.03 iter/s, 19.4s/20 it), loss = {2}\n",
        "I0515 11:05:{0}.873690 37636 solver.cpp:258]     Train net output #0: loss = {3} (* 1 = {3} loss)\n",
        "I0515 11:05:{0}.873761 37636 sgd_solver.cpp:112] Iteration {1}, lr = 0.01\n",
    ]
    rows = ((10, 0, 6.91161, 6.91161), (20, 20, 6.90501, 6.90776), (30, 40, 6.90635, 6.90776))
    trace = read_text(tmp_path, "".join(line.format(*row) for row in rows for line in lines))
    assert [(s["step"], s[S.ACTOR_LOSS], s[S.LR]) for s in trace.steps] == [
        (0, 6.91161, 0.01),
        (20, 6.90776, 0.01),
        (40, 6.90776, 0.01),
    ]


def test_an_overflow_glued_behind_a_bar_that_logs_metrics_keeps_the_bar_s_record(tmp_path: Path) -> None:
    """ColossalAI's GPT-2 example prints its tqdm bar, ``loss=`` in the postfix, with DeepSpeed's
    ``OVERFLOW!`` glued behind it: a record whose overflow folds into the bar's step, not an
    overflow line alone (its loss was dropped, the NaN with it)."""
    bar = (
        "[Epoch 0 / Train]:   0%|          | {0}/8614 [00:00<1:03:35,  2.26it/s, loss={1}, lr=2.5e-05]"
        "[deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2}, reducing to {3}\n"
    )
    text = "".join(
        bar.format(n, loss, 2.0 ** (33 - n), 2.0 ** (32 - n)) for n, loss in ((1, 265.25), (2, "nan"))
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [1, 2] and trace.steps[0][S.ACTOR_LOSS] == 265.25
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS]) and trace.steps[1][S.LOSS_SCALE] == 2.0**30


def test_fairseq_early_progress_lines_and_tianshou_epoch_bars_give_steps(tmp_path: Path) -> None:
    """fairseq's early ``| epoch 010  2000 / 8223 loss=1.27 (1.50), …`` counts batches within each
    epoch (from 1), unless the line counts its updates (``num_updates=431``); tianshou's ``Epoch
    #1: 50001it [00:40, …, loss=-0.562, rew=200.00]`` is epoch 1, its postfix the fields."""
    line = "| epoch 010  {0} / 8223 loss={1} (1.50), wps=962, lr=0.001, clip=100%, gnorm=2.14\n"
    trace = read_text(tmp_path, line.format(2000, 1.27) + line.format(3000, 1.28))
    assert [s["step"] for s in trace.steps] == [9 * 8223 + 2000, 9 * 8223 + 3000]
    counted = "| epoch 001:    430 / 614 loss=9.997, num_updates=431, gnorm=11.481, clip=100%, oom=0\n"
    assert [s["step"] for s in read_text(tmp_path, counted).steps] == [431]
    bar = "Epoch #{0}: 50001it [00:40, 1244.54it/s, env_step={1}, loss={2}, loss/ent=0.468, rew=200.00]\n"
    trace = read_text(tmp_path, bar.format(1, 50000, -0.562) + bar.format(2, 100000, -0.023))
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(1, -0.562), (2, -0.023)]


def test_a_boxed_table_keeps_its_rows_named_like_code(tmp_path: Path) -> None:
    """A logger's boxed table (SAC: ``| avg_rewards | 272 |``): every row whose name is written
    like code is a field, not only the names a key map knows; the epoch row as well."""
    rule = "-" * 34 + "\n"
    box = rule + "| actor_loss         | 0.0489    |\n| avg_rewards        | {0}       |\n"
    box += "| epoch              | {1}         |\n| explained_variance | -0.000163 |\n" + rule
    trace = read_text(tmp_path, box.format(272, 0) + box.format("**-21.5**", 1))  # a cell the user bolded
    assert [(s["avg_rewards"], s["explained_variance"]) for s in trace.steps] == [
        (272, -0.000163),
        (-21.5, -0.000163),
    ]


def test_a_metric_printed_before_the_step_marker_is_that_steps(tmp_path: Path) -> None:
    """insightface's arcface_torch prints ``Speed 218.82 samples/sec   Loss nan   Epoch: 0   Global
    Step: 14750   Required: 102 hours``: the loss comes before the step, and is that step's."""
    line = (
        "Training: 2021-06-01 16:25:{0},183-Speed 218.82 samples/sec   Loss {1}   Epoch: 0   Global Step: {2}"
    )
    line += "   Required: 102 hours\n"
    trace = read_text(tmp_path, line.format(7, 2.4868, 14700) + line.format(51, "nan", 14750))
    assert [s["step"] for s in trace.steps] == [14700, 14750] and trace.steps[0][S.ACTOR_LOSS] == 2.4868
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS])


def test_an_epoch_line_that_opens_with_its_number_and_a_comma_is_that_epoch(tmp_path: Path) -> None:
    """SAGN's ``Epoch 26, Time(s): 11.3853 6.5175, Best Val loss: 0.9427, Accs: Train: 0.7351, …``;
    TensorFlow's examples and tf_unet's ``Iter 950, Minibatch Loss= 0.6931`` (the loss)."""
    line = "Epoch {0}, Time(s): 11.3853 6.5175, Best Val loss: {1}, Accs: Train: 0.7351, Val: 0.7079\n"
    trace = read_text(tmp_path, line.format(26, 0.9427) + line.format(27, 0.938))
    assert [(s["step"], s["Best Val loss"]) for s in trace.steps] == [(26, 0.9427), (27, 0.938)]
    line = "2017-08-22 23:27:32,554 Iter {0}, Minibatch Loss= {1}, Training Accuracy= 0.7385\n"
    assert read_text(tmp_path, line.format(950, 0.6931)).steps[0][S.ACTOR_LOSS] == 0.6931


def test_marians_updates_and_mxnets_speedometer_are_steps(tmp_path: Path) -> None:
    """Marian NMT: ``Ep. 8 : Up. 535500 : Sen. 94,495,934 : Cost nan : … : gNorm 0.6068 : L.r. …``
    (the update counter the step, ``Cost`` the loss); MXNet's Speedometer, as Sockeye logs it:
    ``Epoch[0] Batch [50]\tSpeed: 51.34 samples/sec\tperplexity=45560.6`` (the batch the step)."""
    line = "[2022-05-09 06:45:23] Ep. 8 : Up. {0} : Sen. 94,495,934 : Cost {1} : Time 149.83s : "
    line += "gNorm 0.6068 : L.r. 5.1856e-05\n"
    trace = read_text(tmp_path, line.format(535000, 2.46588373) + line.format(535500, "nan"))
    assert [s["step"] for s in trace.steps] == [535000, 535500] and trace.steps[0][S.ACTOR_LOSS] == 2.46588373
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS]) and trace.steps[1][S.GRAD_NORM] == 0.6068
    speed = "[INFO:sockeye.training] Epoch[0] Batch [{0}]\tSpeed: 51.34 samples/sec\tperplexity={1}\n"
    trace = read_text(tmp_path, speed.format(50, 45560.615048) + speed.format(100, 40441.141217))
    assert [(s["step"], s["perplexity"]) for s in trace.steps] == [(50, 45560.615048), (100, 40441.141217)]


def test_tinygrads_lines_put_each_value_before_its_name(tmp_path: Path) -> None:
    """tinygrad's MLPerf llama prints ``    5 4.36 s run, 11.9375 loss, 0.000000000003 LR, 1454.57 GB
    used, …`` (tinygrad#13803): the step first, then every value before its name."""
    line = "{0:5} 4.36 s run, {1:.4f} loss, {2:.12f} LR, 1454.57 GB used, 398116.13 GFLOPS\n"
    trace = read_text(tmp_path, line.format(4, 11.875, 2e-12) + line.format(5, 11.9375, 3e-12))
    assert [(s["step"], s[S.ACTOR_LOSS], s[S.LR], s["GB used"]) for s in trace.steps] == [
        (4, 11.875, 2e-12, 1454.57),
        (5, 11.9375, 3e-12, 1454.57),
    ]


def test_paddlenlps_dropped_update_is_an_overflow_at_the_scale_it_tried(tmp_path: Path) -> None:
    """PaddleNLP's trainer warns ``optimizer not run, scale_before: 0.25, scale_after: 0.125`` for
    an update its fp16 scaler dropped (PaddleNLP#7537): a skipped step, its scale below 1."""
    warn = "[2023-11-28 14:31:29,583] [ WARNING] - optimizer not run, scale_before: {0}, scale_after: {1}\n"
    info = (
        "[2023-11-28 14:31:29,586] [    INFO] - loss: {0}, learning_rate: 0.0, global_step: {1}, ppl: 8.1\n"
    )
    text = (
        warn.format(0.25, 0.125)
        + info.format(2.09252715, 18)
        + warn.format(0.125, 0.0625)
        + info.format(2.0462, 19)
    )
    trace = read_text(tmp_path, text)
    assert [(s["step"], s[S.SKIPPED], s[S.LOSS_SCALE]) for s in trace.steps] == [
        (18, 1, 0.125),
        (19, 1, 0.0625),
    ]
    assert {f.type: f.severity for f in diagnose(trace)}["overflow"] == "error"


def test_a_quoted_name_and_value_amid_other_fields_are_read(tmp_path: Path) -> None:
    """PaddleDetection's old logger quotes the loss as a dict's repr does: ``iter: 20, lr: 0.000085,
    'loss': 'nan', eta: 5 days, ...`` (PaddleDetection#5337's SSDLite, NaN from iteration 20)."""
    line = "2022-03-09 15:20:{0}-INFO: iter: {1}, lr: 0.000085, 'loss': '{2}', eta: 0:02:34, ips: 1.6\n"
    trace = read_text(tmp_path, line.format("28,459", 0, "24.061707") + line.format("50,962", 20, "nan"))
    assert [s["step"] for s in trace.steps] == [0, 20] and trace.steps[0][S.ACTOR_LOSS] == 24.061707
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS])
    assert pairs("""step: 3, "grad_norm": "inf", 'lr': '1e-4'""") == {
        "step": 3,
        "grad_norm": math.inf,
        "lr": 1e-4,
    }


def test_nvidia_dllogger_lines_and_llama_recipes_key_value_lines_are_records(tmp_path: Path) -> None:
    """DeepLearningExamples' DLLogger prints ``DLL <date> <time> - PARAMETER loss_scale : 3.7e-09``
    (its step field names no metric); llama-recipes' summary ``Key: avg_eval_loss, Value: inf``."""
    dll = "DLL 2020-05-30 07:35:0{0}.358301 - PARAMETER loss_scale : {1} \n"
    trace = read_text(tmp_path, dll.format(1, 3.725290298461914e-09) + dll.format(2, 1.862645149230957e-09))
    assert [s[S.LOSS_SCALE] for s in trace.steps] == [3.725290298461914e-09, 1.862645149230957e-09]
    summary = "Epoch 1: train_perplexity=2.9854, train_epoch_loss=1.0937\nKey: avg_eval_loss, Value: inf\n"
    trace = read_text(tmp_path, summary)
    assert trace.steps[0]["step"] == 1 and trace.steps[0]["avg_eval_loss"] == math.inf


def test_a_printed_tensor_after_its_counter_and_name_is_that_metric_on_that_step(tmp_path: Path) -> None:
    """``print(i, "ratio.mean()", ratio.mean())`` in a PPO loop (huggingface/trl#454)."""
    line = "   {0} ratio.mean() tensor({1}, device='cuda:0', grad_fn=<MeanBackward0>)\n"
    trace = read_text(tmp_path, line.format(6, "1.") + line.format(7, 0.9986))
    assert [(s["step"], s["ratio.mean()"]) for s in trace.steps] == [(6, 1.0), (7, 0.9986)]


def test_darknets_iteration_lines_are_records_and_an_empty_layers_nans_are_not(tmp_path: Path) -> None:
    """darknet prints ``999: 0.000000, 0.000000 avg, 0.009960 rate, …`` an iteration (the batch's
    loss, its running mean, the learning rate; the iteration's colon is no rank label) between
    a YOLO layer's ``Region 82 Avg IOU: -nan, … count: 0`` lines: means over no box, 0 / 0, in
    any healthy run, so no NaN. A loss of 0 on every iteration is no label read (AlexeyAB/darknet#597)."""
    region = "Region {0} Avg IOU: -nan, Class: -nan, Obj: -nan, No Obj: 0.000001, .5R: -nan, .75R: -nan, "
    region += " count: 0\n"
    line = "{0}: {1:.6f}, {1:.6f} avg, 0.009960 rate, 4.797707 seconds, 63936 images\n"
    text = (
        "".join(region.format(r) for r in (82, 94))
        + line.format(999, 0)
        + region.format(106)
        + line.format(1000, 0)
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "records"
    assert [(s["step"], s[S.ACTOR_LOSS], s[S.LR]) for s in trace.steps] == [
        (999, 0, 0.00996),
        (1000, 0, 0.00996),
    ]
    found = {f.type: f for f in diagnose(trace)}
    assert "nonfinite" not in found and found["zero_grad"].step == 999


def test_an_epochs_lines_share_its_step(tmp_path: Path) -> None:
    """MST's ``===> Epoch 162 Complete: Avg. Loss: 0.014234`` then ``===> Epoch 162: testing psnr =
    34.40``: both lines are epoch 162, one record, the loss on every step (not missing on every
    other one); YOLACT's ``[  1]    1510 || B: 5.515 | … | T: 17.647 ||`` is iteration 1510."""
    text = "".join(
        f"2022-07-20 17:24:00,364 - INFO: ===> Epoch {e} Complete: Avg. Loss: {v} time: 662.37\n"
        f"2022-07-20 17:24:00,803 - INFO: ===> Epoch {e}: testing psnr = 34.40, ssim = 0.938, time: 0.02\n"
        for e, v in ((162, 0.014234), (163, 0.014345))
    )
    trace = read_text(tmp_path, text)
    rows = [(s["step"], s[S.ACTOR_LOSS], s["testing psnr"]) for s in trace.steps]
    assert rows == [(162, 0.014234, 34.4), (163, 0.014345, 34.4)]
    line = "[  1]    {0} || B: 5.515 | C: 3.088 | T: 17.647 || ETA: 197 days, 3:40:56 || timer: 0.3\n"
    trace = read_text(tmp_path, line.format(1510) + line.format(1520))
    assert [s["step"] for s in trace.steps] == [1510, 1520]


def test_a_tab_separated_table_under_a_steps_header_keeps_every_column(tmp_path: Path) -> None:
    """chainerrl's ``scores.txt`` as pasted (chainer/chainerrl#126): a tab-separated ``steps episodes …
    average_loss_entropy`` header over rows of numbers; every column is read on its step, not
    the last one alone."""
    rows = [
        "steps episodes elapsed mean stdev average_loss_policy average_loss_entropy",
        "10000 50 38.70 -1576.97 409.36 0.7159 -1.3004",
        "20000 100 85.01 -1579.31 340.44 0.2218 -1.3320",
    ]
    text = "".join(row.replace(" ", "\t") + "\n" for row in rows)
    trace = read_text(tmp_path, text)
    assert [(s["step"], s["mean"], s["average_loss_policy"]) for s in trace.steps] == [
        (10000, -1576.97, 0.7159),
        (20000, -1579.31, 0.2218),
    ]


def test_tensorflows_nan_hook_is_an_alert_and_no_wrapped_piece(tmp_path: Path) -> None:
    """ELECTRA's TF loop (google-research/electra#70) prints its records at one width, then
    TensorFlow's NaN hook, ``ERROR:tensorflow:Model diverged with loss = NaN.``: a logger's line,
    not the rest of a record the terminal wrapped; it says the loss went NaN after the last one."""
    line = "{0}/1000000 = 0.0%, SPS: 0.4, ELAP: 1:{0}, ETA: 26 days, 11:41:27 - loss: {1}\n"
    text = "".join(line.format(s, v) for s, v in ((30, 45.5664), (31, 45.1209), (32, 44.8707)))
    trace = read_text(tmp_path, text + "ERROR:tensorflow:Model diverged with loss = NaN.\n")
    assert trace.steps[-1][S.ACTOR_LOSS] == 44.8707
    found = {f.type: f for f in diagnose(trace)}["nonfinite"]
    assert (found.step, found.severity) == (32, "error") and "Model diverged" in found.message


def test_espnets_skipped_update_for_a_nan_grad_norm_is_a_nonfinite_alert(tmp_path: Path) -> None:
    """ESPnet2's trainer warns ``The grad norm is nan. Skipping updating the model.`` for each
    update it drops: a non-finite gradient, though the loss its records print is finite."""
    warn = "[user] 2021-04-23 19:22:5{0},420 (trainer:581) WARNING: The grad norm is nan. "
    warn += "Skipping updating the model.\n"
    record = (
        "[user] 2021-04-23 19:22:56,245 (trainer:636) INFO: 2epoch:train:12009-12640batch: "
        "iter_time=3.163e-04, loss=65.129, loss_ctc=144.685, acc=0.065, optim0_lr0=1.485e-05\n"
    )
    trace = read_text(tmp_path, "".join(warn.format(i) for i in range(3)) + record)
    assert trace.steps[0][S.ACTOR_LOSS] == 65.129 and trace.steps[0][S.NONFINITE] == 3
    found = {f.type: f for f in diagnose(trace)}["nonfinite"]
    assert found.severity == "error" and "Skipping updating the model" in found.message


def test_one_metric_a_line_at_its_step_in_brackets_is_read(tmp_path: Path) -> None:
    """crnn-pytorch prints ``train_batch_loss[ 6590 ]:  nan``, one line a logged batch: the
    bracket holds the step."""
    line = "train_batch_loss[ {0} ]:  {1}\n"
    trace = read_text(
        tmp_path, "".join(line.format(s, v) for s, v in ((6570, 1.6885), (6580, 1.9712), (6590, "nan")))
    )
    assert [s["step"] for s in trace.steps] == [6570, 6580, 6590] and trace.steps[0][
        "train_batch_loss"
    ] == 1.6885
    assert math.isnan(trace.steps[2]["train_batch_loss"])


def test_chainers_report_table_is_read_on_its_epochs(tmp_path: Path) -> None:
    """Chainer's PrintReport (chainer/chainer#4424): an ``epoch  main/loss  …  elapsed_time`` header
    over rows that open with a whole epoch (not YOLO's ``e/E``): every column on its epoch,
    ``main/loss`` the loss, the clock no entropy."""
    text = "epoch       main/loss   validation/main/loss  main/accuracy  elapsed_time\n"
    text += "".join(
        f"{e}           {v}     2.30259               0.0994882      {61.067 * e:.3f}\n"
        for e, v in ((1, 2.46634), (2, 2.30256))
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "step-table"
    assert [(s["step"], s[S.ACTOR_LOSS], s["elapsed_time"]) for s in trace.steps] == [
        (1, 2.46634, 61.067),
        (2, 2.30256, 122.134),
    ]


def test_megatron_fields_without_their_colons(tmp_path: Path) -> None:
    """An older Megatron fork (THUDM/Chinese-Transformer-XL#7) prints ``| lm loss 6.758929E+00 |
    loss scale 64.0 |``: the last word of a field is its value, as after a colon."""
    head = " iteration {0:>8}/    3000 | elapsed time per iteration (ms): 12879.0 |"
    line = head + " learning rate 6.300E-06 | lm loss {1} | loss scale {2} |\n"
    trace = read_text(tmp_path, line.format(400, "6.758929E+00", 64.0) + line.format(500, "NAN", 8.0))
    assert trace.header["format"] == "megatron"
    assert (trace.steps[0][S.ACTOR_LOSS], trace.steps[0][S.LOSS_SCALE], trace.steps[1][S.LOSS_SCALE]) == (
        6.758929,
        64.0,
        8.0,
    )
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS]) and trace.steps[0][S.LR] == 6.3e-06


def test_baselines_dqn_table_is_read_by_its_steps_row(tmp_path: Path) -> None:
    """OpenAI baselines' DQN table (openai/baselines#697): rows of words (``mean 100 episode
    reward``) are fields too, ``steps`` the record's step; no longer "no step recognised"."""
    rule = "-" * 38 + "\n"
    box = rule + "| % time spent exploring  | 1        |\n| episodes                | {0}     |\n"
    box += "| mean 100 episode reward | -21      |\n| steps                   | {1}  |\n" + rule
    trace = read_text(tmp_path, box.format(5100, 4008662) + box.format(5200, 4084701))
    rows = [(s["step"], s["episodes"], s[S.REWARD_MEAN]) for s in trace.steps]
    assert rows == [(4008662, 5100, -21), (4084701, 5200, -21)]


def test_wgan_lines_are_records_on_their_epoch_and_batch(tmp_path: Path) -> None:
    """The WGAN / DCGAN examples (martinarjovsky/WassersteinGAN#62): ``[167/1000][555/782][24987]
    Loss_D: -0.772816 Loss_G: -0.022373``; epochs from 0 × batches + batch is the step, and a
    name that opens with ``Loss_`` is a loss (no more "no step recognised")."""
    line = "[{0}/1000][{1}/782][24987] Loss_D: {2} Loss_G: -0.022373 Loss_D_real: -0.19323 Loss_D_fake 0.57\n"
    trace = read_text(tmp_path, line.format(167, 555, -0.772816) + line.format(167, 560, -0.77))
    assert [(s["step"], s["Loss_D"]) for s in trace.steps] == [
        (167 * 782 + 555, -0.772816),
        (167 * 782 + 560, -0.77),
    ]


def test_overflow_lines_of_every_rank_are_one_step(tmp_path: Path) -> None:
    """DeepSpeed prints a step's overflow once per rank (THUDM/GLM#32), naming no step: the ranks'
    lines are one skipped update, and a scale tried and kept at 2^32 is the scaler's hysteresis,
    not its floor."""
    line = "[deepspeed] fp16 dynamic loss scale overflow! Rank {0} Skipping step. "
    line += "Attempted loss scale: 4294967296, reducing to 4294967296\n"
    trace = read_text(tmp_path, "".join(line.format(r) for r in (4, 6, 7, 2, 5, 1, 0, 3)))
    assert len(trace.steps) == 1 and trace.steps[0][S.SKIPPED] == 1
    found = {f.type: f for f in diagnose(trace)}["overflow"]
    assert found.severity == "info" and "floor" not in found.message


def test_pytorch_yolov3_lines_are_records_of_their_loss_terms(tmp_path: Path) -> None:
    """PyTorch-YOLOv3 (eriklindernoren/PyTorch-YOLOv3#13): ``[Epoch 0/30, Batch 323/1313]
    [Losses: x nan, …, conf 0.755184, cls nan, total nan]``; epochs from 0 × batches + batch is the
    step, each term a loss of its own, ``total`` the loss."""
    line = "[Epoch {0}/30, Batch {1}/1313] [Losses: x 0.1, y 0.2, conf 0.755184, cls 0.5, total {2}]\n"
    trace = read_text(tmp_path, line.format(0, 322, 3.2) + line.format(0, 323, "nan"))
    assert [s["step"] for s in trace.steps] == [322, 323] and trace.steps[0]["conf_loss"] == 0.755184
    assert trace.steps[0][S.ACTOR_LOSS] == 3.2 and math.isnan(trace.steps[1][S.ACTOR_LOSS])


def test_keras_bars_pasted_without_their_headers_are_the_epochs(tmp_path: Path) -> None:
    """Keras's finished bars pasted without the ``Epoch e/E`` lines between them (a line an
    epoch, the same count on each): numbered as epochs from 1, not merged into one step; bars
    still running among them are counted as before."""
    bar = "1875/1875 [==============================] - 5s 3ms/step - loss: {} - accuracy: 0.81\n"
    trace = read_text(tmp_path, "".join(bar.format(v) for v in ("0.49", "0.37", "nan")))
    assert [s["step"] for s in trace.steps] == [1, 2, 3] and math.isnan(trace.steps[2][S.ACTOR_LOSS])
    assert not any("appeared in more than one" in n for n in trace.notes)
    running = "900/1875 [=============>................] - ETA: 2s - loss: 0.52\n" + bar.format("0.49")
    assert [s["step"] for s in read_text(tmp_path, running).steps] == [900, 1875]


def test_keras_progress_lines_count_on_from_their_epoch_header(tmp_path: Path) -> None:
    """Keras prints ``Epoch e/E`` over each epoch's ``i/n [====] - … - loss: …`` lines: every
    epoch's last line has the same counter, so the header numbers them (epochs from 1)."""
    text = (
        "Epoch 1/3\n200/200 [==============================] - 4s 20ms/step - loss: 0.71 - acc: 0.55\n"
        "Epoch 2/3\n100/200 [==============>...............] - ETA: 2s - loss: 0.64\n"
        "200/200 [==============================] - 4s 20ms/step - loss: nan - acc: 0.50\n"
        "Epoch 3/3\n200/200 [==============================] - 4s 20ms/step - loss: 0.52 - acc: 0.71\n"
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [200, 300, 400, 600]
    assert math.isnan(trace.steps[2][S.ACTOR_LOSS]) and trace.steps[3][S.ACTOR_LOSS] == 0.52
    assert not any("appeared in more than one" in n for n in trace.notes)


def test_a_pasted_two_column_table_without_an_epoch_is_one_snapshot(tmp_path: Path) -> None:
    """rlkit's table as a user pastes a part of it (rlkit#50): no rule, no ``Epoch`` row, names
    with spaces; one record at step 0, each name as logged (the first Q-network's loss as the
    critic's, rlkit's table of the key map), and prose left out."""
    text = (
        "the critic blows up after a while:\n"
        "replay_buffer/size                       52000\n"
        "trainer/QF1 Loss                             7.1e+12\n"
        "trainer/Policy Loss                         -3.3e+06\n"
        "exploration/Average Returns              -140.25\n"
    )
    (step,) = read_text(tmp_path, text).steps
    assert step["step"] == 0 and step[S.VF_LOSS] == 7.1e12
    assert step["exploration/Average Returns"] == -140.25 and step["replay_buffer/size"] == 52000


def test_bars_whose_logged_step_starts_over_are_two_runs(tmp_path: Path) -> None:
    """A postfix's own ``global_step`` is the step, and where it starts over a second run begins:
    its steps are not merged into the first run's."""
    bar = "Epoch 0:   0%|          | {n}/500 [00:0{n}<10:00,  1.2s/it, loss={loss}, global_step={step}.000]\n"
    first = [bar.format(n=n, loss=loss, step=n - 1) for n, loss in ((1, 9.1), (2, 8.7), (3, 8.4))]
    again = [bar.format(n=n, loss=loss, step=n - 1) for n, loss in ((1, 9.2), (2, "nan"))]
    path = tmp_path / "bars.log"
    path.write_text("".join(first + again), encoding="utf-8")
    runs = read_runs(path)
    assert [[s["step"] for s in run.steps] for run in runs] == [[0, 1, 2], [0, 1]]
    assert runs[0].steps[1][S.ACTOR_LOSS] == 8.7 and math.isnan(runs[1].steps[1][S.ACTOR_LOSS])


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("The training loss for Epoch {i} is {v}", S.ACTOR_LOSS),  # LXMERT's reference log (lxmert#22)
        ("Loss at step {i} is {v}", S.ACTOR_LOSS),
        ("At iteration {i}, the loss is {v}", S.ACTOR_LOSS),
        ("loss for epoch {i} = {v}", S.ACTOR_LOSS),
        ("Epoch {i} loss: {v}", S.ACTOR_LOSS),
        ("Epoch {i} loss is {v}", S.ACTOR_LOSS),
        ("Epoch {i}/20 loss: {v}", S.ACTOR_LOSS),
        ("[Epoch {i}] loss: {v}", S.ACTOR_LOSS),
        ("Epoch [{i}/20], Loss: {v}", S.ACTOR_LOSS),
        ("Epoch {i}\tLoss {v}", S.ACTOR_LOSS),
        ("epoch {i} train_loss {v}", S.ACTOR_LOSS),
        ("Episode {i} reward: {v}", S.REWARD_MEAN),
        ("Ep {i} | Return {v}", S.REWARD_MEAN),
        ("Episode: {i}, Reward: {v}, Steps: 200", S.REWARD_MEAN),
        ("Epoch {i} finished. Loss: {v}", S.ACTOR_LOSS),
        ("Epoch {i} completed with loss {v}", S.ACTOR_LOSS),
    ],
)
def test_a_loops_print_of_its_counter_and_a_metric_is_a_record_on_that_count(
    tmp_path: Path, line: str, key: str
) -> None:
    """What a loop prints once an epoch, in prose or not, is a record on the epoch it names:
    not one snapshot of names that hold the counter (``Epoch 3 loss``), not a metric ``is``."""
    values = [7.0 - 0.25 * i for i in range(1, 13)]
    text = "".join(line.format(i=i, v=v) + "\n" for i, v in enumerate(values, 1))
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == list(range(1, 13))
    assert [s[key] for s in trace.steps] == values


def test_the_pytorch_tutorials_epoch_and_step_count_across_epochs(tmp_path: Path) -> None:
    text = "".join(
        f"Epoch [{e}/5], Step [{i}/600], Loss: {0.5 / e + 0.001 * i:.4f}\n"
        for e in (1, 2)
        for i in (100, 200, 300)
    )
    assert [s["step"] for s in read_text(tmp_path, text).steps] == [100, 200, 300, 700, 800, 900]


def test_a_loop_that_prints_its_epoch_within_the_epoch_keeps_every_print(tmp_path: Path) -> None:
    """A loop that prints its epoch on each line it logs within the epoch: every print its own
    record, in order, keeping its epoch (on the epoch they would merge, a later value hiding the
    NaN and the climb within it)."""
    losses = {1: ["2.31", "2.20", "2.12"], 2: ["2.05", "nan", "1.98"], 3: ["1.95", "1.90", "1.88"]}
    text = "".join(f"Epoch {e}: loss {v}\n" for e, printed in losses.items() for v in printed)
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == list(range(9))
    assert [s["epoch"] for s in trace.steps] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert math.isnan(trace.steps[4][S.ACTOR_LOSS]) and trace.steps[5][S.ACTOR_LOSS] == 1.98
    assert any("prints several lines an epoch" in note for note in trace.notes)


def test_a_nan_a_later_print_of_its_step_logs_finite_is_not_hidden(tmp_path: Path) -> None:
    """Two prints of one step (a bar redrawn, another rank's line): merged, but a NaN stays."""
    bar = "{0}%|█ | {1}/100 [00:10<01:30,  1.0it/s, loss={2}]\n"
    text = (
        bar.format(5, 5, "2.31")
        + bar.format(6, 6, "nan")
        + bar.format(6, 6, "2.20")
        + bar.format(7, 7, "2.1")
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [5, 6, 7] and math.isnan(trace.steps[1][S.ACTOR_LOSS])
    assert any("never over a NaN/Inf" in note for note in trace.notes)


def test_a_sentence_that_says_the_loss_is_infinity_reads_it(tmp_path: Path) -> None:
    """BigDL's optimizer (BigDL#1480): ``Loss is Infinity.`` ends a sentence, and is the loss."""
    line = (
        "[Epoch 64 {n}/1281167][Iteration {i}] Throughput is 408.4 records/second. "
        "Loss is {loss}. Current learning rate is 0.0463.\n"
    )
    text = "".join(
        line.format(n=736512 + 1792 * k, i=45457 + k, loss=v)
        for k, v in enumerate(("1.26", "1.31", "Infinity"))
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [45457, 45458, 45459]
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [1.26, 1.31, math.inf]
    assert trace.steps[0][S.LR] == 0.0463


def test_the_word_language_model_examples_batches_count_across_epochs(tmp_path: Path) -> None:
    """PyTorch's word language model example (SDLM#2): ``| epoch 6 | 400/ 700 batches | … | loss
    7.66 | ppl 2121.22`` (a name, a gap, its value), and the epoch's validation line after it on
    that step, under its own names."""
    text = (
        "| epoch   1 |   200/  700 batches | lr 20.00 | ms/batch 135.70 | loss  7.66 | ppl  2121.22\n"
        "| epoch   1 |   400/  700 batches | lr 20.00 | ms/batch 135.26 | loss  7.61 | ppl  2017.40\n"
        "-----------------------------------------------------------------------------------------\n"
        "| end of epoch   1 | time: 109.38s | valid loss  7.68 | valid ppl  2160.77\n"
        "| epoch   2 |   200/  700 batches | lr 20.00 | ms/batch 137.22 | loss  7.59 | ppl  1977.34\n"
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [200, 400, 900]
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [7.66, 7.61, 7.59]
    assert trace.steps[1]["valid loss"] == 7.68 and trace.steps[2]["ppl"] == 1977.34


def test_lightgbms_rounds_keep_each_data_sets_metric_and_are_not_unwrapped(tmp_path: Path) -> None:
    """LightGBM#742: ``training's binary_logloss`` and ``valid_1's binary_logloss`` are two metrics;
    lines of one fixed width, the widest, followed by a sentence once, are no terminal's wrap."""
    row = "[{0}]\ttraining's binary_logloss: {1}\tvalid_1's binary_logloss: {2}\n"
    text = row.format(1, "0.712679", "0.712513") + "Train until valid scores didn't improve in 100 rounds.\n"
    text += row.format(2, "0.732192", "0.731889") + row.format(3, "0.751667", "0.751244")
    trace = read_text(tmp_path, text)
    assert [s["training/binary_logloss"] for s in trace.steps] == [0.712679, 0.732192, 0.751667]
    assert [s["valid_1/binary_logloss"] for s in trace.steps] == [0.712513, 0.731889, 0.751244]


@pytest.mark.parametrize(
    ("line", "first"),
    [
        ("Epoch {i} Loss {v} Accuracy 0.4000", 1),  # a NaN after a bare name: the same record's
        ("train: epoch {i} loss {v} acc 0.4", 1),
        ("episode {i} total_reward {v} epsilon 0.5", 1),
        ("Epoch {i}/12\n100/100 - 3s - loss: {v} - accuracy: 0.8000", 100),  # Keras, verbose=2
        ("[{j}/1200] loss: {v}", 100),
        ("({j}/1200) loss: {v}", 100),
        ("It {j}: loss={v}", 100),
        ("epoch {i} step {j} loss {v} grad_norm 1.0", 100),  # names and values one space apart
        ("{i}, {v}", 1),  # print(epoch, loss, sep=", ")
        ("Epoch #{i} loss={v}", 1),
        ("(Epoch {i}) Loss: {v}", 1),
        ("Round {i}: loss {v}", 1),  # a federated round
        ("Step {j}: {{'loss': {v}, 'lr': 1e-05}}", 100),  # a dict record after the step it names
        ("Epoch {i}: {{'loss': {v}, 'acc': 0.5}}", 1),
    ],
)
def test_a_nan_a_loop_prints_is_on_the_record_of_its_count(tmp_path: Path, line: str, first: int) -> None:
    """Twelve prints, the eighth NaN: each its own record on the count it names (a line whose NaN
    read as no value would join the record before, where a finite loss hides it)."""
    values = [f"{7.0 - 0.3 * i:.4f}" if i != 8 else "nan" for i in range(1, 13)]
    text = "".join(line.format(i=i, j=100 * i, v=v) + "\n" for i, v in enumerate(values, 1))
    trace = read_text(tmp_path, text)
    steps = [s["step"] for s in trace.steps]
    assert len(steps) == 12 and steps[0] == first
    (found,) = [f for f in diagnose(trace) if f.type == "nonfinite"]
    assert found.step == steps[7]


@pytest.mark.parametrize(
    ("line", "keys"),
    [
        ("{i} [D loss: 0.6931, acc.: 50.00%] [G loss: 0.7{i}]", {"D loss", "D acc", "G loss"}),  # Keras-GAN
        ("{i} [D loss: 7.97 | D Accuracy: 50.0] [G loss: 1.2e-07]", {"D loss", "D Accuracy", "G loss"}),
    ],
)
def test_a_gans_bracketed_groups_keep_each_networks_names(tmp_path: Path, line: str, keys: set[str]) -> None:
    """Keras-GAN's ``5 [D loss: 0.693, acc.: 50.00%] [G loss: 0.71]``: the counter is the step, and
    a group's other names are its network's (``D acc``), read as a percentage's number."""
    trace = read_text(tmp_path, "".join(line.format(i=i) + "\n" for i in range(100, 106)))
    assert [s["step"] for s in trace.steps] == list(range(100, 106))
    assert set(trace.steps[0]) - {"step", "raw"} == keys and trace.steps[0]["D loss"] in (0.6931, 7.97)
    acc = next(key for key in keys if "acc" in key.lower())
    zero = {f.type: f for f in diagnose(trace)}["zero_grad"]  # a discriminator at exactly 50 %: one answer
    assert zero.evidence["key"] == acc and zero.evidence["classes"] == 2


def test_an_old_keras_bar_that_counts_past_its_end_is_an_epoch(tmp_path: Path) -> None:
    bar = "215424/215375 [==============================] - 418s - train loss: {}\n"
    trace = read_text(tmp_path, "".join(bar.format(x) for x in (3.7656, 3.7264, 3.7595)))
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(1, 3.7656), (2, 3.7264), (3, 3.7595)]


def test_basicsr_iterations_with_thousands_separators_and_its_l_losses(tmp_path: Path) -> None:
    """GFPGAN#270: ``[epoch:  0, iter:  25,377, lr:(2.000e-04,)] … l_g_pix: 0.0078``; its ``l_``
    terms are losses, one at 1.4e27 a divergence."""
    line = "2022-09-26 16:29:0{0},193 INFO: [train..][epoch:  0, iter:  {1}, lr:(2.000e-04,)] l_g_pix: {2}\n"
    rows = (
        ("25,377", "0.0078"),
        ("25,378", "85927904.0000"),
        ("25,379", "1374784627652024264225193984.0000"),
    )
    trace = read_text(tmp_path, "".join(line.format(i, *row) for i, row in enumerate(rows)))
    assert [s["step"] for s in trace.steps] == [25377, 25378, 25379]
    found = {f.type: f for f in diagnose(trace)}["loss_divergence"]
    assert found.step == 25379 and found.severity == "error" and "l_g_pix" in found.message


def test_a_dict_printed_as_a_fields_value_is_no_dict_record(tmp_path: Path) -> None:
    """InternEvo's ``step=642 loss=2.17 … grad_norm={'0_default': 2.15, '1_fp32': 0.0} …``: a line of
    ``key=value`` fields, one of which prints a dict, not an HF record."""
    line = "INFO pipeline.py:770 -- tflops=229.6 step={0} loss={1} grad_norm={{'0_default': 2.1}} acc=0.55\n"
    trace = read_text(tmp_path, line.format(642, 2.1725) + line.format(643, 2.0464))
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(642, 2.1725), (643, 2.0464)]


def test_verls_sft_tracker_lines_are_one_record_of_their_step(tmp_path: Path) -> None:
    line = "[243/256] : (avg (std), med) = ( {0} [ 0.0000] ( 0.1269), {0})  # {1}\n"
    trace = read_text(
        tmp_path, line.format("0.2912", "train/grad_norm") + line.format("0.0199", "train/loss")
    )
    (step,) = trace.steps
    assert (step["step"], step[S.GRAD_NORM], step[S.ACTOR_LOSS]) == (243, 0.2912, 0.0199)


def test_a_csv_loggers_time_stamp_column_is_left_out(tmp_path: Path) -> None:
    """Lightning's ``metrics.csv`` with a ``created_at`` column (StableSR#161)."""
    text = "train/loss_step,global_step,epoch,created_at\n"
    text += "0.2514,49.0,0,2025-11-07 06:02:10.484610\n0.0960,99.0,0,2025-11-07 06:09:01.771131\n"
    trace = read_text(tmp_path, text)
    assert [(s["step"], s["train/loss_step"]) for s in trace.steps] == [(49, 0.2514), (99, 0.096)]


def test_nemos_unfilled_bar_loss_beside_its_reduced_train_loss_is_left_out(tmp_path: Path) -> None:
    """NeMo 1.x's Megatron models report ``reduced_train_loss``; Lightning's ``loss`` in the same bar
    stays NaN (aws-neuron/neuronx-nemo-megatron#28): no non-finite loss."""
    bar = "Epoch 0:   3%|▎ | {0}/20101 [2:12:19<76:15:08, 14.05s/it, loss=nan, reduced_train_loss={1}]\n"
    trace = read_text(tmp_path, bar.format(565, 3.910) + bar.format(566, 3.905))
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [3.91, 3.905] and "loss" not in trace.steps[0]
    assert "nonfinite" not in {f.type for f in diagnose(trace)}
    assert any("Lightning's running loss" in note for note in trace.notes)


def test_gaussian_splattings_evaluations_keep_each_sets_metrics(tmp_path: Path) -> None:
    """3D Gaussian Splatting's ``[ITER 7000] Evaluating test: L1 0.4732 PSNR 5.39``, then the train
    set's line: one record of that iteration, each set's L1 and PSNR under its name."""
    line = "[ITER {0}] Evaluating {1}: L1 {2} PSNR {3} [10/02 10:12:07]\n"
    text = line.format(7000, "test", 0.4732, 5.3944) + line.format(7000, "train", 0.4752, 5.3429)
    (step,) = read_text(tmp_path, text + line.format(30000, "test", 0.4732, 5.3944)).steps[:1]
    assert (step["step"], step["test/L1"], step["train/L1"], step["train/PSNR"]) == (
        7000,
        0.4732,
        0.4752,
        5.3429,
    )


def test_a_table_on_its_side_reads_a_column_a_step(tmp_path: Path) -> None:
    """A PR's Markdown table of a few steps (NeMo-RL): ``| step | 1 | 2 | … |`` over ``| reward |
    .406 | …``, a last column that is no step (``→ eval@20``) left out; a second table continues."""
    text = (
        "**Training reward (per step):**\n\n| step | 1 | 2 | 3 |\n|---|---|---|---|\n"
        "| reward | .406 | .441 | .406 |\n\n"
        "| step | 4 | 5 | → eval@6 |\n|---|---|---|---|\n| reward | .434 | .520 | **0.789** |\n"
    )
    trace = read_text(tmp_path, text)
    assert [(s["step"], s[S.REWARD_MEAN]) for s in trace.steps] == [
        (1, 0.406),
        (2, 0.441),
        (3, 0.406),
        (4, 0.434),
        (5, 0.52),
    ]


def test_a_held_out_metric_line_behind_a_logger_prefix_is_a_record(tmp_path: Path) -> None:
    """kur's ``[INFO 2017-03-02 18:11:38,332 kur.model.executor:175] Validation loss: 155.686``."""
    line = '[INFO 2017-03-02 18:11:38,332 kur.model.executor:175] Validation loss: {}\nPrediction: "i se"\n'
    trace = read_text(tmp_path, line.format(155.686) + line.format(159.761))
    assert [s["Validation loss"] for s in trace.steps] == [155.686, 159.761]


def test_a_splits_name_and_a_percentage_sign_stay_with_their_field(tmp_path: Path) -> None:
    """tch-rs's ``epoch:    1 test acc: 60.67%``: the held-out accuracy under its own name, and the
    percentage's number; a training loss beside a validation one keeps its own name too."""
    text = "".join(f"epoch: {e:4d} test acc: {a}%\n" for e, a in ((1, "60.67"), (2, "71.65"), (3, "72.22")))
    assert [s["test acc"] for s in read_text(tmp_path, text).steps] == [60.67, 71.65, 72.22]


def test_mxnet_speedometer_batches_count_on_across_epochs(tmp_path: Path) -> None:
    """MXNet's ``Epoch[5] Batch [700]``: the batch starts over each epoch, and is counted on from
    the last count before it (the next epoch's ``Batch [100]`` a hundred batches on)."""
    line = "INFO:root:Epoch[{0}] Batch [{1}]  Speed: 52137.26 samples/sec     Train-accuracy={2}\n"
    text = "".join(line.format(e, b, 0.0975) for e in (5, 6) for b in (100, 200))
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [100, 200, 300, 400]
    assert any("counted on across epochs" in note for note in trace.notes)


def test_an_epochs_step_printed_twice_is_one_record_and_the_next_epoch_another(tmp_path: Path) -> None:
    """mindyolo prints ``Epoch 35/300, Step 4/4`` twice an epoch (its loss, then its step time)."""
    text = "".join(
        f"[INFO] Epoch {e}/300, Step 4/4, imgsize (640, 640), loss: {x}, cur_lr: 0.0088\n"
        f"[INFO] Epoch {e}/300, Step 4/4, step time: 23330.36 ms\n"
        for e, x in ((35, 0.2778), (36, 0.2732), (37, 0.2813))
    )
    trace = read_text(tmp_path, text)
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [0.2778, 0.2732, 0.2813]


def test_a_counter_that_opens_each_line_with_a_colon_is_no_rank_label(tmp_path: Path) -> None:
    """CatBoost's ``58:     learn: 0.1234829`` and a DCGAN's ``48: [D loss: …]`` open each line with a
    count that rises to 32 and beyond: the step, where ``srun -l``'s `` 0: `` is a rank, taken off."""
    text = "".join(f"{i}:     learn: {0.13 - 0.001 * i:.7f}        total: 6m 47s\n" for i in range(56, 61))
    assert [s["step"] for s in read_text(tmp_path, text).steps] == [56, 57, 58, 59, 60]
    ranks = "".join(f"{r}: step {s} loss {2.0 - 0.1 * s}\n" for s in (1, 2) for r in (0, 1))
    assert [s["step"] for s in read_text(tmp_path, ranks).steps] == [1, 2]


def test_json_lines_a_logger_wrote_with_pythons_nan_are_read(tmp_path: Path) -> None:
    """An f-string's JSON writes a NaN as Python prints it (``{"step": 3, "train/loss": nan}``), no
    JSON; read as ``json.dumps`` writes it (``NaN``), the NaN on its record, not a skipped line."""
    text = "".join(
        f'{{"step": {i}, "train/loss": {"nan" if i == 3 else 7 - 0.3 * i}}}\n' for i in range(1, 5)
    )
    trace = read_text(tmp_path, text, "log.jsonl")
    assert [s["step"] for s in trace.steps] == [1, 2, 3, 4] and math.isnan(trace.steps[2][S.ACTOR_LOSS])


def test_a_table_pasted_without_its_header_row_is_read_on_its_rising_column(tmp_path: Path) -> None:
    """WeSpeaker's rows behind a logger's prefix, the header row left out of the paste
    (wespeaker#426): the columns numbered, the one rising on every row the step; a NaN cell found."""
    row = "[ INFO : 2025-06-14 04:05:47 ] - |       150|     {0}|5.0113e-05|       0.2|    {1}|    78.579|\n"
    text = "".join(row.format(16300 + 100 * i, x) for i, x in enumerate(["1.1553", "nan", "1.1558"]))
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [16300, 16400, 16500] and trace.steps[0]["column 5"] == 1.1553
    assert {f.type for f in diagnose(trace)} == {"nonfinite"}


def test_a_long_line_of_one_character_costs_its_length(tmp_path: Path) -> None:
    """A line of 128 kB of digits, spaces, or one short piece repeated (the patterns that read
    numbers and gaps once split such runs every way from every character: minutes for 4 kB,
    hours for a megabyte) ends in one sentence or findings, in a bounded time."""
    shapes = [
        ("", "1"),
        ("Epoch: [", "1"),
        ("step ", " "),
        ("'loss': ", " "),
        ("", "a(1)"),
        ("", "a|"),
        ("loss: ", "1 "),
    ]
    paths = []
    for i, (head, unit) in enumerate(shapes):
        paths.append(tmp_path / f"line{i}.log")
        paths[-1].write_text(head + unit * (128_000 // len(unit)) + "\n")
    child = (
        "import sys\nfrom moescope.analyze.log_diagnosis import diagnose_log\n"
        "from moescope.errors import MoescopeError\n"
        "for p in sys.argv[1:]:\n    try:\n        diagnose_log(p); print('findings')\n"
        "    except MoescopeError:\n        print('sentence')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, *map(str, paths)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(done.stdout.split()) == len(shapes)


def test_a_dict_record_after_a_step_and_a_label_is_read(tmp_path: Path) -> None:
    """VATT (google-research#1497): ``Train Step: 3350/100000  / training metric = {'model_loss': …}``
    behind glog's prefix, the step over its total before the label."""
    line = (
        "I0308 03:53:33.468915 139913490419840 base.py:350] Train Step: {s}/100000  / training metric = "
        "{{'model_loss': {v}, 'top_1_accuracy': 0.29}}\n"
    )
    trace = read_text(tmp_path, line.format(s=3350, v=5.96) + line.format(s=3400, v=8.74))
    assert [(s["step"], s["model_loss"]) for s in trace.steps] == [(3350, 5.96), (3400, 8.74)]


def test_a_headerless_table_each_rank_printed_is_read_on_its_never_falling_column(tmp_path: Path) -> None:
    """wespeaker#396: every rank of a multi-GPU run printed the row, so the batch column repeats
    (``|  149|  1000|…`` twice, then ``|  149|  1066|…``): the column that never falls and takes the
    most values is the step, not the epoch's, and a step's rows are one record."""
    row = "[ INFO : 2024-12-24 21:51:06,518 ] - |       149|      {0}| 0.01728|  0.2|    {1}|    71.647|\n"
    text = "".join(row.format(b, x) for b, x in ((1000, "1.4961"), (1000, "1.4996"), (1066, "1.5084")))
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "step-table" and [s["step"] for s in trace.steps] == [1000, 1066]
    assert any("never falling" in note for note in trace.notes)


def test_a_headerless_table_behind_a_logger_with_counts_over_totals_is_read(tmp_path: Path) -> None:
    """JDE (Towards-Realtime-MOT#87): ``2020-02-09 16:22:54 [INFO]:    2/272    400/1963     0.647
    …``, the logger's prefix passed over and each count over its total read as the count: the
    batch the step; DeepCTR's ``batch: 387 nan 0.6595617 0.72703314`` likewise, on its own batch."""
    row = "2020-02-09 16:22:54 [INFO]:    2/272    {0}/1963     0.647    0.0538      20.9     {1}      20.2\n"
    trace = read_text(
        tmp_path, "".join(row.format(b, t) for b, t in ((400, -2.24), (440, -2.37), (480, -2.46)))
    )
    assert [s["step"] for s in trace.steps] == [400, 440, 480] and trace.steps[1]["column 6"] == -2.37
    assert trace.steps[0]["column 1"] == 2
    text = "".join(
        f"batch: {b} {v} 0.6280691 0.7282944\n" for b, v in ((385, "0.62"), (386, "0.69"), (387, "nan"))
    )
    assert [f.step for f in diagnose(read_text(tmp_path, text)) if f.type == "nonfinite"] == [387]


def test_chainers_log_report_is_read_on_its_iteration_with_blank_columns_left_blank(tmp_path: Path) -> None:
    """see#67: Chainer's ``PrintReport``, ``epoch  iteration  main/loss …`` over rows that leave
    the validation columns blank between evaluations: the iteration is the step (the epoch repeats
    across its rows), and a value sits under the column it is printed below, not the next free one."""
    head = (
        "epoch       iteration   main/loss   main/accuracy  lr          fast_validation/main/loss  "
        "validation/main/loss  validation/main/accuracy\n"
    )
    text = head + (
        "0           100         2.77838     0              3.08566e-05\n"
        "0           200         2.3851      0              4.25853e-05\n"
        "1           300         2.25634     0              6.27392e-05"
        "                                        2.26484               0\n"
    )
    trace = read_text(tmp_path, text)
    assert trace.header["format"] == "step-table"
    assert [(s["step"], s["epoch"]) for s in trace.steps] == [(100, 0), (200, 0), (300, 1)]
    assert (
        trace.steps[2]["validation/main/loss"] == 2.26484
        and "fast_validation/main/loss" not in trace.steps[2]
    )


def test_a_headerless_table_of_bracketed_arrays_is_read(tmp_path: Path) -> None:
    """deepxde#2073: DeepXDE's rows pasted without their ``Step  Train loss  Test loss  Test metric``
    header, each loss an array in brackets: one cell each, read as its mean."""
    row = "{0}      [1.22e-03, 2.16e-04]    [1.26e-03, 3.89e-01]    [1.03e-02, {1}]    \n"
    trace = read_text(
        tmp_path, "".join(row.format(3000 + 200 * i, v) for i, v in enumerate(("3.66e-02",) * 3))
    )
    assert [s["step"] for s in trace.steps] == [3000, 3200, 3400]
    assert trace.steps[0]["column 2"] == pytest.approx(7.18e-04)


def test_a_config_dict_is_no_record_and_an_epochs_mean_grad_norm_is_the_grad_norm(tmp_path: Path) -> None:
    """ConsistentTeacher#7: mmengine's ``initialize ResNet with init_cfg {'type': 'Pretrained', …}``
    lines above two iteration lines are a config, no dict records of a trainer; wandb/senpai#2761's
    results table names an epoch's ``grad_norm_mean``."""
    init = (
        "2023-04-23 12:49:26,187 - mmdet.ssod - INFO - initialize ResNet with init_cfg "
        "{'type': 'Pretrained', 'checkpoint': 'torchvision://resnet50'}\n"
    )
    iteration = (
        "2023-04-23 12:50:24,305 - mmdet.ssod - INFO - Iter [{0}/20000]\tlr: 9.890e-04, eta: 4:02:58, "
        "time: 0.731, loss: 0.0000, grad_norm: 0.0000\n"
    )
    trace = read_text(tmp_path, init * 4 + iteration.format(50) + iteration.format(100))
    assert trace.header["format"] == "records" and [s["step"] for s in trace.steps] == [50, 100]
    table = "| Epoch | grad_norm_mean |\n|---|---|\n| 85 | 0.48 |\n| 86 | 0.45 |\n"
    assert read_text(tmp_path, table).steps[1][S.GRAD_NORM] == 0.45


def test_a_csv_table_with_a_clock_column_and_a_trailing_comma_is_read(tmp_path: Path) -> None:
    """AdaAD#2: ``epoch, train_loss, test_loss, …, time`` over ``0, 26.00907, 158.20959, …,
    Aug16-15:41:04,``: the clock, a date glued to it, is no number and no reason to skip the row,
    and the comma that ends each row opens no column."""
    text = "epoch, train_loss, test_loss, test_clean_acc, time\n" + "".join(
        f"{e}, {26 - e:.5f}, {158 - e:.5f}, {45 + e:.5f}, Aug16-1{5 + e}:41:04,\n" for e in range(3)
    )
    trace = read_text(tmp_path, text)
    assert [s["step"] for s in trace.steps] == [0, 1, 2] and trace.steps[2][S.ACTOR_LOSS] == 24.0


def test_an_epoch_over_its_total_printed_on_every_line_of_the_epoch_is_indexed_in_order(
    tmp_path: Path,
) -> None:
    """OneFlow's quick start prints ``Epoch [19/20], Loss: 2.2955`` on every report of the epoch: the
    records keep their order and their epoch, not merged into one a later value replaces."""
    text = "".join(f"Epoch [{e}/20], Loss: {2.3 + 0.001 * k:.4f}\n" for e in (19, 20) for k in range(3))
    trace = read_text(tmp_path, text)
    assert len(trace.steps) == 6 and [s["epoch"] for s in trace.steps] == [19, 19, 19, 20, 20, 20]


def test_a_pretty_printed_json_dicts_lines_are_read_as_metrics(tmp_path: Path) -> None:
    """Open-GroundingDino#98: two lines of the epoch logs' pretty-printed JSON, ``"train_loss":
    6.058688819752953,`` and the next epoch's, pasted alone: a number attached to a metric's name on
    each, read as a series, not "no step recognised"."""
    trace = read_text(tmp_path, ' "train_loss": 6.058688819752953, \n"train_loss": 6.067786134047315,\n')
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [6.058688819752953, 6.067786134047315]


def test_a_validation_line_names_its_split_for_every_metric_on_it(tmp_path: Path) -> None:
    """A COVID X-ray loop: ``train loss: 6.1543, acc: 0.1207`` then ``validation loss: 6.2869, acc:
    0.1163``: the second accuracy is the validation's, and the two lines one record."""
    text = "".join(
        f"Epoch {e}/50\n----------\ntrain loss: 6.15{e}, acc: 0.12{e}\n"
        f"validation loss: 6.28{e}, acc: 0.11{e}\n"
        for e in (47, 48)
    )
    trace = read_text(tmp_path, text)
    assert (
        len(trace.steps) == 2
        and trace.steps[0]["validation acc"] == 0.1147
        and trace.steps[0]["acc"] == 0.1247
    )


def test_one_name_over_a_column_of_numbers_is_a_table_but_nan_is_no_name(tmp_path: Path) -> None:
    """vision#2110: ResNeXt-50's top-1 per epoch pasted under ``Top-1``; a column of ``Nan`` lines is
    values, not a name over them."""
    trace = read_text(tmp_path, "Top-1\n16.894\n32.488\n36.116\n40.272\n")
    assert trace.header["format"] == "step-table" and [s["Top-1"] for s in trace.steps][-1] == 40.272
    assert read_text(tmp_path, "- inf\nNan\nNan\nNan\nNan\n").header["format"] != "step-table"


def test_spacys_e_and_hash_columns_are_its_epoch_and_step(tmp_path: Path) -> None:
    """spaCy 3's ``E    #       LOSS TRANS...  LOSS NER  ENTS_F …`` table: ``#`` the step, ``E`` the
    epoch (read as an entropy log's columns before)."""
    text = (
        "E    #       LOSS TRANS...  LOSS NER  ENTS_F  ENTS_P  ENTS_R  SCORE \n"
        "---  ------  -------------  --------  ------  ------  ------  ------\n"
        "  0       0         179.58    273.93    0.00    0.00    0.00    0.00\n"
        "  2     200      124605.61  17320.93    0.00    0.00    0.00    0.00\n"
    )
    trace = read_text(tmp_path, text)
    assert [(s["step"], s["epoch"]) for s in trace.steps] == [
        (0, 0),
        (200, 2),
    ] and S.ENTROPY not in trace.steps[0]
