"""Readers: every format read from realistic pastes, the key map, detection, bad input, fuzz."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moescope import schema as S
from moescope.analyze.readers import FORMATS, KEY_MAP, detect_format, keymap, read_log, records
from moescope.analyze.readers._text import parse_number
from moescope.errors import MoescopeError
from moescope.traces import Trace, TraceWriter

LOGS = Path(__file__).parent / "data" / "logs"
DOCS = Path(__file__).parent.parent / "docs" / "readers.md"


def steps_of(trace: Trace) -> dict[int, dict]:
    return {s["step"]: s for s in trace.steps}


def read_fixture(name: str, framework: str | None, steps: list[int]) -> tuple[Trace, dict[int, dict]]:
    """Read a fixture, check who wrote it and which steps it has; the steps by number."""
    trace = read_log(LOGS / name)
    assert trace.header["framework"] == framework
    assert [s["step"] for s in trace.steps] == steps
    return trace, steps_of(trace)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- detection ------------------------------------------------------------------------------------

FIXTURE_FORMATS = {
    "verl_console_new.log": "verl-console",
    "verl_console_old.log": "verl-console",
    "verl_metrics.jsonl": "verl-jsonl",
    "trainer_state.json": "trainer-state",
    "trl_console.log": "trl-console",
    "swift_logging.jsonl": "jsonl",
    "roll_stdout.log": "roll",
    "megatron.log": "megatron",
    "entropy_log.txt": "entropy-log",
    "expert_load.log": "expert-load",
    "plain_nan.log": "records",  # "iteration 2: the loss is NaN": a NaN loss on step 2
    "plain_grep.log": "plain",
    "mixed.log": "verl-console",
    "prime_rl.log": "step-lines",
    "generic_steps.log": "step-lines",
    "nemo_rl_console.log": "key-values",
    "verl_snapshot.txt": "key-values",
    "openrlhf_console.log": "openrlhf-console",
    "xtuner_iter.log": "records",
    "wandb_summary.log": "wandb-summary",
    "topk_indices.log": "topk-indices",
    "trl_notebook_table.log": "step-table",
}


@pytest.mark.parametrize(("name", "fmt"), sorted(FIXTURE_FORMATS.items()))
def test_detects_every_fixture_and_reads_it_under_that_name(name: str, fmt: str) -> None:
    assert detect_format(LOGS / name) == fmt
    trace = read_log(LOGS / name)
    assert trace.header["format"] == fmt
    assert trace.header["kind"] == "header"
    assert trace.header["source"] == str(LOGS / name)
    assert all(isinstance(s["step"], int) and isinstance(s["raw"], str) and s["raw"] for s in trace.steps)
    assert [s["step"] for s in trace.steps] == sorted({s["step"] for s in trace.steps})


def test_every_fixture_is_covered_and_every_format_is_listed() -> None:
    assert {p.name for p in LOGS.iterdir() if p.is_file() and p.suffix != ".md"} == set(FIXTURE_FORMATS)
    assert set(FORMATS) == {*FIXTURE_FORMATS.values(), "moescope", "tensorboard"}


def test_column_files_are_told_apart_by_name_then_by_shape(tmp_path: Path) -> None:
    columns = "1 0 3\n1 0 2\n2 1 3\n"
    assert detect_format(write(tmp_path, "entropy_per_step.txt", columns)) == "entropy-log"
    assert detect_format(write(tmp_path, "routing.txt", columns)) == "expert-load"
    assert detect_format(write(tmp_path, "entropy.txt", "1 0.52\n2 0.50\n")) == "entropy-log"
    # a step and a number alone, in a file no name announces: a loop's print(step, loss)
    curve = read_log(write(tmp_path, "curve.txt", "1 0.52\n2 0.50\n"))
    assert curve.header["format"] == "records" and [s[S.ACTOR_LOSS] for s in curve.steps] == [0.52, 0.5]
    assert detect_format(write(tmp_path, "entropy.txt", "1 3 0.52\n2 3 0.50\n")) == "entropy-log"
    # more bare numbers a line, no name announcing an entropy log: a table without its header
    table = read_log(write(tmp_path, "curve.txt", "1 3 0.52\n2 3 nan\n3 3 0.50\n"))
    assert table.header["format"] == "step-table" and [s["step"] for s in table.steps] == [1, 2, 3]
    labelled = "step=1    loss=15.50  gnorm=42.7\nstep=55   loss=13.00  gnorm=14.0\n"  # entrenar#274
    assert detect_format(write(tmp_path, "train.log", labelled)) == "step-lines"
    assert (
        detect_format(write(tmp_path, "ent.txt", "step=1 entropy=0.52\nstep=2 entropy=0.50\n"))
        == "entropy-log"
    )


def test_a_checkpoint_directory_reads_its_trainer_state(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    shutil.copy(LOGS / "trainer_state.json", checkpoint)
    assert detect_format(checkpoint) == "trainer-state"
    assert [s["step"] for s in read_log(checkpoint).steps] == [1, 2, 3, 4]


# --- verl console ---------------------------------------------------------------------------------


def test_verl_new_console_reads_full_precision_numpy_reprs_and_ray_prefixes() -> None:
    _, steps = read_fixture("verl_console_new.log", "verl", [0, 1, 2, 3, 4])
    one = steps[1]
    assert one[S.GRAD_NORM] == 0.050373204039674276  # pformat's full repr survives
    assert one[S.PG_LOSS] == -0.004712861869484186
    assert one[S.ENTROPY] == 0.6512340307235718
    assert one[S.CLIPFRAC] == 0.0012345 and one[S.PPO_KL] == 3.1e-05 and one[S.LR] == 1e-06
    assert one[S.REWARD_MEAN] == 0.28125 and one[S.REWARD_MAX] == 1.0 and one[S.REWARD_MIN] == 0.0
    assert one[S.TRUNCATED_FRAC] == 0.0 and one[S.LENGTH_MEAN] == 235.78125
    assert one["critic/rewards/mean"] == 0.28125  # no canonical name: kept as logged
    assert one["global_seqlen/min"] == 11634 and isinstance(one["global_seqlen/min"], int)
    assert steps[0]["val-aux/num_turns/min"] == 2 and isinstance(steps[0]["val-aux/num_turns/min"], int)
    assert "\x1b" not in one["raw"] and "TaskRunner pid=2381" in one["raw"]


def test_verl_lines_wrapped_inside_a_key_and_a_number_are_rejoined() -> None:
    two = steps_of(read_log(LOGS / "verl_console_new.log"))[2]
    assert two["critic/rewards/min"] == -0.5  # wrapped as 'critic' / '/rewards/min'
    assert two[S.LENGTH_MEAN] == 235.78125  # wrapped as '235.7' / '8125'
    assert two["training/global_step"] == 2  # the last piece was read too
    assert (
        two["raw"].count("\n") == 2 and "critic\n/rewards/min" in two["raw"] and "235.7\n8125" in two["raw"]
    )


def test_verl_nan_inf_and_the_duplicate_step_of_a_resumed_run() -> None:
    trace = read_log(LOGS / "verl_console_new.log")
    three = steps_of(trace)[3]
    assert math.isnan(three[S.PG_LOSS]) and math.isnan(three[S.GRAD_NORM])
    assert three[S.PPO_KL] == math.inf and three[S.REWARD_MIN] == -math.inf
    assert three["val-core/openai/gsm8k/reward/mean@1"] == 0.25  # from the validation line, merged
    assert three[S.REWARD_MEAN] == 0.125  # both lines have it: the later one wins
    assert three["raw"].count(") step:3 - ") == 2
    assert any("step 3 appeared in more than one record" in n for n in trace.notes)
    assert steps_of(trace)[4]["training/global_step"] == 4  # Ray's '[repeated 2x …]' is no value
    assert not any("no key:value pair" in n for n in trace.notes)
    assert any("of 16 non-empty lines are not verl-console records" in n for n in trace.notes)


def test_verl_old_console_three_decimals_and_older_key_names() -> None:
    steps = steps_of(read_log(LOGS / "verl_console_old.log"))
    assert steps[1][S.ENTROPY] == 1.234  # actor/entropy_loss in older logs
    assert "actor/entropy_loss" not in steps[1]
    assert steps[1][S.LR] == 0.0  # what '.3f' made of 1e-6
    assert math.isnan(steps[2][S.GRAD_NORM])
    assert S.TRUNCATED_FRAC not in steps[2]  # sparse: absent, not NaN
    assert steps[3][S.TRUNCATED_FRAC] == 1.0


def test_utf16_and_bom_logs_are_text(tmp_path: Path) -> None:
    line = "(TaskRunner pid=1) step:7 - actor/grad_norm:nan - actor/entropy:0.5\r\n"
    for name, data in [("ps.log", line.encode("utf-16")), ("bom.log", "\ufeff".encode() + line.encode())]:
        path = tmp_path / name
        path.write_bytes(data)
        step = read_log(path).steps[0]
        assert step["step"] == 7 and math.isnan(step[S.GRAD_NORM]) and step[S.ENTROPY] == 0.5


def test_verl_console_tail_that_is_no_pair_is_noted(tmp_path: Path) -> None:
    path = write(tmp_path, "v.log", "step:5 - actor/pg_loss:0.5 - actor/grad_norm:0.1 then the job died\n")
    trace = read_log(path)
    assert trace.steps[0][S.PG_LOSS] == 0.5 and S.GRAD_NORM not in trace.steps[0]
    assert any("no key:value pair" in n for n in trace.notes)


# --- verl JSONL -----------------------------------------------------------------------------------


def test_verl_jsonl_keeps_null_distinct_from_nan_and_from_absent() -> None:
    trace, steps = read_fixture("verl_metrics.jsonl", "verl", [1, 2, 3])
    assert steps[2][S.PG_LOSS] is None and steps[2][S.GRAD_NORM] is None  # orjson's null for NaN
    assert S.GRAD_NORM not in steps[3] and S.PG_LOSS not in steps[3]  # not logged at all
    assert steps[1][S.GRAD_NORM] == 0.0504 and steps[3][S.REWARD_MEAN] == 0.0
    lines = (LOGS / "verl_metrics.jsonl").read_text().splitlines()
    assert [s["raw"] for s in trace.steps] == lines


def test_nan_null_and_absent_differ_in_one_flat_jsonl(tmp_path: Path) -> None:
    path = write(
        tmp_path, "m.jsonl", '{"step": 1, "loss": NaN, "grad_norm": null}\n{"step": 2, "loss": 1.0}\n'
    )
    steps = steps_of(read_log(path))
    assert math.isnan(steps[1][S.ACTOR_LOSS]) and steps[1][S.GRAD_NORM] is None
    assert S.GRAD_NORM not in steps[2]


def test_logged_keys_named_step_or_raw_do_not_replace_ours(tmp_path: Path) -> None:
    line = '{"step": 1, "raw": "x", "loss": 1.0}'
    step = read_log(write(tmp_path, "m.jsonl", line + "\n")).steps[0]
    assert step["step"] == 1 and step["raw"] == line and step["logged_raw"] == "x"
    step = read_log(write(tmp_path, "v.log", "step:2 - step:0.5 - actor/kl:0.1\n")).steps[0]
    assert step["step"] == 2 and step["logged_step"] == 0.5 and step[S.KL] == 0.1


# --- HF Trainer / TRL -----------------------------------------------------------------------------


def test_trainer_state_reads_nan_infinity_and_merges_eval_records() -> None:
    trace, steps = read_fixture("trainer_state.json", "trl", [1, 2, 3, 4])
    assert math.isnan(steps[3][S.GRAD_NORM])
    assert steps[4][S.GRAD_NORM] == math.inf and steps[4][S.KL] == -math.inf
    assert steps[1][S.NO_SIGNAL_FRAC] == 0.5 and steps[1][S.TRUNCATED_FRAC] == 0.0
    assert steps[4]["eval_loss"] == 0.1234 and steps[4]["train_runtime"] == 123.4
    assert S.CLIPFRAC not in steps[2]
    assert any("step 4 appeared in more than one record" in n for n in trace.notes)
    first = json.loads(steps[1]["raw"])  # the record's own text
    assert first["step"] == 1 and first["grad_norm"] == 0.7853


def test_trl_console_steps_come_from_the_glued_training_bar() -> None:
    trace, steps = read_fixture("trl_console.log", "trl", [2, 4, 6])
    assert steps[2][S.ACTOR_LOSS] == 0.0 and steps[2][S.REWARD_STD] == 0.3535 and steps[2][S.CLIPFRAC] == 0.0
    assert "2/6 [" in steps[2]["raw"]
    assert any("progress bar" in n for n in trace.notes)


def test_trl_console_wrapped_dict_nan_inf_none_and_merged_eval() -> None:
    trace, steps = read_fixture("trl_console.log", "trl", [2, 4, 6])
    four = steps[4]
    assert math.isnan(four[S.GRAD_NORM]) and four[S.KL] == math.inf
    assert four[S.LR] == 1e-06 and four[S.ENTROPY] == 0.3012  # across the wrap; np.float64 unwrapped
    assert four["raw"].count("\n") == 1
    assert steps[6][S.KL] is None  # TRL's None (all values NaN) stays None
    assert steps[6]["eval_loss"] == 0.1234  # the eval bar (of 25) gives no step: joins the step before
    assert any("without a step number" in n for n in trace.notes)


def test_dict_lines_without_any_step_are_indexed(tmp_path: Path) -> None:
    text = "{'loss': 0.5, 'grad_norm': 1.0}\nsome other output\n{'loss': nan, 'grad_norm': inf}\n"
    trace = read_log(write(tmp_path, "console.txt", text))
    assert [s["step"] for s in trace.steps] == [0, 1]
    assert math.isnan(trace.steps[1][S.ACTOR_LOSS]) and trace.steps[1][S.GRAD_NORM] == math.inf
    assert any("indexed in order from 0" in n for n in trace.notes)


def test_slime_console_step_prefix_and_key_names(tmp_path: Path) -> None:
    text = (
        "[2025-05-01 10:00:00] model.py:897 - step 3: {'train/loss': 0.12, 'train/pg_loss': 0.1, "
        "'train/entropy_loss': 0.8, 'train/pg_clipfrac': 0.01, 'train/grad_norm': nan, "
        "'train/lr-pg_0': 1e-06}\n"
    )
    trace = read_log(write(tmp_path, "slime.log", text))
    assert trace.header["framework"] == "slime"
    three = steps_of(trace)[3]
    assert three[S.ACTOR_LOSS] == 0.12 and three[S.ENTROPY] == 0.8 and three[S.LR] == 1e-06
    assert math.isnan(three[S.GRAD_NORM])


def test_ms_swift_jsonl_step_from_global_step_and_summary_row() -> None:
    trace, steps = read_fixture("swift_logging.jsonl", "ms-swift", [1, 2])
    assert steps[1][S.ENTROPY] == 0.71 and steps[1]["entropy/max"] == 2.3
    assert math.isnan(steps[2][S.GRAD_NORM]) and steps[2][S.KL] == math.inf
    assert steps[2][S.TRUNCATED_FRAC] == 1.0 and steps[2]["global_step/max_steps"] == "2/500"
    assert steps[2]["train_loss"] == 0.0162  # the summary row without a step joins step 2
    assert any("1 records without a step number (line 3)" in n for n in trace.notes)


def test_a_nan_a_joining_line_cannot_put_on_its_step_is_noted(tmp_path: Path) -> None:
    text = "step 3 loss: 7.4369\nloss: nan samples/sec: 73.373\nstep 4 loss: 7.1\n"
    trace = read_log(write(tmp_path, "joined.log", text))
    assert steps_of(trace)[3][S.ACTOR_LOSS] == 7.4369  # the step's own value stays
    assert any("actor/loss is NaN/Inf on line 2" in note for note in trace.notes)
    assert steps_of(trace)[3][S.NONFINITE] == 1  # and the NaN printed counts on it
    assert steps_of(trace)[3][S.ALERTS] == "loss: nan samples/sec: 73.373"


def test_roll_metrics_tag_lines() -> None:
    _, steps = read_fixture("roll_stdout.log", "roll", [0, 1])
    assert steps[0][S.ACTOR_LOSS] == -0.0119 and steps[0][S.KL] == 0.0004 and steps[0][S.PPO_KL] == 0.0002
    assert steps[0][S.GRAD_NORM] == 0.3312 and steps[0][S.LENGTH_MEAN] == 623.4
    assert math.isnan(steps[1][S.PG_LOSS]) and math.isnan(steps[1][S.GRAD_NORM])
    assert "metrics_tag:" in steps[1]["raw"]


# --- Megatron and DeepSpeed -----------------------------------------------------------------------


def test_megatron_iteration_fields_and_a_loss_that_vanished() -> None:
    trace, steps = read_fixture("megatron.log", "megatron", [10, 20, 30, 40, 41])
    ten = steps[10]
    assert ten[S.ACTOR_LOSS] == 2.345678 and ten[S.LR] == 1e-06 and ten[S.AUX_LOSS] == 1.012345
    assert ten[S.GRAD_NORM] == 0.752 and ten[S.LOSS_SCALE] == 65536.0 and ten[S.NONFINITE] == 0
    assert ten["elapsed time per iteration (ms)"] == 1523.4 and ten["global batch size"] == 64
    assert S.ACTOR_LOSS not in steps[30]  # kept absent, never invented
    assert math.isnan(steps[30][S.GRAD_NORM])
    assert any("'lm loss' is missing from step 30" in n for n in trace.notes)
    assert steps[40][S.ACTOR_LOSS] == 2.198765  # line wrapped inside the number


def test_deepspeed_overflows_go_on_the_next_iteration_line() -> None:
    trace = read_log(LOGS / "megatron.log")
    steps = steps_of(trace)
    assert steps[10][S.SKIPPED] == 0 and S.LOSS_SCALE_TRIED not in steps[10]
    assert steps[20][S.SKIPPED] == 1  # two ranks printed one overflow
    assert steps[20][S.LOSS_SCALE] == 32768.0 and steps[20][S.LOSS_SCALE_TRIED] == 65536
    assert steps[20]["raw"].startswith("[deepspeed] OVERFLOW! Rank 0")
    assert steps[30][S.SKIPPED] == 1 and steps[30][S.LOSS_SCALE_TRIED] == 32768  # wrapped line
    assert any("step 30: 1 DeepSpeed overflow(s) but the line counts 0 skipped" in n for n in trace.notes)
    assert steps[41] == {
        "step": 41,
        S.SKIPPED: 1,
        S.LOSS_SCALE: 8192,
        S.LOSS_SCALE_TRIED: 16384,
        "raw": "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 16384, reducing to 8192",
    }


def test_the_older_overflow_detected_line_keeps_the_scale_it_tried(tmp_path: Path) -> None:
    text = (
        "[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 4, reducing to 2\n"
        "[Rank 0] Overflow detected. Skipping step. Attempted loss scale: 2, reducing to 1\n"
    )
    trace = read_log(write(tmp_path, "ds.log", text))
    assert [(s[S.SKIPPED], s[S.LOSS_SCALE_TRIED], s[S.LOSS_SCALE]) for s in trace.steps] == [
        (1, 4, 2),
        (1, 2, 1),
    ]


def test_a_record_cut_before_its_brace_is_read_from_its_complete_pairs(tmp_path: Path) -> None:
    text = (
        "{'loss': 1.5, 'grad_norm': 2.0, 'step': 10}\n"
        "{'loss': 1.4, 'grad_norm': nan, 'learning_rate': 1e-05, 'epo\n"
        "I wrote {'only one', and it is prose.\n"
    )
    trace = read_log(write(tmp_path, "cut.log", text), format="trl-console")
    (first, second) = trace.steps
    assert first["step"] == 10
    assert second["step"] == 11 and math.isnan(second[S.GRAD_NORM]) and second[S.LR] == 1e-05
    assert "epo" not in str(sorted(second)) and any("cut short" in n for n in trace.notes)


def test_an_iteration_printed_before_its_step_is_the_step(tmp_path: Path) -> None:
    text = "iter 7 step 1: loss 2.5, iter time: 10.0ms\niter 8 step 1: loss 2.4, iter time: 11.0ms\n"
    trace = read_log(write(tmp_path, "litgpt.log", text))
    by_step = {s["step"]: (s[S.ACTOR_LOSS], s["optimizer step"]) for s in trace.steps}
    assert by_step == {7: (2.5, 1), 8: (2.4, 1)}


def test_deepspeed_pipeline_steps_lines_are_step_lines(tmp_path: Path) -> None:
    # DeepSpeed's pipeline engine prints "steps:" (plural); a NaN loss on the second is its own step's
    text = (
        "steps: 227 loss: 7.4369 iter time (s): 34.995 samples/sec: 73.153\n"
        "steps: 228 loss: nan iter time (s): 34.890 samples/sec: 73.373\n"
    )
    trace = read_log(write(tmp_path, "pipe.log", text))
    assert trace.header["format"] == "step-lines"
    assert [s["step"] for s in trace.steps] == [227, 228]
    assert trace.steps[0][S.ACTOR_LOSS] == 7.4369 and math.isnan(trace.steps[1][S.ACTOR_LOSS])


def test_apex_s_older_overflow_lines_are_skipped_updates(tmp_path: Path) -> None:
    """apex's FP16_Optimizer: "Grad overflow on iteration N", then the reduced scale on a line of its own."""
    text = "".join(
        f"Grad overflow on iteration {i}\nUsing dynamic loss scale of {scale}\n"
        f"  1% {i + 1}/184 [00:00<01:34,  1.93it/s, loss={loss}]\n"
        for i, scale, loss in ((0, 65536, 4.215), (1, 32768.0, 4.174))
    )
    trace = read_log(write(tmp_path, "apex.log", text))
    assert [(s["step"], s[S.SKIPPED], s[S.LOSS_SCALE]) for s in trace.steps] == [
        (1, 1, 65536),
        (2, 1, 32768.0),
    ]


