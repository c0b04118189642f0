"""The fast paths of reading a large log give what the line-at-a-time and pattern paths give."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from moescope import schema as S
from moescope.analyze.readers import _text, keymap, megatron, read_log, read_runs, records, steplines, verl
from moescope.analyze.readers._text import INT, NUMBER, LogFile, parse_number, plain_number, plain_numbers
from moescope.errors import MoescopeError


def _line_at_a_time(path: Path, cap: int) -> tuple[list[str], int]:
    """The reference: ``readline`` with a cap, the rest of an overlong line passed over."""
    out, cut = [], 0
    with path.open("rb") as f:
        while chunk := f.readline(cap):
            if not chunk.endswith(b"\n") and len(chunk) == cap:
                cut += 1
                while (rest := f.readline(cap)) and not rest.endswith(b"\n"):
                    pass
            out.append(chunk.decode("utf-8", errors="replace").rstrip("\n").removesuffix("\r"))
    return out, cut


def test_blocks_read_the_lines_a_line_at_a_time_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_text, "MAX_LINE", 16)  # small cap and blocks: lines straddle blocks, many are cut
    monkeypatch.setattr(_text, "BLOCK", 37)
    rng, path = random.Random(0), tmp_path / "x.log"
    for _ in range(500):
        path.write_bytes(bytes(rng.choice(b"ab \n\r\xe2\x82\xac") for _ in range(rng.randint(0, 120))))
        log = LogFile(path)
        lines = [line for block in log._read_capped() for line in block]
        assert (lines, log.cut) == _line_at_a_time(path, 16)


@pytest.mark.parametrize(
    "token",
    ["0", "-3", "+7", "1.5", ".5", "1.", "1e-06", "2E+3", "nan", "-inf", "Infinity", "1e999", "9" * 400],
)
def test_plain_numbers_read_as_the_patterns_read_them(token: str) -> None:
    fast, full = plain_number(token), parse_number(token)
    assert type(fast) is type(full) and (fast == full or (math.isnan(fast) and math.isnan(full)))


@pytest.mark.parametrize("token", ["1_0", "True", "None", "np.float64(1)", "0x10", "1.2.3", ""])
def test_anything_else_is_left_to_the_patterns(token: str) -> None:
    assert plain_number(token) is None
    assert plain_numbers(["0.5", token]) is None


@pytest.mark.parametrize(
    ("token", "sign"),
    [("nan.0", 0), ("NaN.00", 0), ("inf.0", 1), ("-inf.0", -1), ("nanxxx", 0), ("infxxx", 1), ("-infxx", -1)],
)
def test_a_nan_with_a_zero_tail_or_a_fill_is_non_finite(token: str, sign: int) -> None:
    """Lightning's bar, as NeMo runs it, prints ``reduced_train_loss=nan.0`` (NeMo#5928);
    PaddleOCR formats its values ``{:x<6f}``, so a NaN is ``loss: nanxxx``."""
    value = parse_number(token)
    assert math.isnan(value) if sign == 0 else value == sign * math.inf
    assert re.fullmatch(NUMBER, token)


@pytest.mark.parametrize(
    ("token", "sign"),
    [
        ("1.#QNAN000", 0),
        ("-1.#IND00", 0),
        ("1.#INF00", 1),
        ("-1.#INF", -1),
        ("1.#R", 0),
        ("nan.08", 0),
        ("nan08", 0),
    ],
)
def test_a_nan_as_windows_prints_it_or_with_a_redrawn_lines_digits_is_non_finite(
    token: str, sign: int
) -> None:
    """CNTK on Windows prints Microsoft's C runtime's ``1.#QNAN000`` (CNTK#406); a status line
    redrawn over itself with ``\\r`` leaves a longer number's digits after a NaN (muzero-general#118:
    ``Loss: nan.08``)."""
    value = parse_number(token)
    assert math.isnan(value) if sign == 0 else value == sign * math.inf
    assert re.fullmatch(NUMBER, token)


def test_a_list_of_plain_numbers_reads_as_each_does() -> None:
    values = ["0.5", "-3", "nan", "1e-06", "+7", "inf", "0"]
    numbers = plain_numbers(values)
    assert numbers is not None and [type(n) for n in numbers] == [type(plain_number(v)) for v in values]
    assert numbers[2] is math.nan and numbers[1] == -3 and numbers[5] == math.inf
    assert plain_numbers(["0.5", " 1"]) is None  # float() would take the space; a field does not


@pytest.mark.parametrize("seed", range(20))
def test_ints_and_nans_among_floats_read_as_each_alone(seed: int) -> None:
    tokens = ["0.5", "-3", "nan", "1e-06", "+7", "inf", "0", "-0", "1e999", "-nan", "9" * 400, "12"]
    values = random.Random(seed).choices(tokens, k=8)
    numbers, each = plain_numbers(values), [plain_number(v) for v in values]
    assert numbers is not None and [type(n) for n in numbers] == [type(n) for n in each]
    assert all(n is e if e is math.nan else n == e for n, e in zip(numbers, each, strict=True))


@pytest.mark.parametrize(
    "rest",
    [
        " - actor/entropy:0.5 - actor/grad_norm:nan - x:3",
        " - a:1 - a:2",  # a later value wins, as in the pattern path
        " - a:1 - b: 2",  # a space after the colon: no pair for the pattern either
        " - a:1 - b:True",
        " - abc - 1:k:2",  # a piece without a colon and one with two: no pairs, however counted
        " - a:1 junk",
        " -  a:1",
        "",
    ],
)
def test_verl_pairs_split_as_the_pattern_reads_them(rest: str) -> None:
    found, left = verl.pairs(rest, 0)
    fast = verl.plain_pairs(rest)
    whole = bool(found) and not left.strip(" -")
    assert fast is None or (whole and fast == {k: parse_number(v) for k, v in found})
    if not whole:  # what the pattern reads only in part is always left to it
        assert fast is None


def test_a_cached_rename_keeps_the_first_of_two_keys_for_one_name() -> None:
    for _ in range(2):  # the second time from the cache
        renamed, kept = keymap.rename("trl", {"loss": 1.0, "actor/loss": 2.0, "grad_norm": 0.1})
        assert renamed == {"loss": 1.0, "actor/loss": 2.0, "actor/grad_norm": 0.1} and kept == ["loss"]
        renamed, kept = keymap.rename("trl", {"loss": 1.0, "grad_norm": 0.1})
        assert renamed == {"actor/loss": 1.0, "actor/grad_norm": 0.1} and kept == []


# the patterns as first written, before their literal or a lookahead was put first for speed
_AS_WRITTEN = [
    (verl.STEP_START, rf"(?<![\w/])step:({INT})(?=\s*-|\s*$)", ["step:", "a", "/", " ", "-", "1", "23"]),
    (megatron.ITERATION, rf"\biteration\s+({INT})\s*/\s*\d+\s*\|", ["iteration", "a", "/", " ", "|", "1"]),
    (
        records._SPLIT,
        r"\s*\|\s*|,\s+|;\s*|\s+-\s+|(?<![:=\s])(?:\t+|\s{2,})|[\[\]]",
        [" ", "\t", "|", ",", ";", "-", "[", "]", ":", "=", "a"],
    ),
]


@pytest.mark.parametrize(("fast", "written", "alphabet"), _AS_WRITTEN)
def test_reordered_patterns_find_what_they_found_as_written(
    fast: re.Pattern[str], written: str, alphabet: list[str]
) -> None:
    reference, rng = re.compile(written), random.Random(0)
    for _ in range(20000):
        text = "".join(rng.choices([*alphabet, "\u00a0", "_", "\n"], k=rng.randint(0, 10)))
        a, b = fast.search(text), reference.search(text)
        assert (a and (a.span(), a.groups())) == (b and (b.span(), b.groups()))
        assert fast.split(text) == reference.split(text)


def test_quoted_blocks_between_a_users_sentences_are_unquoted(tmp_path: Path) -> None:
    """rlpyt#78: two Markdown-quoted blocks of a tabular logger's output, a sentence between them;
    a log with one ``>>>>>>>start training`` line is no quote."""
    block = "> lossAverage               {v}\n> gradNormAverage           {v}\n"
    path = tmp_path / "paste.log"
    path.write_text(block.format(v="nan") + "\nAnd after some iterations:\n\n" + block.format(v="0.0114"))
    assert [rec.get("lossAverage") for rec in read_log(path).steps][1:] == [0.0114]
    lines = LogFile(path).lines
    assert lines[0] == "lossAverage               nan" and "And after some iterations:" in lines
    informer = ">>>>>>>start training : informer>>>>>>>\ntrain 1199\nEpoch: 1, Steps: 9 | Train Loss: 0.5\n"
    path.write_text(informer)
    assert LogFile(path).lines[0].startswith(">>>>>>>start")


def test_cntks_minibatches_and_the_informer_loops_iterations_are_steps(tmp_path: Path) -> None:
    """CNTK#607: ``Epoch[ 1 of 30]-Minibatch[ 501-1000]: ce = 1.#QNAN000 * 500;`` (the samples
    seen the step, ``ce`` the loss); Informer2020's ``iters: 100, epoch: 2 | loss: …`` counted on
    across epochs, its epoch summary's held-out losses under their own names and the rate it
    announces read."""
    cntk = " Epoch[ 1 of 30]-Minibatch[{a:4d}-{b:4d}]: ce = {v} * 500; errs = 0.000% * 500; time = 0.92s\n"
    path = tmp_path / "cntk.log"
    path.write_text(cntk.format(a=1, b=500, v="-0.00000000") + cntk.format(a=501, b=1000, v="1.#QNAN000"))
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [500, 1000] and math.isnan(steps[1][S.ACTOR_LOSS])
    informer = (
        "\titers: 100, epoch: {e} | loss: 0.45\n\titers: 200, epoch: {e} | loss: 0.30\n"
        "Epoch: {e} cost time: 26.3\n"
        "Epoch: {e}, Steps: 384 | Train Loss: 0.28 Vali Loss: 0.62 Test Loss: 0.61\n"
        "Updating learning rate to {lr}\n"
    )
    path.write_text(informer.format(e=1, lr="0.0001") + informer.format(e=2, lr="5e-05"))
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [100, 200, 300, 400]
    assert steps[1]["val loss"] == 0.62 and steps[3][S.LR] == 5e-05 and steps[0][S.ACTOR_LOSS] == 0.45


def test_a_date_before_a_recbole_line_is_no_step(tmp_path: Path) -> None:
    """RecBole's logger opens its lines with ``27 Nov 14:49``: the day is no step, the epoch is."""
    line = "27 Nov 14:49    INFO  epoch {e} training [time: 1.82s, train loss: 1.3043]\n"
    line += "27 Nov 14:49    INFO  epoch {e} evaluating [time: 0.07s, valid_score: 0.428900]\n"
    path = tmp_path / "recbole.log"
    path.write_text("".join(line.format(e=e) for e in range(3)))
    assert [s["step"] for s in read_log(path).steps] == [0, 1, 2]


