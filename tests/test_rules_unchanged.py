"""``zero_grad`` from scores no update changes: every score held, an evaluation that repeats itself,
a detector's box losses at 0, and a kohya bar's loss at 0 — each against the near miss that is
a healthy run."""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import read_log


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