def test_a_log_of_fairseq_overflow_notes_alone_is_read(tmp_path: Path) -> None:
    note = "2022-05-16 22:34:05 - INFO: NOTE: gradient overflow detected, ignoring gradient, "
    text = "".join(f"{note}setting loss scale to: {scale}\n" for scale in (64.0, 32.0, 16.0))
    trace = read_log(write(tmp_path, "ofa.log", text))
    assert [(s[S.SKIPPED], s[S.LOSS_SCALE]) for s in trace.steps] == [(1, 64.0), (1, 32.0), (1, 16.0)]


def test_overflow_lines_fold_into_the_step_line_after_them(tmp_path: Path) -> None:
    overflow = "[Rank 0] Overflow detected. Skipping step. Attempted loss scale: {}, reducing to 1"
    lines = [
        overflow.format(2),
        overflow.format(1),
        "epoch: 0|step: 9|ppo_ep: 1|act_loss: 0.5|cri_loss: 0.25",
    ]
    (step,) = (trace := read_log(write(tmp_path, "dschat.log", "\n".join(lines)))).steps
    assert trace.header["format"] == "step-lines"
    assert (step["step"], step[S.SKIPPED], step[S.LOSS_SCALE], step[S.LOSS_SCALE_TRIED]) == (9, 2, 1, 1)