def test_fields_a_user_set_in_bold_or_brackets_and_camel_case_losses_are_read(tmp_path: Path) -> None:
    """MuseTalk#230's ``**loss=nan**`` mid-line (a banner of asterisks stays), CoupletAI's
    ``[loss]: 4.99``, a C loop's ``TotalLoss nan``."""
    path = tmp_path / "paste.log"
    bar = "Steps:   2%|▍     | {i}/5900000 [19:15:43<1185:20:02,  1.36it/s, **loss={v}**, lr=4.99e-5]\n"
    path.write_text(
        "***** train metrics *****\n" + bar.format(i=92678, v="0.1") + bar.format(i=92679, v="nan")
    )
    assert math.isnan(read_log(path).steps[-1][S.ACTOR_LOSS])
    assert _text._unmarked("INFO ***** Running training *****") == "INFO ***** Running training *****"
    path.write_text(
        "".join(f"INFO - [epoch]: 199, [batch]: {b}, [loss]: 4.9{b % 7}\n" for b in (23900, 24000))
    )
    assert [s[S.ACTOR_LOSS] for s in read_log(path).steps] == [4.92, 4.94]
    path.write_text("".join(f"[{e}|10] TotalLoss nan Accuracy 0.098000\n" for e in range(1, 4)))
    assert all(math.isnan(s["TotalLoss"]) for s in read_log(path).steps)


