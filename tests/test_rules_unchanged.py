"""``zero_grad`` from scores no update changes: every score held, an evaluation that repeats itself,
a detector's box losses at 0, and a kohya bar's loss at 0 — each against the near miss that is
a healthy run."""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import read_log
from moescope.analyze.rules.unchanged import every_score_held


def findings(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "paste.log"
    path.write_text(text, encoding="utf-8")
    return {f.type: f for f in diagnose(read_log(path))}


XGBOOST = "[{i}]\ttrain-rmse:180.26208\ttrain-custom_mse:64985.51865\ttest-rmse:{test}\t" + (
    "test-custom_mse:59162.27773\n"
)


def test_every_score_held_to_its_last_digit_is_zero_grad(tmp_path: Path) -> None:
    """xgboost#8014: a custom objective that never reaches the booster, four scores round after round."""
    found = findings(tmp_path, "".join(XGBOOST.format(i=i, test="171.99514") for i in range(4)))["zero_grad"]
    assert found.step == 0 and found.evidence["steps"] == [0, 1, 2, 3] and "180.26208" in found.message


@pytest.mark.parametrize(
    "text",
    [
        # one score moving in its last digit: the booster learns, slowly
        "".join(XGBOOST.format(i=i, test=f"171.9951{i}") for i in range(4)),
        # two rounds only
        "".join(XGBOOST.format(i=i, test="171.99514") for i in range(2)),
        # scores printed too coarsely to tell a hold from chance
        "".join(f"[{i}]\ttest-error:0.0272\ttrain-error:0.0102\n" for i in range(6)),
    ],
)
def test_scores_that_move_or_print_coarsely_are_not_held(tmp_path: Path, text: str) -> None:
    assert "zero_grad" not in findings(tmp_path, text)


OPENNMT = (
    "[2018-09-20 15:18:39,264 INFO] Step {step}/1000000; acc:  {acc}; ppl: 55.22; xent: 4.01; lr: 0.00100\n"
)
VALIDATION = (
    "[2018-09-20 15:18:47,173 INFO] Validation perplexity: {ppl}\n"
    "[2018-09-20 15:18:47,173 INFO] Validation accuracy: 35.9623\n"
)


def _evaluated(second_ppl: str) -> str:
    steps = [OPENNMT.format(step=380000, acc=42.02), VALIDATION.format(ppl="56.168")]
    steps += [OPENNMT.format(step=s, acc=a) for s, a in [(509900, 37.34), (509950, 39.09), (510000, 36.21)]]
    return "".join(steps) + VALIDATION.format(ppl=second_ppl)


def test_an_evaluation_that_repeats_itself_is_zero_grad(tmp_path: Path) -> None:
    """OpenNMT-py#966: the validation scores 130,000 steps apart, the same to the last digit."""
    found = findings(tmp_path, _evaluated("56.168"))["zero_grad"]
    assert found.evidence["steps"] == [380000, 510000] and "Validation perplexity 56.168" in found.message
    assert "zero_grad" not in findings(tmp_path, _evaluated("56.169"))


def test_a_held_out_score_printed_on_every_record_is_no_evaluation(tmp_path: Path) -> None:
    """A loop that prints its last validation on every line repeats it until the next one."""
    text = "".join(f"step {i} loss {3 - 0.1 * i:.4f} val_loss 2.7512 val_acc 0.4431\n" for i in range(8))
    assert "zero_grad" not in findings(tmp_path, text)


MMDET = (
    "2020-05-16 14:56:28,250 - mmdet - INFO - Epoch [1][{i}/534]\tlr: 0.00198, time: 0.362, "
    "loss_rpn_cls: {cls:.4f}, {box}: {value}, loss_cls: {cls:.4f}, acc: {acc:.4f}, loss: {total:.4f}\n"
)


@pytest.mark.parametrize(
    ("box", "value", "found"),
    [
        ("loss_rpn_bbox", "0.0000", True),  # mmdetection#2744: no box matched, from the first record
        ("loss_bbox_reg", "0.000000", True),  # PaddleDetection's name
        ("loss_rpn_bbox", "0.0123", False),
        ("loss_reg", "0.0000", False),  # a regulariser's term switched off
    ],
)
def test_a_box_loss_at_zero_beside_class_losses_is_zero_grad(
    tmp_path: Path, box: str, value: str, found: bool
) -> None:
    text = "".join(
        MMDET.format(i=50 * i, cls=0.3 - 0.01 * i, box=box, value=value, acc=90 + i, total=0.7 - 0.02 * i)
        for i in range(1, 5)
    )
    assert ("zero_grad" in findings(tmp_path, text)) is found


def test_a_kohya_bar_whose_loss_is_zero_is_zero_grad(tmp_path: Path) -> None:
    """Lora-Training-in-Comfy#107: sd-scripts' ``avr_loss=0`` epoch after epoch, a LoRA with no effect."""
    bar = "epoch {e}/50\nsteps:  {p}%|███       | {n}/800 [00:46<02:44,  3.79it/s, avr_loss={loss}]\n"
    text = "".join(bar.format(e=e, p=2 * e, n=16 * e, loss=0) for e in range(11, 17))
    assert findings(tmp_path, text)["zero_grad"].step == 176
    moving = "".join(bar.format(e=e, p=2 * e, n=16 * e, loss=f"0.{120 - e}") for e in range(11, 17))
    assert "zero_grad" not in findings(tmp_path, moving)


PPOCR_DET = (
    "[2024/06/22 06:28:25] ppocr INFO: epoch: [4/500], global_step: {step}, lr: 0.000100, "
    "loss: {loss}, loss_shrink_maps: {zero}, loss_threshold_maps: {zero}, loss_binary_maps: {loss}, "
    "avg_batch_cost: 0.0{i}\n"
)


def test_scores_held_beside_terms_at_zero_are_zero_grad_but_a_learned_training_set_is_not(
    tmp_path: Path,
) -> None:
    """PaddleOCR#13159: a text detector's Dice term at exactly 1, its other terms at 0, step after
    step; an accuracy at 1 beside a loss at 0 is a model that has learned its training set."""
    held = "".join(PPOCR_DET.format(step=s, loss="1.000000", zero="0.000000", i=s) for s in (172, 180, 190))
    assert findings(tmp_path, held)["zero_grad"].step == 172
    learned = tmp_path / "learned.log"
    learned.write_text(
        "".join(f"epoch {e} loss: 0.00000 acc: 1.00000\n" for e in range(1, 7)), encoding="utf-8"
    )
    assert not every_score_held(read_log(learned))


SPEECHBRAIN = (
    "epoch: {e}, lr: 1.95e-04, steps: {s}, optimizer: AdamW - train loss: {loss} - valid loss: 9.05e-01, "
    "valid CER: {cer}, valid WER: 1.00e+02\n"
)


@pytest.mark.parametrize(("cer", "found"), [("1.00e+02", True), ("9.87e+01", False)])
def test_error_rates_held_at_one_hundred_percent_are_zero_grad(tmp_path: Path, cer: str, found: bool) -> None:
    """speechbrain#2533: a transducer whose CER and WER stay at 100 % while its loss holds: two
    error rates at 100 show it on three records; one alone needs five."""
    losses = ["1.26e+02", "1.06e+02", "1.06e+02", "1.06e+02"]
    text = "".join(
        SPEECHBRAIN.format(e=e, s=6106 * e, loss=loss, cer=cer) for e, loss in enumerate(losses, 1)
    )
    assert ("zero_grad" in findings(tmp_path, text)) is found


def test_a_learning_rate_printed_as_an_exact_zero_is_zero_grad(tmp_path: Path) -> None:
    """PaddleSpeech#675: ``lr: 0.00000000`` on every record, the loss bouncing about 15."""
    line = "[INFO 2021/06/19 16:01:34 model.py:61] Train: Rank: 0, epoch: 1, step: {s}, lr: {lr}, "
    line += "train_loss: {loss}\n"
    losses = [16.030918, 15.383665, 17.136696, 16.34798, 12.675243]
    text = "".join(line.format(s=5310 + i, lr="0.00000000", loss=v) for i, v in enumerate(losses))
    assert findings(tmp_path, text)["zero_grad"].step == 5310
    for coarse in ("0.00000", "0.000000"):  # 4e-6 prints so, and a warm-up's 1e-8: a small rate, not 0
        assert "zero_grad" not in findings(tmp_path, text.replace("0.00000000", coarse))
    validation = text.replace("Train:", "val,")  # a held-out record's rate is no step's
    assert "zero_grad" not in findings(tmp_path, validation)


def test_a_learning_rate_decayed_past_any_update_or_a_repr_of_zero_is_zero_grad(tmp_path: Path) -> None:
    """Informer2020#469: a rate halved each epoch for 900 epochs (7e-280) moves no weight;
    alpaca-lora#288: HF's dict prints its rate as a repr, so ``'learning_rate': 0.0`` is 0."""
    epoch = (
        "\titers: 100, epoch: {e} | loss: {loss}\n\tspeed: 0.0943s/iter; left time: 1217.0741s\n"
        "Epoch: {e} cost time: 8.27\nEpoch: {e}, Steps: 153 | Train Loss: {loss} Vali Loss: 22288.12 "
        "Test Loss: 13408.78\nEarlyStopping counter: {e} out of 3\nUpdating learning rate to {lr}\n"
    )
    text = "".join(epoch.format(e=e, loss=840 + e % 3, lr=f"{2.0**-e:.6g}") for e in range(915, 919))
    found = findings(tmp_path, text)["zero_grad"]
    assert found.evidence["steps"] == [915, 916, 917, 918] and "4.5e-277" in found.message
    early = "".join(epoch.format(e=e, loss=840 + e % 3, lr=f"{1e-4 * 2.0**-e:.6g}") for e in range(1, 5))
    assert "zero_grad" not in findings(tmp_path, early)
    record = "{{'loss': {}, 'learning_rate': {}, 'epoch': 0.0{}}}\n"
    zero = "".join(record.format(loss, 0.0, i) for i, loss in enumerate([1.2, 1.1, 1.3, 1.2, 1.25]))
    assert findings(tmp_path, zero)["zero_grad"].step == 0
    warming = "".join(record.format(1.2, lr, i) for i, lr in enumerate([0.0, 2e-06, 4e-06, 6e-06, 8e-06]))
    assert "zero_grad" not in findings(tmp_path, warming)


def test_deepspeech_pytorchs_nan_guard_is_a_nonfinite_step(tmp_path: Path) -> None:
    """deepspeech.pytorch#485: a NaN loss caught, replaced by 0 and the update skipped."""
    line = "Epoch: [1][{i}/6051]\tTime 1.781 (1.857)\tData 0.005 (0.005)\tLoss {loss} (73.3981)\n"
    text = "".join(line.format(i=i, loss=f"{40 + i % 7:.4f}") for i in range(4686, 4692))
    text += "WARNING: received a nan loss, setting loss value to 0\nSkipping grad update\n"
    text += line.format(i=4692, loss="0.0000") + line.format(i=4693, loss="40.4348")
    found = findings(tmp_path, text)["nonfinite"]
    assert found.step == 6051 + 4692 and "received a nan loss" in found.message


POINTNET2 = (
    "Epoch {e} ({g}/200):\n100%|█████████████████████| 410/410 [01:18<00:00,  5.24it/s]\n"
    "Train Instance Accuracy: {train}\nTest Instance Accuracy: {test}, Class Accuracy: 0.025000\n"
    "Best Instance Accuracy: {test}, Class Accuracy: 0.025000\n"
)


def test_an_evaluation_on_lines_of_its_own_that_repeats_is_zero_grad(tmp_path: Path) -> None:
    """yanx27's PointNet++ (issue 213): the test accuracies to the last digit, epoch after epoch,
    under each epoch's banner, while the training accuracy moves with the data's order."""
    text = "".join(POINTNET2.format(e=e, g=13 + e, train=f"0.0636{e}", test="0.040453") for e in (4, 5))
    found = findings(tmp_path, text)["zero_grad"]
    assert found.evidence["steps"] == [4, 5] and "Test Class Accuracy 0.025" in found.message
    moved = "".join(POINTNET2.format(e=e, g=13 + e, train=f"0.0636{e}", test=f"0.04045{e}") for e in (4, 5))
    assert "zero_grad" not in findings(tmp_path, moved)


def test_a_loss_at_zero_beside_a_norm_frozen_to_its_last_digit_is_zero_grad(tmp_path: Path) -> None:
    """Qwen3-VL#1658 under ZeRO-2: ``grad_norm: 1.4142135381698608`` on every record, whatever
    the loss, is no measure of a gradient; a loss of 0 beside a norm that moves may be a policy
    loss, 0 by construction."""
    record = "{{'loss': {}, 'grad_norm': {}, 'learning_rate': 1e-06, 'epoch': 0.0{}}}\n"
    losses = [1.502, 0.0, 0.0, 0.0]
    frozen = "".join(record.format(loss, 1.4142135381698608, i) for i, loss in enumerate(losses))
    assert findings(tmp_path, frozen)["zero_grad"].step == 1
    moving = "".join(record.format(loss, 1.41 + 0.13 * i, i) for i, loss in enumerate(losses))
    assert "zero_grad" not in findings(tmp_path, moving)


def test_one_held_out_accuracy_repeated_at_every_evaluation_is_zero_grad(tmp_path: Path) -> None:
    """MXNet's ``Validation-accuracy=0.110204`` epoch after epoch: one answer whatever the input,
    scoring that class's share of the held-out set; on four evaluations, or printed coarsely, no verdict."""
    line = "2016-12-15 12:15:15,447 Node[0] Epoch[{e}] Validation-accuracy={acc}\n"
    text = "".join(line.format(e=e, acc="0.110204") for e in range(6))
    found = findings(tmp_path, text)["zero_grad"]
    assert found.evidence["steps"] == [0, 1, 2, 3, 4, 5] and "share of one class" in found.message
    assert "zero_grad" not in findings(tmp_path, "".join(line.format(e=e, acc="0.110204") for e in range(4)))
    assert "zero_grad" not in findings(tmp_path, "".join(line.format(e=e, acc="0.1102") for e in range(6)))