def test_overflow_lines_alone_are_indexed_steps(tmp_path: Path) -> None:
    text = (
        "Episode [1/1]:   0%|          | 0/8 [00:00<?, ?it/s]\n"
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4294967296, "
        "reducing to 2147483648\n"
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2147483648, "
        "reducing to 1073741824\n"
    )
    trace = read_log(write(tmp_path, "openrlhf.log", text))
    assert trace.header == {**trace.header, "format": "megatron", "framework": "deepspeed"}
    assert [(s["step"], s[S.SKIPPED], s[S.LOSS_SCALE]) for s in trace.steps] == [
        (0, 1, 2147483648),
        (1, 1, 1073741824),
    ]
    assert any("indexed in order from 0" in n for n in trace.notes)


# --- TensorBoard ----------------------------------------------------------------------------------


def _write_events(directory: Path, scalars: dict[str, list[float]], new_style: bool = False) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(directory))
    for tag, values in scalars.items():
        for step, value in enumerate(values, start=1):
            writer.add_scalar(tag, value, step, new_style=new_style)
    writer.close()


def test_tensorboard_openrlhf_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "tb" / "openrlhf_run"
    nan, inf = math.nan, math.inf
    _write_events(
        run,
        {
            "train/policy_loss": [0.1, nan, 0.3],
            "train/actor_grad_norm": [0.5, inf, 0.7],
            "train/kl": [0.01, 0.02, -inf],
            "train/reward": [0.1, 0.2, 0.3],
            "train/actor_lr": [1e-6, 1e-6, 1e-6],
            "train/group_reward_std": [0.4, 0.3, 0.0],
        },
    )
    assert detect_format(tmp_path / "tb") == "tensorboard"
    trace = read_log(tmp_path / "tb")
    steps = steps_of(trace)
    assert trace.header["framework"] == "openrlhf"
    assert sorted(steps) == [1, 2, 3]
    assert steps[1][S.PG_LOSS] == 0.1 and steps[1][S.LR] == 1e-06  # float32 read back as its shortest decimal
    assert math.isnan(steps[2][S.PG_LOSS]) and steps[2][S.GRAD_NORM] == math.inf
    assert steps[3][S.KL] == -math.inf and steps[3][S.REWARD_STD] == 0.0 and steps[3][S.REWARD_MEAN] == 0.3
    assert "train/policy_loss = nan" in steps[2]["raw"]
    event_file = next(run.iterdir())
    assert detect_format(event_file) == "tensorboard"
    assert steps_of(read_log(event_file))[1][S.PG_LOSS] == 0.1