def test_csv_and_whitespace_tables_keep_rows_a_logger_wrote_in_part(tmp_path: Path) -> None:
    """torchmd-net's ``metrics.csv`` opens with a float epoch (its ``step`` column among the
    others); DeepXDE leaves its test columns blank between evaluations."""
    path = tmp_path / "metrics.csv"
    row = "{e}.0,0.0005,{s},0.0094,5.10{e}\n"
    path.write_text(
        "epoch,lr,step,train_y_mse_loss,val_total_mse_loss\n"
        + row.format(e=20, s=1357436)
        + row.format(e=21, s=1357593)
    )
    assert [s["step"] for s in read_log(path).steps] == [1357436, 1357593]
    path = tmp_path / "deepxde.log"
    path.write_text(
        "Step      Train loss                Test loss                 Test metric\n"
        "1500      [4.55e-03, 3.91e-03]      [1.30e-03, 4.46e-03]      []\n"
        "2000      [3.72e-04, 1.82e-04]                                      \n"
        "2347      [3.65e-02, 1.78e-02]      [1.42e-02, 1.48e-02]      []\n"
    )
    assert [s["step"] for s in read_log(path).steps] == [1500, 2000, 2347]


def test_an_empty_yolo_layers_nan_statistics_are_no_values(tmp_path: Path) -> None:
    """AlexeyAB's darknet#4758: a layer that saw no object prints ``-nan`` means over no box."""
    line = "v3 (mse loss, Normalizer: (iou: 0.75, cls: 1.00) Region {r} Avg (IOU: {iou}, GIOU: {iou}), "
    line += "Class: {iou}, count: {n}, loss = {loss}, class_loss = {loss}, iou_loss = 0.000000\n"
    path = tmp_path / "darknet.log"
    path.write_text(
        line.format(r=82, iou="0.310754", n=9, loss=276.5) + line.format(r=94, iou="-nan", n=0, loss=1421.3)
    )
    assert not any(isinstance(v, float) and math.isnan(v) for s in read_log(path).steps for v in s.values())


def test_a_counter_under_epoch_banners_counts_on_across_epochs(tmp_path: Path) -> None:
    """A tutorial's ``EPOCH 1:`` banner over ``Iteration: 0. Loss: …`` lines: one run whose
    iterations go on from epoch to epoch, not runs pasted one after another."""
    epoch = "EPOCH {e}:\nIteration: 0. Loss: 0.{e}5. Accuracy: 66.1%\n"
    epoch += "Iteration: 1000. Loss: 0.{e}1. Accuracy: 66.2%\n"
    path = tmp_path / "paste.log"
    path.write_text("".join(epoch.format(e=e) for e in range(3)))
    (trace,) = read_runs(path)
    assert [s["step"] for s in trace.steps] == [0, 1000, 1001, 2001, 2002, 3002]