@pytest.mark.parametrize(
    ("framework", "scalars", "expected"),
    [
        (
            "nemo-rl",
            {"train/loss": [0.2], "train/approx_entropy": [0.7], "train/gen_kl_error": [0.001]},
            {S.ACTOR_LOSS: 0.2, S.ENTROPY: 0.7, S.MISMATCH_KL: 0.001},
        ),
        (
            "slime",
            {"train/pg_loss": [0.05], "train/entropy_loss": [0.6], "train/lr-pg_0": [2e-6]},
            {S.PG_LOSS: 0.05, S.ENTROPY: 0.6, S.LR: 2e-6},
        ),
        ("trl", {"train/loss": [0.3], "train/learning_rate": [1e-5]}, {S.ACTOR_LOSS: 0.3, S.LR: 1e-5}),
    ],
)
def test_tensorboard_framework_is_guessed_from_tags(tmp_path: Path, framework, scalars, expected) -> None:
    _write_events(tmp_path, scalars, new_style=True)
    trace = read_log(tmp_path)
    assert trace.header["framework"] == framework
    assert {k: v for k, v in trace.steps[0].items() if k in expected} == expected


def test_tensorboard_runs_in_several_directories_are_noted(tmp_path: Path) -> None:
    _write_events(tmp_path / "a", {"train/policy_loss": [0.1]})
    _write_events(tmp_path / "b", {"train/policy_loss": [0.2, 0.3]})
    trace = read_log(tmp_path, format="tensorboard")
    assert len(trace.steps) == 2
    assert any("from 2 directories" in n for n in trace.notes)


def test_a_tensorboard_file_without_scalars_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "events.out.tfevents.123.host"
    path.write_bytes(b"\x00\x01 not a record at all" * 10)
    with pytest.raises(MoescopeError, match="has no step this reader recognises as tensorboard"):
        read_log(path)


# --- moescope traces ------------------------------------------------------------------------------


def test_moescope_trace_goes_through_read_trace(tmp_path: Path) -> None:
    path = tmp_path / "replay.jsonl"
    with TraceWriter(path, {"model": "toy"}) as writer:
        writer.write_step(0, {S.ACTOR_LOSS: math.nan, S.LR: 1e-5})
        writer.write_step(1, {S.ACTOR_LOSS: 0.5, S.EXPERT_LOAD: [[0.5, 0.5]]})
    assert detect_format(path) == "moescope"
    trace = read_log(path)
    assert trace.header["model"] == "toy" and trace.header["format"] == "moescope"
    assert math.isnan(trace.steps[0][S.ACTOR_LOSS]) and trace.steps[1][S.EXPERT_LOAD] == [[0.5, 0.5]]
    assert trace.steps[1]["raw"] == path.read_text().splitlines()[2]


# --- column files and plain text ------------------------------------------------------------------


def test_entropy_log_takes_the_first_and_last_columns() -> None:
    trace = read_log(LOGS / "entropy_log.txt")
    assert [(s["step"], s[S.ENTROPY]) for s in trace.steps if s["step"] != 3] == [
        (1, 0.6523),
        (2, 0.6401),
        (4, 0.311),
    ]
    assert math.isnan(steps_of(trace)[3][S.ENTROPY])
    assert trace.steps[0]["raw"] == "1   12.3  20480  0.6523"
    assert trace.notes == []  # the commented header is no skipped line


def _cv(shares: list[float]) -> float:
    return statistics.pstdev(shares) / statistics.fmean(shares)


def test_expert_load_counts_tokens_per_step_and_layer() -> None:
    trace = read_log(LOGS / "expert_load.log")
    one, two = steps_of(trace)[1], steps_of(trace)[2]
    assert one[S.EXPERT_LOAD] == [[0.5, 0.25, 0.0, 0.25], [0.0, 0.0, 1.0, 0.0]]
    assert one[S.MAX_LOAD_SHARE] == 1.0 and one[S.DEAD_EXPERTS] == 1 + 3
    assert one[S.LOAD_CV] == pytest.approx((_cv([0.5, 0.25, 0.0, 0.25]) + _cv([0.0, 0.0, 1.0, 0.0])) / 2)
    assert two[S.EXPERT_LOAD][1] == [0.25] * 4 and two[S.DEAD_EXPERTS] == 2
    assert "moe/expert_load_layers" not in one
    assert one["raw"].splitlines()[0] == "1 0 0" and len(one["raw"].splitlines()) == 8
    assert any("expert count is not known" in n for n in trace.notes)


def test_expert_load_with_a_known_expert_count(tmp_path: Path) -> None:
    steps = steps_of(read_log(LOGS / "expert_load.log", num_experts=6))
    assert len(steps[1][S.EXPERT_LOAD][0]) == 6
    assert steps[1][S.DEAD_EXPERTS] == (1 + 2) + (3 + 2)
    with pytest.raises(MoescopeError, match="num_experts=3"):
        read_log(LOGS / "expert_load.log", num_experts=3)


def test_expert_load_labelled_tokens_count_column_and_no_layer(tmp_path: Path) -> None:
    labelled = "".join(
        f"step=7 layer={layer} expert={expert} tokens={n}\n"
        for layer, expert, n in [(12, 1, 30), (12, 0, 10), (3, 0, 5)]
    )
    step = read_log(write(tmp_path, "expert_load.log", labelled)).steps[0]
    assert step["step"] == 7 and step["moe/expert_load_layers"] == [3, 12]
    assert step[S.EXPERT_LOAD] == [[1.0, 0.0], [0.25, 0.75]]
    bare = "3 tok 5\n3 tok 5\n3 tok 1\n"  # no layer column: one layer; ids index the row
    step = read_log(write(tmp_path, "expert_load.log", bare)).steps[0]
    assert step[S.EXPERT_LOAD] == [[0.0, 1 / 3, 0.0, 0.0, 0.0, 2 / 3]]
    assert step[S.DEAD_EXPERTS] == 0  # among the ids seen (1 and 5)


def test_plain_text_counts_nonfinite_lines_per_step() -> None:
    trace = read_log(LOGS / "plain_nan.log", format="plain")
    steps = steps_of(trace)
    assert {s: r[S.NONFINITE] for s, r in steps.items()} == {2: 2, 3: 1}  # 'info'/'inference' do not count
    assert "found NaN in local grad norm" in steps[2]["raw"]
    assert trace.header["framework"] is None


def test_plain_text_without_steps_counts_the_finite_prints_of_the_same_shape(tmp_path: Path) -> None:
    """A bare ``print(loss)`` turning NaN on its third print is on step 2, counted among the prints
    of its shape only (a line of another shape, its number and all, is no print of the loss)."""
    text = "tensor(0.52, device='cuda:0')\nsaved 7 files\ntensor(0.49, device='cuda:0')\n"
    text += "tensor(nan, device='cuda:0')\ntensor(nan, device='cuda:0')\n"
    trace = read_log(write(tmp_path, "prints.log", text), format="plain")
    assert sorted(steps_of(trace)) == [2, 3]


def test_plain_text_lines_that_start_with_a_rising_count_are_on_it(tmp_path: Path) -> None:
    """PyTorch's char-RNN tutorial prints ``iter percent (time) loss guess``: each line names
    another word, so no two share a shape, but the count they start with rises."""
    names = ["Coelho / Portuguese", "Desrochers / Dutch", "Minitsky / Polish", "Nam / Russian", "Ko / Korean"]
    losses = ["2.4177", "2.5862", "1.1451", "nan", "nan"]
    text = "".join(
        f"{5000 * (i + 1)} {5 * (i + 1)}% (0m 12s) {x} {n}\n"
        for i, (x, n) in enumerate(zip(losses, names, strict=True))
    )
    trace = read_log(write(tmp_path, "tutorial.log", text), format="plain")
    assert sorted(steps_of(trace)) == [20000, 25000]
    falling = text.replace("25000 ", "1000 ")  # a count that does not rise is no step: indexed
    assert sorted(steps_of(read_log(write(tmp_path, "falling.log", falling), format="plain"))) == [0, 1]
    dated = "".join(f"2024 06 12 {x} nan\n" for x in ("a", "b", "c"))  # a repeated leading number
    assert sorted(steps_of(read_log(write(tmp_path, "dated.log", dated), format="plain"))) == [0, 1, 2]


# --- step lines and pasted key-values ---------------------------------------------------------


def test_prime_rl_trainer_and_orchestrator_lines_old_and_new_layouts() -> None:
    trace, steps = read_fixture("prime_rl.log", "prime-rl", [1, 2, 3])
    one = steps[1]
    assert one[S.ACTOR_LOSS] == 0.0123 and one[S.ENTROPY] == 0.5312 and one[S.MISMATCH_KL] == 0.0011
    assert one[S.GRAD_NORM] == 0.4121 and one[S.LR] == 1e-06 and one[S.MAX_VIOLATION] == 0.8123
    assert one["Throughput"] == 1234 and one["MFU"] == 12.3 and one[S.TIME_STEP] == 12.31
    assert math.isnan(steps[2][S.GRAD_NORM])
    three = steps[3]  # the new bare layout, then the orchestrator's line of the same step
    assert three[S.ACTOR_LOSS] == 0.0101 and three["Routing Conf."] == 0.5 and three[S.REWARD_MEAN] == 0.4123
    assert three["Seq. Length"] == 512.3 and "Peak Mem." in one
    assert three["raw"].count("Step 3") == 2
    assert any("1 of 5 non-empty lines are not step-lines records" in n for n in trace.notes)


def test_generic_step_lines_use_the_generic_names(tmp_path: Path) -> None:
    trace, steps = read_fixture("generic_steps.log", None, [1, 2, 3])
    assert steps[1][S.ACTOR_LOSS] == 0.532 and steps[1][S.GRAD_NORM] == 0.81
    assert math.isnan(steps[2][S.ACTOR_LOSS]) and steps[3][S.ACTOR_LOSS] == math.inf
    text = "step 10/100 | loss 0.51 | Grad Norm 1e9 | lr 1e-5 | reward 0.3\nStep 11: loss=0.5, kl=0.01\n"
    trace = read_log(write(tmp_path, "other.log", text))
    assert trace.header["format"] == "step-lines" and trace.header["framework"] is None
    ten, eleven = trace.steps
    assert (ten["step"], ten[S.GRAD_NORM], ten[S.LR], ten[S.REWARD_MEAN]) == (10, 1e9, 1e-05, 0.3)
    assert (eleven["step"], eleven[S.ACTOR_LOSS], eleven[S.KL]) == (11, 0.5, 0.01)


@pytest.mark.parametrize(
    ("piece", "expected"),
    [
        ("Grad. Norm: 0.41", ("Grad. Norm", 0.41)),
        ("Grad. Norm nan", ("Grad. Norm", "nan")),
        ("Throughput: 1234 tokens/s", ("Throughput", 1234)),
        ("MFU 12.3%", ("MFU", 12.3)),
        ("  3.21s", ("Time", 3.21)),
        ("lr=1e-06", ("lr", 1e-06)),
        ("training info", None),  # 'info' is not inf followed by a unit
        ("Peak Mem. 40.1/80.0 GiB (50.1%)", None),
        ("starting the run", None),
        # thousands separators where every group after a comma has three digits (torchforge#664)
        ("grpo_loss/kl_divergence_mean: 1,568,987.96", ("grpo_loss/kl_divergence_mean", 1568987.96)),
        ("tokens=-12,000", ("tokens", -12000)),
        ("key:1,key2:2", None),  # a list, no number
        ("ids: 1,23,456", None),
    ],
)
def test_a_field_is_a_name_then_a_number(piece: str, expected) -> None:
    from moescope.analyze.readers._fields import field

    found = field(piece)
    if expected is not None and expected[1] == "nan":
        assert found[0] == expected[0] and math.isnan(found[1])
    else:
        assert found == expected


def test_a_record_reads_a_grouped_number_whole_and_a_list_as_its_pairs() -> None:
    assert records.pairs("loss: 0.5, tokens: 1,024,000") == {"loss": 0.5, "tokens": 1024000}
    assert records.pairs("key:1,key2:2") == {"key": 1, "key2": 2}


def test_a_row_of_named_fields_after_its_step_is_no_column_row(tmp_path: Path) -> None:
    """``0 | loss 11.6 | lr 3e-04`` opens with a step and ends on a number, as an entropy log's
    row does, but its bare names make it a record."""
    log = tmp_path / "train.log"
    log.write_text("".join(f"{s} | loss {9 - s / 10} | lr 3e-04\n" for s in range(0, 50, 10)))
    assert detect_format(log) == "records"
    assert [rec["step"] for rec in read_log(log).steps] == [0, 10, 20, 30, 40]


def test_openrlhf_episode_bar_postfix_one_step_per_status() -> None:
    trace, steps = read_fixture("openrlhf_console.log", "openrlhf", [2, 3])
    two = steps[2]  # drawn at 1/50 by set_postfix, then at 2/50 by update: one step, the later count
    assert two[S.PG_LOSS] == 0.0123 and two[S.LR] == 1e-06 and two[S.REWARD_MEAN] == 0.5
    assert two[S.CLIPFRAC] == 0.02 and two[S.LENGTH_MEAN] == 312 and two["total_length"] == 512
    assert math.isnan(steps[3][S.PG_LOSS])
    assert any("1 of 5 non-empty lines" in n for n in trace.notes)  # the first bar, drawn without a postfix