def test_a_loops_step_and_loss_before_its_printed_predictions_are_read(tmp_path: Path) -> None:
    """StudyTensorFlow's char-RNN: ``print(step, cost, predictions, …)`` — the count and the cost,
    then what is no number; a third number after them is no loss of this shape."""
    line = "{s}, {c}, array([2, 2, 2, 3]), [('l', 1.0350623), ('o', 0.89187962)]\n"
    path = tmp_path / "paste.log"
    path.write_text("".join(line.format(s=s, c=3.4 - 0.04 * s) for s in range(47, 52)))
    assert [s["step"] for s in read_log(path).steps] == [47, 48, 49, 50, 51]
    assert records.record("47, 3.43674, array([2])") == (47, None, {"loss": 3.43674})
    assert records.record("47, 3.43674, 0.5") is None


def test_a_headerless_table_under_a_pasted_command_is_no_entropy_log(tmp_path: Path) -> None:
    """DeePMD's ``lcurve.out`` pasted under the ``tail lcurve.out`` that printed it: a table without
    its header (columns numbered), not an entropy in its last column."""
    row = " {s}      1.57e+03      3.71e+02      1.21e-01      2.55e+00    1.1e-04\n"
    path = tmp_path / "paste.log"
    path.write_text("tail lcurve.out\n" + "".join(row.format(s=172000 + 1000 * i) for i in range(6)))
    trace = read_log(path)
    assert trace.header["format"] == "step-table" and S.ENTROPY not in trace.steps[0]
    assert trace.steps[0]["column 6"] == 1.1e-04


def test_names_a_space_from_their_values_beside_a_labelled_field_are_read() -> None:
    """CrossFit's ``Train loss 8761.43 ACC 0.0 on epoch=18``: the loss and the accuracy as well."""
    assert records.pairs("Train loss 8761.43 ACC 0.0 on epoch=18") == {
        "Train loss": 8761.43,
        "ACC": 0.0,
        "epoch": 18,
    }


def test_epoch_summaries_alone_are_read_on_their_epochs(tmp_path: Path) -> None:
    """ConvNeXt#39: DeiT's MetricLogger summaries pasted without the iteration lines, each after its
    ``Epoch: [N] Total time`` line, with the evaluation's sentence and best accuracy below: the
    epochs are the steps (the two ``Max accuracy`` lines are no snapshot of their own)."""
    block = (
        "Epoch: [{e}] Total time: 0:00:41 (1.1597 s / it)\n"
        "Averaged stats: lr: 0.003596  min_lr: 0.003596  loss: {loss} (2.8601)  class_acc: 0.5234 (0.5078)\n"
        "Accuracy of the model on the 2297 test images: {acc}%\nMax accuracy: {acc}6%\n\n"
    )
    path = tmp_path / "paste.log"
    path.write_text(block.format(e=0, loss=2.2043, acc=44.4) + block.format(e=299, loss=0.6883, acc=55.6))
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [0, 299]
    assert steps[1][S.ACTOR_LOSS] == 0.6883 and steps[1]["test accuracy"] == 55.6


def test_a_bars_redraws_on_one_line_are_each_a_record(tmp_path: Path) -> None:
    """fairseq#430: a tqdm bar's redraws pasted without the carriage returns between them, each
    state its own record on the update count its postfix names."""
    state = "| epoch 009:   {p}%| | {i}/35 [00:0{i}<00:40,  1.18s/it, loss={loss}, ppl=25.2, num_updates={u}"
    line = "".join(state.format(p=3 * i, i=i, loss=11.3 + 0.1 * i, u=280 + i) for i in range(1, 5))
    path = tmp_path / "paste.log"
    path.write_text(line + "\n")
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [281, 282, 283, 284]
    assert [s[S.ACTOR_LOSS] for s in steps] == pytest.approx([11.4, 11.5, 11.6, 11.7])


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        ("Episode 39{i}: 12.0", S.REWARD_MEAN, 12.0),  # an RL loop's episode and its reward
        ("epoch {i}: 2.838", "value", 2.838),  # a value the paste does not name
        (
            "I0609 18:33:02.396359 1400 impala_lite.py:178] Episode ended with reward: -1.0",
            S.REWARD_MEAN,
            -1.0,
        ),
    ],
)
def test_a_counter_and_its_unnamed_value_or_an_episodes_sentence_is_read(
    tmp_path: Path, line: str, key: str, value: float
) -> None:
    """cyoon1729/deep-Q-networks#3, DeiT#160 and Haiku's IMPALA (dm-haiku#160): no step recognised
    before; each line a record, its number under the name the line gives it."""
    path = tmp_path / "paste.log"
    path.write_text("".join(line.format(i=i) + "\n" for i in range(3)))
    steps = read_log(path).steps
    assert len(steps) == 3 and steps[0][key] == value