def test_openrlhf_inner_bars_alone_are_read_in_order(tmp_path: Path) -> None:
    bar = "Train epoch [1/1]: {p}%|##| {n}/4 [00:10<00:00,act_loss={a}, reward=0.5, gen_len=300, act_lr=1e-6]"
    line = "\r".join(bar.format(p=25 * n, n=n, a=0.1 + n) for n in range(1, 5))
    text = line + "\n" + line.replace("act_loss=4.1", "act_loss=9.0") + "\n"
    trace = read_log(write(tmp_path, "inner.log", text))
    assert [(s["step"], s[S.PG_LOSS], s[S.LENGTH_MEAN]) for s in trace.steps] == [
        (0, 4.1, 300),
        (1, 9.0, 300),
    ]
    assert any("no Episode bar" in n for n in trace.notes)


def test_bars_that_never_complete_are_read_on_their_counts(tmp_path: Path) -> None:
    bar = "Epoch {e}:  {p}%|##| {n}/10 [00:{n}0<00:30, 2.1s/it, loss={loss}, v_num=7]"
    lines = [
        bar.format(e=e, p=10 * n, n=n, loss=round(3 - 0.1 * (10 * e + n), 2)) for e in (0, 1) for n in (2, 3)
    ]
    trace = read_log(write(tmp_path, "lightning.log", "\n".join(lines) + "\n"))
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in trace.steps] == [(2, 2.8), (3, 2.7), (12, 1.8), (13, 1.7)]
    assert any("no completed bar" in n for n in trace.notes)


def test_an_object_printed_over_lines_is_one_jsonl_record(tmp_path: Path) -> None:
    dump = json.dumps({"note": "a } in a string", "loss": 0.5, "grad_norm": math.nan, "step": 40}, indent=2)
    path = write(tmp_path, "dump.log", f"the last metrics:\n{dump}\n")
    assert detect_format(path) == "jsonl"
    (step,) = read_log(path).steps
    assert step["step"] == 40 and step[S.ACTOR_LOSS] == 0.5 and math.isnan(step[S.GRAD_NORM])


def test_an_object_cut_before_it_closes_is_no_json_record_but_its_lines_are_read(tmp_path: Path) -> None:
    """A JSON object printed over several lines and cut before its brace is no JSON record; its
    ``"loss": 0.5,`` lines still attach numbers to metric names, read as one snapshot."""
    dump = json.dumps({"loss": 0.5, "grad_norm": 1.2}, indent=2)
    trace = read_log(write(tmp_path, "cut.log", dump.rsplit("\n", 1)[0] + "\n"))
    assert trace.header["format"] == "key-values"
    assert (trace.steps[0][S.ACTOR_LOSS], trace.steps[0][S.GRAD_NORM]) == (0.5, 1.2)


def test_full_width_colons_and_commas_read_as_ascii(tmp_path: Path) -> None:
    text = "训练次数：100，Loss：1.98\n训练次数：200，Loss：1.75\n"
    trace = read_log(write(tmp_path, "cjk.log", text))
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [1.98, 1.75]


def test_a_character_that_shows_as_nothing_does_not_hide_a_record(tmp_path: Path) -> None:
    # copied from a web page: a variation selector after a colon, a zero-width space in a key
    text = (
        "{'loss': 0.5, 'epoch': 0.1}\n{'loss':\ufe0f 0.4, 'epoch': 0.2}\n{'lo\u200bss': 0.3, 'epoch': 0.3}\n"
    )
    trace = read_log(write(tmp_path, "pasted.log", text))
    assert [s[S.ACTOR_LOSS] for s in trace.steps] == [0.5, 0.4, 0.3]
    assert not any("skipped" in note for note in trace.notes)  # no line left out


def test_a_megatron_line_that_made_updates_without_a_loss_is_marked(tmp_path: Path) -> None:
    line = (
        " iteration {i}/ 20 | learning rate: 1.0E-06 | global batch size: 8 |{loss} loss scale: 1.0 |"
        " number of skipped iterations: {skipped} | number of nan iterations: 0 |\n"
    )
    lossless = read_log(write(tmp_path, "a.log", line.format(i=4, loss="", skipped=0))).steps
    assert [s.get(S.LOSS_MISSING) for s in lossless] == [1]
    logged = line.format(i=4, loss=" lm loss: 2.1E+00 |", skipped=0)
    skipped = line.format(i=8, loss="", skipped=4)  # every iteration since the line before skipped
    steps = read_log(write(tmp_path, "b.log", logged + skipped)).steps
    assert [s.get(S.LOSS_MISSING) for s in steps] == [None, None]


def test_an_epoch_counter_rising_record_to_record_is_the_step(tmp_path: Path) -> None:
    once = "".join(f"epoch: {e} loss: {1 / e:.3f}\n" for e in (7, 8, 9))
    assert [s["step"] for s in read_log(write(tmp_path, "once.log", once)).steps] == [7, 8, 9]
    within = "".join(f"epoch: 2 loss: {x}\n" for x in (0.5, 0.4, 0.3))  # logs within an epoch
    assert [s["step"] for s in read_log(write(tmp_path, "within.log", within)).steps] == [0, 1, 2]


def test_rsl_rl_learning_iteration_banners_are_the_steps(tmp_path: Path) -> None:
    block = (
        "       Learning iteration {i}/500\n\n       Value function loss: {v}\n   Mean total reward: 3.5\n"
    )
    text = block.format(i=41, v=0.2) + block.format(i=42, v="inf")
    steps = read_log(write(tmp_path, "rsl.log", text)).steps
    assert [s["step"] for s in steps] == [41, 42]
    assert steps[0]["Value function loss"] == 0.2 and math.isinf(steps[1]["Value function loss"])


def test_a_dict_printed_over_lines_is_one_record(tmp_path: Path) -> None:
    text = "{'loss': 0.0, 'grad_norm': 0.0, \n'reward': 3.0, 'reward_std': 0.0, \n'kl': 0.0, 'epoch': 0.02}\n"
    (step,) = read_log(write(tmp_path, "wrapped.log", text)).steps
    assert step[S.REWARD_STD] == 0.0 and step[S.REWARD_MEAN] == 3.0 and step[S.GRAD_NORM] == 0.0
    closed = "{'loss': 0.5, 'grad_norm': 1.0}\n'loss': 0.4, 'grad_norm': 0.9, 'epoch': 0.1\n"
    assert [s[S.ACTOR_LOSS] for s in read_log(write(tmp_path, "two.log", closed)).steps] == [0.5, 0.4]


def test_nemo_rl_console_blocks_under_step_banners() -> None:
    trace, steps = read_fixture("nemo_rl_console.log", "nemo-rl", [1, 2])
    one = steps[1]
    assert one[S.ACTOR_LOSS] == 0.0123 and one[S.MISMATCH_KL] == 0.0011
    assert one[S.REWARD_MEAN] == 0.4531 and one[S.LENGTH_MEAN] == 1597.9 and one["Total step time"] == 51.23
    assert "learning_rate" not in one and "max_grad_norm" not in one  # the config dump before step 1
    assert "generation" not in one  # "20.10s (39.2%)" is no single value
    assert steps[2][S.MISMATCH_KL] == 0.0013 and "Total step time" not in steps[2]
    assert any("not key-values records and were skipped (the first is line 1)" in n for n in trace.notes)


def test_a_pasted_snapshot_is_one_step_whose_framework_is_guessed(tmp_path: Path) -> None:
    trace, steps = read_fixture("verl_snapshot.txt", "verl", [0])
    zero = steps[0]
    assert zero[S.ENTROPY] == 0.021 and zero[S.REWARD_MEAN] == 0.0 and zero[S.LENGTH_MEAN] == 1024.0
    assert any("snapshot without steps" in n for n in trace.notes)
    other = read_log(write(tmp_path, "mine.txt", "- Loss: 0.0\n- Grad Norm: 0.0\n- reward_std: 0\n"))
    assert other.header["framework"] is None
    assert other.steps[0][S.ACTOR_LOSS] == 0.0 and other.steps[0][S.REWARD_STD] == 0


def test_key_value_lines_do_not_outvote_a_real_log(tmp_path: Path) -> None:
    config = "".join(f"  option_{i}: {i}\n" for i in range(40))
    text = config + "step:1 - actor/entropy:0.5 - actor/grad_norm:0.3\n"
    assert detect_format(write(tmp_path, "verl.log", text)) == "verl-console"
    nan_lines = "loss went NaN here\nand Inf there\nand NaN again\n"
    assert detect_format(write(tmp_path, "p.log", "seed: 1\n" + nan_lines)) == "plain"


def test_slime_rollout_and_eval_lines_go_on_their_rollout_step(tmp_path: Path) -> None:
    text = (
        "step 3: {'train/loss': 0.012, 'train/grad_norm': 0.45}\n"
        "rollout 4: {'rollout/raw_reward': 0.5}\n"
        "step 4: {'train/loss': 0.011, 'train/grad_norm': 0.41}\n"
    )
    steps = steps_of(read_log(write(tmp_path, "slime.log", text)))
    assert steps[4][S.REWARD_MEAN] == 0.5 and steps[4][S.ACTOR_LOSS] == 0.011
    assert S.REWARD_MEAN not in steps[3]


def test_explicit_format_overrides_detection() -> None:
    mixed = read_log(LOGS / "mixed.log")
    assert [s["step"] for s in mixed.steps] == [1, 2, 3, 4]
    assert any("2 megatron lines; read them with format='megatron'" in n for n in mixed.notes)
    megatron = read_log(LOGS / "mixed.log", format="megatron")
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in megatron.steps] == [(1, 2.0), (2, 1.9)]
    plain = read_log(LOGS / "verl_console_new.log", format="plain")
    assert plain.header["format"] == "plain" and steps_of(plain)[3][S.NONFINITE] >= 1


# --- the frameworks' own warning lines ---------------------------------------------------------


def test_a_megatron_nan_check_between_iteration_lines_goes_on_the_next_one(tmp_path: Path) -> None:
    line = " iteration {i:8d}/    1000 | learning rate: 1.0E-06 | {loss}number of nan iterations:   0 |\n"
    alert = "WARNING:megatron.core.rerun_state_machine:Bad grad_norm detected (grad_norm=nan) on rank 3"
    text = line.format(i=10, loss="lm loss: 1.2E+00 | ") + alert + "\n" + line.format(i=11, loss="")
    trace = read_log(write(tmp_path, "m.log", text))
    steps = steps_of(trace)
    assert steps[11][S.NONFINITE] == 1 and steps[11][S.ALERTS] == alert and alert in steps[11]["raw"]
    assert steps[10][S.NONFINITE] == 0 and S.ALERTS not in steps[10]
    assert any("1 warning line(s) of the framework itself" in n for n in trace.notes)
    assert not any("kept their own names" in n for n in trace.notes)  # added to Megatron's own counter


def test_overflow_anomaly_and_counter_lines_in_other_formats(tmp_path: Path) -> None:
    text = (
        "{'loss': 0.1, 'grad_norm': 0.5, 'step': 1}\n"
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
        "{'loss': 0.1, 'grad_norm': 0.4, 'step': 2}\n"
        "step 3: RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.\n"
        "{'loss': 0.1, 'grad_norm': 0.4, 'step': 4}\n"
        "number of skipped iterations: 2\n"
        "number of nan iterations: 0\n"
        "INFO inference done\n"
    )
    steps = steps_of(read_log(write(tmp_path, "console.log", text)))
    assert steps[2][S.SKIPPED] == 1 and steps[2][S.LOSS_SCALE] == 32768  # printed before step 2's record
    assert steps[3][S.NONFINITE] == 1 and "MulBackward0" in steps[3][S.ALERTS]  # the line names its step
    assert steps[4][S.SKIPPED] == 2 and S.NONFINITE not in steps[4]  # after the last record: on it
    assert S.ALERTS not in steps[1]


def test_deepspeeds_engine_lines_leave_the_trainers_records_to_be_read(tmp_path: Path) -> None:
    """HF's Trainer under DeepSpeed: the engine's ``step=N, skipped=K, lr=[…]`` every
    steps_per_print, as many as the trainer's records, took the vote and the NaN loss was lost."""
    engine = (
        "[2023-08-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={n}, skipped=0, lr=[1e-05]\n"
    )
    text = "".join(
        engine.format(n=10 * i) + f"{{'loss': {loss}, 'epoch': 0.0{i}}}\n"
        for i, loss in enumerate(["1.2", "1.1", "nan", "nan"], start=1)
    )
    trace = read_log(write(tmp_path, "train.log", text))
    assert [step[S.ACTOR_LOSS] for step in trace.steps][:2] == [1.2, 1.1]
    assert all(math.isnan(step[S.ACTOR_LOSS]) for step in trace.steps[2:])
    alone = read_log(write(tmp_path, "engine.log", "".join(engine.format(n=10 * i) for i in range(1, 5))))
    assert [step["step"] for step in alone.steps] == [10, 20, 30, 40]  # alone: the engine's steps
    assert alone.steps[0][S.SKIPPED_TOTAL] == 0


def test_detectrons_diverged_boxes_check_is_a_nonfinite_alert(tmp_path: Path) -> None:
    """DeFRCN (detectron2) stops on its box check after one record: the record the alert follows."""
    text = (
        "iter: 1  total_loss: 4.02e+06  loss_cls: 3.218e+06  loss_box_reg: 4.646e+05  lr: 2e-05\n"
        "FloatingPointError: Predicted boxes or scores contain Inf/NaN. Training has diverged.\n"
    )
    (step,) = read_log(write(tmp_path, "log.txt", text)).steps
    assert step["step"] == 1 and step[S.NONFINITE] == 1 and "Training has diverged" in step[S.ALERTS]


# --- the key map ----------------------------------------------------------------------------------


def _documented_rows(text: str) -> set[tuple[str, str, str]]:
    return set(re.findall(r"^\| ([\w-]+) \| `([^`]+)` \| `([^`]+)` \|$", text, flags=re.MULTILINE))


@pytest.mark.parametrize("where", ["docstring", "docs"])
def test_key_map_is_documented_row_for_row(where: str) -> None:
    text = keymap.__doc__ if where == "docstring" else DOCS.read_text()
    own = {
        (fw, k, v)
        for fw, table in KEY_MAP.items()
        if fw not in ("moescope", "ms-swift")
        for k, v in table.items()
    }
    own |= {("ms-swift", k, v) for k, v in KEY_MAP["ms-swift"].items() if k not in KEY_MAP["trl"]}
    assert _documented_rows(text) == own


def test_key_map_targets_are_canonical_schema_names() -> None:
    schema = {v for k, v in vars(S).items() if k.isupper() and isinstance(v, str)}
    assert {v for table in KEY_MAP.values() for v in table.values()} <= schema
    assert KEY_MAP["verl"]["actor/entropy_loss"] == S.ENTROPY and KEY_MAP["trl"]["reward_std"] == S.REWARD_STD
    assert KEY_MAP["openrlhf"]["train/group_reward_std"] == S.REWARD_STD
    assert KEY_MAP["megatron"]["number of skipped iterations"] == S.SKIPPED


def test_rollout_mismatch_keys_of_each_framework_become_the_replays_own(tmp_path: Path) -> None:
    """The rollout-vs-training mismatch under the replay's names: the k3 KL and the mean
    |Δ log-prob| (TRL's sampling difference is of log-probs, absolute; verl's probability
    differences are another quantity, with a canonical name of their own)."""
    verl = read_log(
        write(
            tmp_path, "v.log", "step:1 - rollout_corr/k3_kl:0.002 - training/rollout_probs_diff_mean:0.01\n"
        )
    )
    assert verl.steps[0][S.MISMATCH_KL] == 0.002 and verl.steps[0][S.PROBS_DIFF_MEAN] == 0.01
    assert keymap.canonical("trl", "sampling/sampling_logp_difference/mean") == S.LOGPROB_MISMATCH
    assert keymap.canonical("trl", "sampling/sampling_logp_difference/max") is None
    assert keymap.canonical("ms-swift", "k3_kl") == S.MISMATCH_KL
    assert keymap.canonical("slime", "train/train_rollout_logprob_abs_diff") == S.LOGPROB_MISMATCH
    assert keymap.canonical("trl", "sampling/importance_sampling_ratio/max") == S.IS_RATIO_MAX
    assert keymap.canonical("nemo-rl", "train/token_mult_prob_error") == S.MULT_PROB_ERROR
    assert keymap.canonical("ms-swift", "chi2_seq") == keymap.canonical("verl", "rollout_corr/chi2_seq")