def test_a_clock_after_a_tables_columns_is_passed_over(tmp_path: Path) -> None:
    """CT-GAN#1: rows of ``|``-separated numbers under a header of names, each row ending in the
    time it took (``2 days, 12:04:16.416641``), a column no name stands over."""
    rows = "".join(
        f"0.00{i}051 | 100 | {6 - 0.1 * i:.6f} | 2 days, 12:04:{10 + i}.416641\n" for i in range(4)
    )
    path = tmp_path / "paste.log"
    path.write_text("D_loss       acc     G_loss\n" + rows)
    steps = read_log(path).steps
    assert (
        len(steps) == 4
        and steps[1]["G_loss"] == 5.9
        and set(steps[1]) == {"step", "D_loss", "acc", "G_loss", "raw"}
    )


def test_names_then_their_values_each_cut_at_a_bar_are_paired(tmp_path: Path) -> None:
    """DCGAN-for-Bird-Generation#12: ``Batch 168/170 generator loss | discriminator loss :
    3.7583103 | 0.9910032``, the batch the step and each value under the name in its place."""
    line = "   Batch {b}/170 generator loss | discriminator loss : {g} | 0.99 - batch took 2.1 s.\n"
    path = tmp_path / "paste.log"
    path.write_text("".join(line.format(b=b, g=3 + 0.1 * b) for b in (168, 169, 170)))
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [168, 169, 170]
    assert steps[0]["generator loss"] == pytest.approx(19.8) and steps[0]["discriminator loss"] == 0.99


def test_keras_bars_without_epoch_lines_ending_mid_epoch_are_epochs(tmp_path: Path) -> None:
    """keras#932: finished bars, one an epoch, pasted without their ``Epoch`` lines, the last bar
    the epoch the paste ends in: each is its epoch (they were one step, the last a second run)."""
    done = "370784/370784 [==============================] - 6700s - loss: {v} - acc: 0.42\n"
    text = "".join(done.format(v=v) for v in (1.8887, 1.9328, 1.9986))
    text += "137856/370784 [==========>...................] - ETA: 4147s - loss: 2.1578 - acc: 0.3390\n"
    path = tmp_path / "paste.log"
    path.write_text(text)
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in read_log(path).steps] == [
        (1, 1.8887),
        (2, 1.9328),
        (3, 1.9986),
        (4, 2.1578),
    ]


def test_a_bars_share_is_no_step() -> None:
    """RLinf#298 and Tune-A-Video#72: ``Global Step:   6%| | 58/1000 [...]`` names its share done
    after the word ``Step``; the bar's count is the step."""
    line = "Global Step:   6%| | 58/1000 [8:09:07<131:38:32, 503.09s/it, env/reward=0.0]"
    assert steplines.STEP.search(line) is None
    assert records.marker(line)[1] == 58


def test_names_joined_before_one_colon_take_their_joined_values(tmp_path: Path) -> None:
    """triplet-reid#30's ``loss min|avg|max: 0.713|2.607|60.013`` (the word before the names heads
    each) and InvSR#46's ``ldif/ldis/…:t(100):0.43/…, t(250):…`` (each list under its label), with
    the iteration InvSR prints over its total the step; a NaN among them is found."""
    path = tmp_path / "paste.log"
    path.write_text("iter:    20, loss min|avg|max: 0.713|2.607|60.013, batch-p@3: 4.43%, ETA: 6:01:18\n")
    assert read_log(path).steps[0] | {"raw": None} == {
        "step": 20,
        "loss_min": 0.713,
        "loss_avg": 2.607,
        "loss_max": 60.013,
        "batch-p@3": 4.43,
        "raw": None,
    }
    line = "Train: {i:06d}/200000, ldif/ldis/real:t(100):0.43/{d}/+0.01, t(250):0.44/{d}/-0.05, lr:5.0e-05\n"
    path.write_text("".join(line.format(i=i, d=d) for i, d in ((16600, "+0.0076"), (16800, "  +nan"))))
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [16600, 16800] and steps[0]["t(250)/real"] == -0.05
    assert steps[0]["t(100)/ldis"] == 0.0076 and math.isnan(steps[1]["t(250)/ldis"])


def test_a_losss_terms_in_parentheses_are_named_after_it(tmp_path: Path) -> None:
    """TensorLayer's SRGAN: ``Epoch: [47/100] step: [79/250] time: 2.377s, g_loss(mse:0.000,
    vgg:0.000, adv:0.001) d_loss: 1.387``, the step counted within the epoch."""
    line = (
        "Epoch: [47/100] step: [{i}/250] time: 2.3s, g_loss(mse:0.000, vgg:0.000, adv:0.001) d_loss: 1.387\n"
    )
    path = tmp_path / "paste.log"
    path.write_text(line.format(i=79) + line.format(i=80))
    steps = read_log(path).steps
    assert [s["step"] for s in steps] == [46 * 250 + 79, 46 * 250 + 80]
    assert {k: v for k, v in steps[0].items() if "loss" in k} == {
        "g_loss/mse": 0.0,
        "g_loss/vgg": 0.0,
        "g_loss/adv": 0.001,
        "d_loss": 1.387,
    }