def test_rename_keeps_the_loser_of_a_collision_under_its_own_name() -> None:
    renamed, kept = keymap.rename("verl", {"actor/entropy_loss": 0.1, "actor/entropy": 0.2, "x": 1})
    assert renamed == {"actor/entropy": 0.2, "actor/entropy_loss": 0.1, "x": 1} and kept == [
        "actor/entropy_loss"
    ]
    assert keymap.canonical("trl", "train/grad_norm") == S.GRAD_NORM  # HF's TensorBoard prefix
    assert keymap.canonical("trl", "eval_loss") is None
    assert keymap.guess_framework({"train/policy_loss", "train/kl"}, ("nemo-rl", "openrlhf")) == "openrlhf"


def test_collision_is_noted_in_a_trace(tmp_path: Path) -> None:
    trace = read_log(write(tmp_path, "v.log", "step:1 - actor/entropy_loss:0.1 - actor/entropy:0.2\n"))
    assert trace.steps[0][S.ENTROPY] == 0.2 and trace.steps[0]["actor/entropy_loss"] == 0.1
    assert any("kept their own names" in n for n in trace.notes)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.5", 0.5),
        ("-3", -3),
        ("1.234E+00", 1.234),
        ("np.float64(0.050373204039674276)", 0.050373204039674276),
        ("np.int64(7)", 7),
        ("np.float32(1e-06)", 1e-06),
        ("inf", math.inf),
        ("-inf", -math.inf),
        ("Infinity", math.inf),
        ("None", None),
        ("null", None),
        ("np.True_", True),
        ("9" * 400, math.inf),  # beyond Python's int digit limit: read as a float, not a crash
    ],
)
def test_parse_number(text: str, value: object) -> None:
    assert parse_number(text) == value and type(parse_number(text)) is type(value)


@pytest.mark.parametrize("text", ["nan", "NaN", "-nan", "np.float64(nan)", "NAN"])
def test_parse_number_nan(text: str) -> None:
    assert math.isnan(parse_number(text))


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "np.float64(x)", "0x10"])
def test_parse_number_rejects_text(text: str) -> None:
    with pytest.raises(ValueError, match="not a number"):
        parse_number(text)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty; pass a training log"),
        (b"   \n\n  \n", "is empty; pass a training log"),
        (bytes(range(256)) * 8, "is binary, not a text log; pass"),
        (
            b"hello world\nthis is not a training log\n",
            "has no step this reader recognises: no line attaches",
        ),
    ],
)
def test_bad_files_raise_one_clear_sentence(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.log"
    path.write_bytes(content)
    with pytest.raises(MoescopeError, match=re.escape(message)) as info:
        read_log(path)
    assert str(path) in str(info.value) and str(info.value).endswith(".")


def test_bad_paths_and_names(tmp_path: Path) -> None:
    with pytest.raises(MoescopeError, match="does not exist; pass"):
        read_log(tmp_path / "missing.log")
    with pytest.raises(MoescopeError, match="does not exist; pass"):
        read_log(tmp_path / "missing.log", format="verl-console")
    with pytest.raises(MoescopeError, match="is a directory with no TensorBoard event file"):
        read_log(tmp_path)
    with pytest.raises(MoescopeError, match="is a directory; pass the megatron log file"):
        read_log(tmp_path, format="megatron")
    with pytest.raises(MoescopeError, match=r"unknown log format 'wandb'; use one of moescope, verl-console"):
        read_log(LOGS / "megatron.log", format="wandb")


def test_a_log_read_as_the_wrong_format_names_it(tmp_path: Path) -> None:
    with pytest.raises(MoescopeError, match="has no step this reader recognises as megatron; pass format="):
        read_log(LOGS / "trainer_state.json", format="megatron")
    cut = LOGS.joinpath("trainer_state.json").read_text()[:700]
    with pytest.raises(MoescopeError, match="damaged log_history"):
        read_log(write(tmp_path, "trainer_state.json", cut))


def test_a_damaged_moescope_trace_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, {}) as writer:
        writer.write_step(0, {S.ACTOR_LOSS: 1.0})
        writer.write_step(1, {S.ACTOR_LOSS: 1.0})
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:10], lines[2]]) + "\n")
    with pytest.raises(MoescopeError, match="is not valid JSON"):
        read_log(path)


# --- fuzz -----------------------------------------------------------------------------------------

# pieces of every format, so random text reaches past the first regex of each reader
# fmt: off
TOKENS = [
    "step:", "step:1", " - ", "actor/grad_norm:", "np.float64(", ")", "nan", "inf", "-inf", "0.5", "1e-06",
    "(TaskRunner pid=1) ", "\n", "\r", "{'loss': ", "{", "}", "'", '"', ":", ",", "[", "]", "|",
    " iteration       10/     100 | ", "lm loss: 1.2E+00 |", "[deepspeed] OVERFLOW! Rank 0 Skipping step. ",
    "Attempted loss scale: 65536, reducing to 32768", 'metrics_tag: {"step": 1, "metrics": {',
    '{"step": 2, "data": {', '"log_history": [', "NaN", "Infinity", "null", "  3/10 [", "step 4: ", "# ",
    "layer=1 ", "17 ", "9" * 30, "Step 3 | ", "Time: 3.2s | ", "Grad. Norm ", " tokens/s", "%", "• Loss: ",
    "===== Step 2/10 =====", "rollout 5: ", "lr=", "Episode [1/1]:  4%|#| 2/50 [01:00<24:00, ", "act_loss=",
]
# fmt: on
FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
log_text = st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=6)), max_size=40).map("".join)


@pytest.fixture(scope="module")
def scratch() -> Path:
    with tempfile.TemporaryDirectory() as directory:
        yield Path(directory)


def _read_or_refuse(path: Path, fmt: str | None = None) -> None:
    try:
        trace = read_log(path, format=fmt)
    except MoescopeError as err:
        assert str(err)
        return
    assert isinstance(trace, Trace) and trace.steps
    assert all(type(s["step"]) is int and isinstance(s["raw"], str) for s in trace.steps)


@FUZZ
@given(text=log_text, fmt=st.sampled_from([None, *FORMATS]))
def test_fuzz_log_like_text(scratch: Path, text: str, fmt: str | None) -> None:
    path = scratch / "fuzz.log"
    path.write_text(text, encoding="utf-8")
    _read_or_refuse(path, fmt)


@FUZZ
@given(data=st.binary(max_size=600), name=st.sampled_from(["fuzz.bin", "events.out.tfevents.1.host"]))
def test_fuzz_random_bytes(scratch: Path, data: bytes, name: str) -> None:
    path = scratch / name
    path.write_bytes(data)
    _read_or_refuse(path)


@FUZZ
@given(
    name=st.sampled_from(sorted(FIXTURE_FORMATS)),
    edits=st.lists(
        st.tuples(
            st.floats(0, 1), st.integers(0, 40), st.one_of(st.sampled_from(TOKENS), st.text(max_size=8))
        ),
        max_size=6,
    ),
    explicit=st.booleans(),
)
def test_fuzz_mutated_fixtures(scratch: Path, name: str, edits: list, explicit: bool) -> None:
    text = (LOGS / name).read_text(encoding="utf-8")
    for where, cut, insert in edits:  # replace `cut` characters at a relative position
        at = int(where * len(text))
        text = text[:at] + insert + text[at + cut :]
    path = scratch / name
    path.write_text(text, encoding="utf-8")
    _read_or_refuse(path, FIXTURE_FORMATS[name] if explicit else None)