def test_insightfaces_speedometer_reads_its_batch_range_and_loss_value(tmp_path: Path) -> None:
    """InsightFace#958: MXNet's Speedometer as InsightFace prints it, ``Epoch[0] Batch [20-40]``, the
    last batch the step, and its ``lossvalue`` metric the loss."""
    line = "INFO:root:Epoch[0] Batch [{a}-{b}]\tSpeed: 0.96 samples/sec\tacc=0.005952\tlossvalue=6.244117\n"
    path = tmp_path / "paste.log"
    path.write_text(line.format(a=0, b=20) + line.format(a=20, b=40))
    steps = read_log(path).steps
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in steps] == [(20, 6.244117), (40, 6.244117)]


def test_a_value_said_on_its_iteration_and_darts_unnamed_reports_are_read(tmp_path: Path) -> None:
    """DiffEqFlux#528's callback, ``Loss of 0.013182825077950069 on iteration 2``, and DARTS's
    unnamed reports (PC-DARTS#15: ``train 100 6.911373e+00 0.085087 0.605275``: the step, the loss,
    top-1 and top-5; a ``valid`` report read into the training step before it)."""
    path = tmp_path / "paste.log"
    path.write_text(
        "".join(f" Loss of 0.01318282507795006{7 + 2 * (i % 2)} on iteration {i}\n" for i in (2, 3))
    )
    assert [(s["step"], s[S.ACTOR_LOSS]) for s in read_log(path).steps] == [
        (2, 0.013182825077950067),
        (3, 0.013182825077950069),
    ]
    stamp = "2019-12-31 00:05:44,815"
    path.write_text(
        f"{stamp} train 100 6.911373e+00 0.085087 0.605275\n"
        f"{stamp} train 150 6.910863e+00 0.087955 0.587231\n"
        f"{stamp} valid 000 6.901000e+00 0.100000 0.500000\n"
    )
    steps = read_log(path).steps
    assert [(s["step"], s[S.ACTOR_LOSS], s["top1"]) for s in steps] == [
        (100, 6.911373, 0.085087),
        (150, 6.910863, 0.087955),
    ]
    assert steps[1]["valid loss"] == 6.901


def test_an_epochs_opening_line_of_its_rate_is_a_banner_not_a_step(tmp_path: Path) -> None:
    """DARTS opens each epoch with ``epoch 49 lr 1.023679e-03`` and counts its reports from 000
    again under it: one run, counted on across the epoch, the rate on the epoch's first record (read
    as a step of its own, the 49 split the paste into two runs); a 12-hour clock's ``AM`` is not
    part of the next name. Flair's ``EPOCH 1: lr 0.1000 - bad epochs 0`` closes its epoch: a step."""
    stamp = "07/08 05:56:51 AM"
    path = tmp_path / "paste.log"
    path.write_text(
        f"{stamp} train 300 1.792845e-02 99.667774 100.000000\n"
        f"{stamp} train 350 1.800602e-02 99.675036 100.000000\n"
        f"{stamp} train_acc 99.684000\n"
        f"{stamp} epoch 49 lr 1.023679e-03\n"
        f"{stamp} genotype = Genotype(normal=[('skip_connect', 0)], normal_concat=[2, 3, 4, 5])\n"
        f"{stamp} train 000 7.202163e-03 100.000000 100.000000\n"
        f"{stamp} train 050 1.612345e-02 99.750000 100.000000\n"
    )
    runs = read_runs(path)
    assert len(runs) == 1
    steps = runs[0].steps
    assert [(s["step"], s["epoch"]) for s in steps] == [(300, 48), (350, 48), (351, 49), (401, 49)]
    assert steps[1]["train_acc"] == 99.684 and steps[2][S.LR] == 1.023679e-03
    assert not any(key.startswith("AM") for s in steps for key in s)
    path.write_text(
        "epoch 1 - iter 0/1076 - loss 45.75755310\nepoch 1 - iter 107/1076 - loss 8.66741825\n"
        "EPOCH 1: lr 0.1000 - bad epochs 0\nepoch 2 - iter 0/1076 - loss 7.1\n"
    )
    assert any(s["step"] == 1 and s[S.LR] == 0.1 for s in read_runs(path)[0].steps)


def test_a_metric_a_line_behind_pythons_logging_is_a_snapshot(tmp_path: Path) -> None:
    """flgo's logger (easyFL#39): ``2023-08-11 12:35:17,211 simple_logger.py log_once [line:28] INFO
    test_loss                     nan``, one metric a line behind the paste's ``- > ``; the
    logger's ``[line:28]`` is no metric."""
    head = "- > 2023-08-11 12:35:17,211 simple_logger.py log_once [line:28] INFO "
    path = tmp_path / "paste.log"
    path.write_text(f"{head}test_loss                     nan\n{head}test_accuracy                 0.1000\n")
    trace = read_log(path)
    assert trace.header["format"] == "key-values" and len(trace.steps) == 1
    assert math.isnan(trace.steps[0]["test_loss"]) and trace.steps[0]["test_accuracy"] == 0.1
    assert "line" not in trace.steps[0]


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("epoch: 3 - train Avg_loss: 8.34, train Avg_acc: 39.41, train Lr_value: 9.41e-04", 3),
        ("[Epoch: 01] [Batch: 0651/1425] L: 0.39662  Avg L: 0.44018  mIoU: 64.45  |  FB-IoU: 78.73", 2076),
    ],
)
def test_3dspeakers_epoch_and_hsnets_batch_lines_name_their_step(line: str, step: int) -> None:
    """3D-Speaker's ``epoch: 3 - train Avg_loss: 8.34, …`` (the epoch the step) and HSNet's logger as
    LSeg prints it, ``[Epoch: 01] [Batch: 0651/1425]`` (the batch counted on across epochs)."""
    assert records.marker(line)[1] == step


@pytest.mark.parametrize(
    ("text", "steps", "values"),
    [
        (  # pytorch_sac / DrQ / CURL's MetersGroup: abbreviations under their names, S the step
            "| train | E: 2 | S: 1000 | R: 12.5000 | D: 3.1 s | BR: 0.0812 | ALOSS: -1.2034 | CLOSS: 0.4117 |"
            " TLOSS: 0.3310 | TVAL: 0.0998 | AENT: 2.8140\n| eval | S: 1000 | ER: 15.2500\n",
            [1000],
            {
                "critic_loss": 0.4117,
                "actor_entropy": 2.814,
                "eval/episode_reward": 15.25,
                S.REWARD_MEAN: 12.5,
            },
        ),
        (  # a GAN loop's glued losses, tab-separated: its epoch the step
            "Epoch: 7\tT_gloss: 2.518290\tT_closs: 0.611404\n"
            "Epoch: 8\tT_gloss: 2.734412\tT_closs: 0.590221\n",
            [7, 8],
            {"T_gloss": 2.51829, "T_closs": 0.611404},
        ),
        (  # a summarizer's checkpoint sweep: one ROUGE score a checkpoint
            "0001000.tar rouge_1: 0.2871\n0002000.tar rouge_1: 0.2935\n",
            [0, 1],
            {"rouge_1": 0.2871},
        ),
        (  # SheepRL: one environment's episode reward, of a vector of them
            "Rank-0: policy_step=40960, reward_env_3=-21.0\nRank-0: policy_step=41472, reward_env_0=-20.0\n",
            [0, 1],
            {S.REWARD_MEAN: -21.0},
        ),
        (  # Lightning's ModelCheckpoint: the monitored value on its global step
            "Epoch 0, global step 12: 'val_acc' reached 0.71250 (best 0.71250), saving model to "
            "'/tmp/ckpt/epoch=0-step=12.ckpt' as top 3\nEpoch 1, global step 24: 'val_acc' was not in top 3\n"
            "Epoch 2, global step 36: 'val_acc' reached 0.74375 (best 0.74375), saving model to "
            "'/tmp/ckpt/epoch=2-step=36.ckpt' as top 3\n",
            [12, 36],
            {"val_acc": 0.7125, "epoch": 0},
        ),
        (  # caffe's outputs named with a hyphen: each its value
            "Iteration 2000, Testing net (#0)\nTest net output #0: accuracy/top-1 = 0.312\n"
            "Test net output #1: loss = 2.91004 (* 1 = 2.91004 loss)\n",
            [2000],
            {"valid/accuracy/top-1": 0.312, "valid/loss": 2.91004},
        ),
    ],
)
def test_more_loggers_lines_are_read_on_their_steps(
    tmp_path: Path, text: str, steps: list[int], values: dict[str, float]
) -> None:
    """mbrl-lib#137 (MetersGroup), EEG2Image#18, Text-Summarizer-Pytorch#26, sheeprl#330, a
    Lightning ModelCheckpoint run and video-caffe#11: no step recognised, or a metric missed,
    before."""
    path = tmp_path / "paste.log"
    path.write_text(text)
    trace = read_log(path)
    assert [s[S.STEP] for s in trace.steps] == steps
    assert {k: trace.steps[0][k] for k in values} == values


def test_ray_tunes_status_table_is_read_a_row_a_trial_on_its_iteration(tmp_path: Path) -> None:
    """MARLlib#239: Tune's ``| Trial name | status | loc | iter | … |`` table, a trial's name, status
    and address no metrics; read as plain NaN text before. A second trial is another run, not a
    later step of the first."""
    rule = "+------------------+----------+-----------------+--------+----------+--------------------+\n"
    row = (
        "| PPO_env_1a2b3_0000{0} | RUNNING  | 10.0.0.7:424{0}   |      {1} |   {2}   |               {3} |\n"
    )
    path = tmp_path / "paste.log"
    for trials, notes in (([(0, 3, 12.5, 88.1)], 0), ([(0, 3, 12.5, 88.1), (1, 5, 3.5, 20.4)], 1)):
        path.write_text(
            rule
            + "| Trial name       | status   | loc             |   iter |   reward |   episode_len_mean |\n"
            "|------------------+----------+-----------------+--------+----------+--------------------|\n"
            + "".join(row.format(*trial) for trial in trials)
            + rule
        )
        trace = read_log(path)
        assert trace.header["format"] == "step-table" and len(trace.notes) == notes
        assert trace.steps == [
            {S.STEP: 3, S.REWARD_MEAN: 12.5, "episode_len_mean": 88.1, "raw": trace.steps[0]["raw"]}
        ]


def test_an_old_keras_epoch_line_is_its_epoch_and_a_callbacks_message_no_marker(tmp_path: Path) -> None:
    """pose-regression#3: old Keras's ``verbose=2`` line (`` - 1782s - loss: …``, no batch count)
    under ``Epoch 44/120``, then ModelCheckpoint's ``Epoch 00044: val_acc did not improve``: each
    record on its epoch; the callback's line had opened a step of its own, each epoch's record
    read into the epoch before."""
    text = "".join(
        f"Epoch {e}/120\n - 178{e % 10}s - loss: {4.5 - e / 1000:.4f} - acc: 0.4487\n\n"
        f"Epoch {e:05d}: val_acc did not improve\n"
        for e in (44, 45, 46)
    )
    path = tmp_path / "paste.log"
    path.write_text(text + "Epoch 00047: val_loss improved from 0.52 to 0.49, saving model to m.h5\n")
    assert [s[S.STEP] for s in read_log(path).steps] == [44, 45, 46]


def test_julias_show_of_a_counter_and_a_loss_is_read_on_its_counter(tmp_path: Path) -> None:
    """Flux.jl#798: ``@show (i, loss(dataset[1]...))`` prints ``(3, 0.29602579662457984 (tracked))``:
    no step recognised before."""
    path = tmp_path / "paste.log"
    path.write_text(
        "".join(f"    (i, loss(dataset[1]...)) = ({i}, 0.{4 - i}71 (tracked))\n" for i in (1, 2, 3))
    )
    assert [(s[S.STEP], s[S.ACTOR_LOSS]) for s in read_log(path).steps] == [
        (1, 0.371),
        (2, 0.271),
        (3, 0.171),
    ]


def test_records_before_the_first_step_are_said_to_join_it(tmp_path: Path) -> None:
    """A ScaledAdam warning before icefall's first train line joins that line's step: the note
    said they joined the step before them, which there was none of."""
    path = tmp_path / "paste.log"
    path.write_text(
        "grad_norm: 0.0357\nEpoch 1, batch 1150, loss: 0.1201\nEpoch 1, batch 1200, loss: 0.1187\n"
    )
    trace = read_log(path)
    assert trace.steps[0][S.STEP] == 1150 and trace.steps[0][S.GRAD_NORM] == 0.0357
    assert any("the first step where none came before" in note for note in trace.notes)
    path.write_text(
        "Epoch 1, batch 1150, loss: 0.1201\ngrad_norm: 0.0357\nEpoch 1, batch 1200, loss: 0.1187\n"
    )
    assert not any("none came before" in note for note in read_log(path).notes)


def test_a_keras_line_wrapped_into_several_pieces_is_one_record(tmp_path: Path) -> None:
    """pose-regression#3: an old Keras's ``verbose=2`` line of a model with many outputs, wrapped by
    the terminal at a fixed width into four pieces, one epoch pasted: its pieces had been dropped
    and a name cut at the wrap read as a metric of its own (``b_acc_7``)."""
    names = [f"out{k}_acc_{j}" for k in (1, 2) for j in range(8)]
    record = " - 1782s - loss: 4.5771 - " + " - ".join(f"{name}: 0.4487" for name in names)
    width = 90
    pieces = [record[i : i + width] for i in range(0, len(record), width)]
    path = tmp_path / "paste.log"
    path.write_text("Epoch 44/120\n" + "\n".join(pieces) + "\n\nEpoch 00044: val_acc did not improve\n")
    steps = read_log(path).steps
    assert len(pieces) >= 4 and len(steps) == 1
    assert {k for k in steps[0] if "acc" in k} == set(names)
    before = "Epoch 43/120\n - 1781s - loss: 4.5800 - out1_acc_0: 0.4487 - out1_acc_1: 0.4487\n"
    path.write_text(before + path.read_text())  # an epoch's shorter line first: the wrap still found
    steps = read_log(path).steps
    assert [s[S.STEP] for s in steps] == [43, 44] and {k for k in steps[1] if "acc" in k} == set(names)


def test_a_tune_table_cut_inside_its_first_row_is_no_crash(tmp_path: Path) -> None:
    """A paste that ends in the first cell of a Tune table's first row: a row narrower than its
    step column (an index out of range before)."""
    path = tmp_path / "paste.log"
    path.write_text(
        "| Trial name          | status   | loc           |   iter |   reward |\n"
        "|---------------------+----------+---------------+--------+----------|\n| MA"
    )
    with pytest.raises(MoescopeError, match="no step"):
        read_log(path)
