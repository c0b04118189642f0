"""Any line that attaches numbers to metric names: the reader every step-like line falls back to.

Trainers not listed elsewhere, home-made loops and hand-abbreviated pastes print a step's
metrics as ``name: value``, ``name=value`` or ``name value`` fields, with a step marker somewhere
on the line (or none). The marker is found first, each as its framework prints it:

- mmengine / XTuner: ``Iter(train) [ 510/2046]  lr: 1.7590e-04  …  loss: 0.6919  grad_norm: nan``
  and ``Epoch(train) [1][200/735]  …`` (step = (epoch − 1) × per-epoch + i); mmcv 1.x's
  ``Iter [10100/316440]\tlr: 3.990e-04, …, loss: nan, grad_norm: nan``;
- PyTorch's MNIST example and the loops copied from it: ``Train Epoch: 1 [640/60000 (1%)]\tLoss:
  2.214`` ((epoch − 1) × n + i); PaddlePaddle's ``Iter[110]; train loss: nan``;
- home-made loops: ``Epoch:[0/10](100/500) loss:0.12 lr:1e-4 grad_norm:1.3`` (epoch × n + i);
- Swin Transformer's loop (VMamba): ``INFO Train: [29/300][2670/2859]  eta 0:01:24 lr 0.000872 …``
  and Hand4Whole's ``Epoch 0/7 itr 26/3489: lr: 0.0001 … loss_smpl_pose: 0.3386`` (epoch × n + i);
- PyTorch's ImageNet example, DeiT / MAE's MetricLogger: ``Epoch: [3][ 740/2429]  Time 2.46 (2.27)
  … Loss 1.2 (1.3)`` and ``Epoch: [0]  [ 10/582]  lr: 0.000002  loss: 0.6931 (0.6931)`` (epoch × n + i);
- an RL loop's ``Episode  50/400 | Reward moyen (100 ep): 22.6`` (CoursIA#2368; a name with an
  aside in parentheses is kept as logged), and an epoch's ``Epoch 144/1000 | Loss 2214.41 | …``;
- NeMo 2.0: ``Training epoch 0, iteration 120/149 | lr: 3e-05 | … | reduced_train_loss: 1.233``;
- torchtune's progress bar ``1|10|Loss: 1.2345`` (epoch|step|loss);
- Keras's ``200/200 [======] - 4s 20ms/step - loss: 0.71`` under its ``Epoch 2/10`` header
  ((epoch − 1) × n + i: each epoch's counter starts over), and an old Keras's ``61878/61878
  [======] - 5s - loss: 0.74`` under a bare ``Epoch 9`` (keras#21): the epoch is the step;
- a tqdm bar with a postfix: ``10%|█ | 10/100 [00:10<01:30, 1.0it/s, loss=0.123, lr=1e-5]``, or
  as a notebook's text output keeps it, without the bar (``10% 10/100 [00:10<01:30, …]``);
  of several bars on one line the last counts (trlx's rollout bar glued before its training
  bar, trlx#342), and a framework's warning glued after the bar (DeepSpeed's ``OVERFLOW!``) is
  read into that step as :mod:`~moescope.analyze.readers.alerts` reads it on a line of its own;
- any ``step N``, ``global_step: N``, ``iteration N:``, ``iter N``, ``Step: N`` (DeepSpeed-Chat's
  ``epoch: 0|step: 3183|ppo_ep: 1|act_loss: …``, LLaMA-Factory's ``current_steps``, the
  ``iteration 10: load_balancing_loss: 1.09E+00`` of a hand-abbreviated paste);
- a loop's prose, the name before its counter and the value after ``is`` (LXMERT's ``The training
  loss for Epoch 1 is 7.3978``, ``Loss at step 100 is 2.31``), and its prints of an epoch or an
  episode beside a metric (``Epoch 3 loss: 2.1``, ``[Epoch 3] loss: 2.1``, ``Epoch [3/20], Loss:
  2.1``, ``Episode 3 reward: 9.0``: the epoch the step, or, printed on several lines of an epoch,
  each line its own record in order); the PyTorch tutorials' ``Epoch [1/5], Step [100/600], Loss:
  0.2153`` and the word language model example's ``| epoch 6 | 400/ 700 batches | … | loss 7.66``
  ((epoch − 1) × n + i); LightGBM's ``[4]\ttraining's binary_logloss: 0.77`` (``training/…``);
- a home-made loop's counter opening the line: ``268/446 (epoch 0), train_loss = 2.097``,
  ``[5000] model_grad_norm nan``, ``250 | loss 4.0938 | lr 3.000000e-04 | 13707.39ms``;
- fairseq's early ``| epoch 010  2000 / 8223 loss=1.27 (1.50), …`` (epochs from 1), tianshou's
  ``Epoch #1: 50001it [… loss=-0.562, rew=200.00]``, YOLACT's ``[  1]    1510 || B: 5.515 | …``,
  an epoch's own lines (``===> Epoch 162 Complete: Avg. Loss: 0.0142``), a global counter over
  the inner ones before it (MiniLLM's ``global iter: 15/ 5000``), PyTorch-YOLOv3's ``[Epoch 0/30,
  Batch 323/1313] [Losses: x 0.1, …, total 3.2]`` (each term ``x_loss``, …, ``total`` the loss)
  and the WGAN / DCGAN examples' ``[167/1000][555/782][24987] Loss_D: -0.77`` (epochs from 0).

A line is read without glog's prefix (caffe's ``I0515 11:05:31.873651 37636 solver.cpp:239]``;
each ``Train net output #0: loss_bbox = 0.1`` under its own name), with a name in brackets before
its number as a field (``[Loss] 2.5 | [step] 300``) and a value printed as an array (``loss:
[nan]``) as its mean. Keras's finished bars pasted without their ``Epoch`` lines are a bar an
epoch; a boxed logger table's step row (``| step | 1.53e+05 |``, SB3's ``total_timesteps``) is its
record's step.

Then every field of the rest of the line is read (:func:`pairs`). A line with a marker and a
field is a record on that step; a line without a marker is a record when one of its names is a
metric some key map knows (``average reward score: 0.2``), and joins the step before it, or, in
a log without any marker, counts as its own step in order — unless every record carries an
``epoch`` counter that rises from record to record (a loop that logs once an epoch, ``epoch:
3451 loss: nan``): then that counter is the step. Records of one step that follow each
other (one metric a line) are one record. fairseq's validation line (``| valid on 'valid' subset |
loss 9.329 | … | num_updates 9165``) keeps its names under ``valid/``: on the step of the
training line before it, its loss would stand in for the training loss. The framework is named
by the marker where it is a framework's own (mmengine, NeMo, torchtune), else guessed from the
names against every key map;
names the framework's table lacks are read through the ``generic`` one.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from functools import cache, lru_cache
from itertools import pairwise
from typing import Any

from moescope import schema as S
from moescope.analyze.readers import _template, megatron
from moescope.analyze.readers._fields import HELD_OUT, field
from moescope.analyze.readers._rows import Parsed, Row, epochs_as_steps, scan
from moescope.analyze.readers._text import (
    BAR_HEAD,
    DARKNET_COUNTS,
    INT,
    MAX_PIECES,
    NUMBER,
    LogFile,
    as_step,
    number_or_none,
    parse_number,
    plain_number,
)
from moescope.analyze.readers.alerts import said
from moescope.analyze.readers.keymap import KEY_MAP, canonical, guess_beyond_generic
from moescope.analyze.readers.plain import EMPTY_REGION
from moescope.analyze.readers.verl import RAY_PREFIX

_I = rf"\s*+({INT})\s*+"  # possessive: a run of spaces is read one way, not split every way
# a counter's words before a labelled field: " Loss : 1.46", " train loss: 2.1" (a lookahead)
_NAME_THEN_VALUE = r"\s+(?=[A-Za-z_][\w ]{0,30}?\s*[:=]\s*(?:[-+.\d]|(?i:nan|inf)))"
# or a code name and its value, a space between: " train_loss 2.1", "\tLoss 6.7", " loss nan"
_CODE_NAME_THEN_VALUE = r"\s+(?=[A-Za-z_][\w./\-]*\s+(?:[-+]?\.?\d|[-+]?(?i:nan|inf)))"
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_SR_COUNT = rf"\[({INT})/({INT})\]"  # EDSR's samples of the epoch: "[1600/16000]"
# an epoch's (or an episode's, a round's) own line: its marker in MARKS, the step only where it logs
# once an epoch (:func:`_epochs_printed_within`)
_EPOCH_LINE = re.compile(
    rf"(?<![\w/])(?<![Ee]nd of )(?:(?:Epoch|Episode|Ep\.?|Round)\s*+(?:(?:#|:(?=\s*{INT}\s+-\s))\s*+)?"
    rf"|Epoch:\s*\[\s*(?={INT}\s*\]\s+Total time:))"  # MetricLogger's "Epoch: [3] Total time: …"
    rf"({INT})(?:\s*/\s*{INT})?"
    rf"(?=\s*(?::|,|\||(?:Complete|completed|finished|done)\b|\]\s*$|\]\s+Total time:)|\s+-\s"
    rf"|[\])]?(?:{_NAME_THEN_VALUE}|{_CODE_NAME_THEN_VALUE}))",
    re.I,
)


# an epoch over the run's epochs, as the PyTorch tutorials' loop prints it once an epoch (or on every
# line within it: OneFlow's quick start, "Epoch [19/20], Loss: 2.2955")
_EPOCH_OUT_OF = re.compile(rf"(?<![\w/])Epoch\s*\[{_I}/\s*{INT}\s*\](?=\s*[,:|]|{_NAME_THEN_VALUE})", re.I)


def _epoch_from_one(match: re.Match[str]) -> int:
    """``(epoch, i, per_epoch)`` groups, epochs counted from 1 (mmengine) → a global step."""
    epoch, i, per = (int(g) for g in match.groups())
    return max(epoch - 1, 0) * per + i


def _epoch_from_zero(match: re.Match[str]) -> int:
    """The same, epochs counted from 0 (``Epoch:[0/10](100/500)``)."""
    epoch, i, per = (int(g) for g in match.groups())
    return epoch * per + i


MARKS: tuple[tuple[str | None, re.Pattern[str], Callable[[re.Match[str]], int]], ...] = (
    ("mmengine", re.compile(rf"Iter\((?:train|val|test)\)\s*\[{_I}/\s*{INT}\s*\]"), lambda m: int(m[1])),
    ("mmengine", re.compile(rf"Epoch\(train\)\s*\[{_I}\]\s*\[{_I}/{_I}\]"), _epoch_from_one),
    # mmcv 1.x's IterBasedRunner, mmengine's predecessor: "Iter [10100/316440]\tlr: 3.990e-04, …"
    ("mmengine", re.compile(rf"(?<![\w)])Iter\s*\[{_I}/\s*{INT}\s*\]"), lambda m: int(m[1])),
    # the PyTorch word language model example and the LM repositories built on it, epochs from 1:
    # "| epoch   6 |   400/  700 batches | lr 15.00 | ms/batch 135.70 | loss  7.66 | ppl  2121.22"
    (None, re.compile(rf"^\s*\|\s*epoch{_I}\|{_I}/{_I}batches\b"), _epoch_from_one),
    # fairseq's early progress lines, epochs from 1: "| epoch 010  2000 / 8223 loss=1.27 (1.50), …"
    # (where the line counts its updates, "num_updates=431", they are the step)
    (
        "fairseq",
        re.compile(rf"^\s*\|\s*epoch\s+({INT}):?\s+({INT})\s*/\s*({INT})(?=\s)(?!.*num_updates)"),
        _epoch_from_one,
    ),
    # tianshou's epoch bar, its postfix the fields: "Epoch #1: 50001it [00:40, 1244.54it/s, env_step=…]"
    (None, re.compile(rf"^\s*Epoch\s*#\s*({INT}):"), lambda m: int(m[1])),
    # DINOv2's MetricLogger, its header and the iteration: "Training  [   1250/2500000]  eta: 40 days, …"
    (None, re.compile(rf"^\s*Training\s+\[\s*({INT})\s*/\s*{INT}\s*\]"), lambda m: int(m[1])),
    # PaddlePaddle's model zoo (ICNet): "Iter[110]; train loss: nan; sub4_loss: nan"
    (None, re.compile(rf"(?<![\w)])Iter\s*\[{_I}\]"), lambda m: int(m[1])),
    # PyTorch's MNIST example and every loop copied from it, samples counted within each epoch
    # (from 1): "Train Epoch: 1 [640/60000 (1%)]\tLoss: 2.214"
    (None, re.compile(rf"Train Epoch:\s*+{_I}\[{_I}/{_I}\(\s*\d+%\)\]"), _epoch_from_one),
    (None, re.compile(rf"Epoch\s*\[{_I}\]\s*\[{_I}/{_I}\]"), _epoch_from_one),
    # PyTorch-YOLOv3, epochs from 0: "[Epoch 0/30, Batch 323/1313] [Losses: x 0.1, …, total 3.2]"
    (None, re.compile(rf"\[Epoch\s++{_I}/\s*{INT}\s*,\s*Batch\s++{_I}/{_I}\]"), _epoch_from_zero),
    # PyTorch-GAN's implementations and the loops copied from them, epochs from 0: "[Epoch 0/200]
    # [Batch 100/938] [D loss: 0.69] [G loss: 0.70]"
    (None, re.compile(rf"\[Epoch\s++{_I}/\s*{INT}\s*\]\s*\[Batch\s++{_I}/{_I}\]"), _epoch_from_zero),
    # the WGAN / DCGAN examples, epochs from 0: "[167/1000][555/782][24987] Loss_D: -0.77 Loss_G: …"
    (None, re.compile(rf"^\s*\[{_I}/\s*{INT}\s*\]\s*\[{_I}/{_I}\]"), _epoch_from_zero),
    # PyTorch's ImageNet example and the MetricLogger of DeiT / MAE / LLaMA-Adapter count epochs
    # from 0 ("Epoch: [0]  [ 10/582]", LAVIS's "Train: data epoch: [0]  [3950/5000]"); a loop
    # counting from 1 is read one epoch on, still in order
    (None, re.compile(rf"[Ee]poch:\s*\[{_I}\]\s*\[{_I}/{_I}\]"), _epoch_from_zero),
    (
        None,
        re.compile(rf"Epoch\s*+(?::\s*+)?\[{_I}/\s*{INT}\s*\]\s*\({_I}/{_I}\)", re.IGNORECASE),
        _epoch_from_zero,
    ),
    # Swin Transformer's loop and its offspring (VMamba), epochs from 0: "Train: [29/300][2670/2859]"
    (None, re.compile(rf"(?<!\w)Train:\s*\[{_I}/\s*{INT}\s*\]\s*\[{_I}/{_I}\]"), _epoch_from_zero),
    # HSNet's logger and the segmenters built on it (LSeg), the batch counted within the epoch:
    # "[Epoch: 01] [Batch: 0651/1425] L: 0.39662  Avg L: 0.44018  mIoU: 64.45"
    (None, re.compile(rf"\[Epoch:{_I}\]\s*\[Batch:{_I}/{_I}\]"), _epoch_from_zero),
    # InvSR's trainer, the iteration over the run's total: "Train: 016600/200000, ldif/ldis/…:t(100):0.43/…"
    (None, re.compile(rf"^\s*Train:\s*({INT})/{INT},"), lambda m: int(m[1])),
    # Hand4Whole / I2L-MeshNet's logger, epochs from 0: "Epoch 0/7 itr 26/3489:"
    (None, re.compile(rf"(?<!\w)Epoch\s+({INT})/{INT}\s+itr\s+({INT})/({INT})"), _epoch_from_zero),
    (
        "nemo",
        re.compile(rf"Training epoch\s+{INT}\s*,\s*iteration\s+({INT})\s*/\s*{INT}"),
        lambda m: int(m[1]),
    ),
    ("torchtune", re.compile(rf"(?<![\w|]){INT}\|({INT})\|(?=Loss:)"), lambda m: int(m[1])),
    # a loop's episode or epoch counter before "|"-separated fields: "Episode  50/400 | Reward (100 ep):
    # 22.6", qlearning4k's "Epoch 144/1000 | Loss 2214.4102 | Epsilon 0.00 | Win count 65"
    (None, re.compile(rf"^\s*(?:Episode|Epoch)\s+({INT})\s*/\s*{INT}(?=\s*\|)", re.I), lambda m: int(m[1])),
    # a bar an epoch's loop draws, "Epoch 85/300: 100%|…| 8144/8144 [..., Loss 6.2739, …]": its count
    # starts over each epoch (read from 0, as Lightning counts; a loop counting from 1 one epoch on)
    (
        None,
        re.compile(
            rf"(?<!\w)Epoch\s+({INT})(?:\s*/\s*{INT})?\s*:\s*\d+%\|[^|\n]*\|\s*({INT})/({INT})\s*\[[^\]]*?,"
        ),
        _epoch_from_zero,
    ),
    (None, re.compile(rf"{BAR_HEAD}[^\]]*?,"), lambda m: int(m[1])),
    # the same bar as a notebook's text output keeps it, the bar itself left out
    (None, re.compile(rf"(?<!\d)\d+%\s+({INT})/{INT}\s*\[[^\]<,]*<[^\]]*?,"), lambda m: int(m[1])),
    # XLM's logger, the iteration after the time elapsed: "INFO - 08/01/19 14:20:20 - 2:02:04 -    3550 -
    # 6.84 sent/s - … - MLM-en:  7.5730 -  - model LR: 1.0000e-04"
    (None, re.compile(rf"^\s*[A-Z]+ - [\d/]+ [\d:]+ - \d+:\d\d:\d\d -\s+({INT}) - "), lambda m: int(m[1])),
    # Marian's updates: "Ep. 8 : Up. 535500 : Sen. 94,495,934 : Cost nan : … : gNorm 0.6068 : L.r. 5.18e-05"
    ("marian", re.compile(rf"(?<![\w/.])Up\.\s+({INT})(?!\d)"), lambda m: int(m[1])),
    # a global counter beside the inner ones (MiniLLM: "inner iter:   3/  8 | … | global iter:     15/  5000")
    (
        None,
        re.compile(rf"(?<![\w/.])global[_ ]iter(?:ation)?\s*+(?:[:=#]\s*+)?({INT})", re.I),
        lambda m: int(m[1]),
    ),
    (
        None,
        re.compile(
            rf"(?<![\w/.])(?:global[_ ]step|current_steps|step|iteration|iter|num_updates)\s*+(?:[:=#]\s*+)?"
            rf"(\d{{1,3}}(?:,\d{{3}})+(?![\d.])|{INT})"  # BasicSR's "iter:  25,377," (GFPGAN, Real-ESRGAN)
            # "Step: 19000. Mean Reward: …" ends a sentence; "Global Step:   6%|" is a bar's share
            rf"(?:\s*/\s*{INT})?(?![\w%]|\.\d)",
            re.IGNORECASE,
        ),
        lambda m: int(m[1].replace(",", "")),
    ),
    # OpenNMT-py's early trainer, epochs from 1: "Epoch  1, 12850/37527; acc:   3.99; ppl: 12792.57; …"
    (None, re.compile(rf"(?<![\w/])Epoch\s++{_I},{_I}/{_I};"), _epoch_from_one),
    # rasbt's deeplearning-models notebooks, epochs from 1: "Epoch: 001/010 | Batch 0100/0391 | Cost: 2.3016"
    (None, re.compile(rf"(?<![\w/])Epoch:{_I}/\s*{INT}\s*\|\s*Batch{_I}/{_I}"), _epoch_from_one),
    # a BERT classifier's loop, epochs from 1: "Epoch 1 - Batch 1600/287417 - Training Acc. 0.106250 - …"
    (None, re.compile(rf"(?<![\w/])Epoch{_I}-\s*Batch{_I}/{_I}(?=\s*-)"), _epoch_from_one),
    # icefall (k2), the batch counted within the epoch: "Epoch 1, batch 14300, loss[loss=0.6675, …]"
    (None, re.compile(rf"(?<![\w/])Epoch\s+{INT},\s*batch\s+({INT})(?=,)"), lambda m: int(m[1])),
    # Social GAN's iteration over its total on a line of its own, behind its logger's prefix:
    # "[INFO: train.py:  278]: t = 71 / 4200"
    (None, re.compile(rf"(?<![\w.])t = ({INT}) / {INT}\s*$"), lambda m: int(m[1])),
    # Raissi's physics-informed networks and the many loops copied from them: "It: 240, Loss: 8.126e+00"
    (None, re.compile(rf"^\s*It:?\s*({INT})(?=[,:])"), lambda m: int(m[1])),
    # an epoch's (or an episode's) line, where no step is named: "===> Epoch 162 Complete: Avg. Loss:
    # 0.014234", "===> Epoch 162: testing psnr = 34.40" (MST), a loop's "Epoch 3 | loss 2.1", "Epoch 3
    # - loss: 2.1", 3D-Speaker's "epoch: 1 - train Avg_loss: 13.29", "Epoch 3/20 loss: 2.1", "[Epoch 3]
    # loss: 2.1" and "Epoch 3 train loss: 2.1"
    # (print("Epoch", epoch, "loss:", loss)); not the PyTorch word language model's "| end of epoch
    # 7 | time: 109.38s | valid loss  7.68": its validation, on the step before
    (None, _EPOCH_LINE, lambda m: int(m[1])),
    # the PyTorch tutorials' loop, epochs from 1: "Epoch [1/5], Step [100/600], Loss: 0.2153" (and
    # TensorLayer's SRGAN, epochs from 0, read one epoch on: "Epoch: [47/100] step: [79/250] time: …")
    (
        None,
        re.compile(
            rf"(?<![\w/])Epoch:?\s*\[{_I}/\s*{INT}\s*\]\s*+(?:,\s*+)?(?:Step|Iter|Batch):?\s*\[{_I}/{_I}\]",
            re.I,
        ),
        _epoch_from_one,
    ),
    # and its loop that logs once an epoch: "Epoch [3/20], Loss: 2.1"
    (None, _EPOCH_OUT_OF, lambda m: int(m[1])),
    # YOLACT: "[  1]    1510 || B: 5.515 | C: 3.088 | M: 7.223 | S: 1.564 | T: 17.647 || ETA: …"
    (None, re.compile(rf"^\s*\[\s*{INT}\]\s+({INT})\s*\|\|"), lambda m: int(m[1])),
    # without a step word, a home-made loop's counter opening the line: "268/446 (epoch 0),
    # train_loss = 2.097", keras-rl's "8996/50000: episode: 63, …" (not a date: "2024/06/12" has a
    # second "/", "10/30 22:18:02" a clock time after it), or its step in brackets: "[5000]
    # model_grad_norm nan / …"
    (None, re.compile(rf"^\s*({INT})/{INT}(?=[\s,(]|:\s)(?!\s+\d{{1,2}}:\d\d)"), lambda m: int(m[1])),
    # (LightGBM's R package after it: "[5]:\ttrain's l2:0.095"; XGBoost's CLI after its clock:
    # "[20:01:02] [0]\ttest-error:0.0272")
    (None, re.compile(rf"^\s*(?:\[\d\d:\d\d:\d\d\]\s*)?\[({INT})\]:?(?=\s)"), lambda m: int(m[1])),
    # or before a GAN's bracketed groups: "13882 [D loss: 7.97 | D Accuracy: 50.0] [G loss: 1.2e-07]"
    (None, re.compile(rf"^\s*({INT}):?\s+(?=\[[A-Z]\w{{0,2}} loss:)"), lambda m: int(m[1])),
    # or in brackets over its total, before a field: "[100/1200] loss: 6.7", "(100/1200) loss: 6.7"
    (
        None,
        re.compile(rf"^\s*[\[(]\s*({INT})\s*/\s*{INT}\s*[\])](?={_NAME_THEN_VALUE})"),
        lambda m: int(m[1]),
    ),
    # EDSR-PyTorch's trainer and the super-resolution repositories built on it, the samples of the
    # epoch before its bracketed losses: "[1600/16000]\t[L1: 5.9633]\t65.8+0.4s" (the epoch on a
    # "[Epoch 26]\tLearning rate: 1.00e-4" header above)
    (None, re.compile(rf"^\s*{_SR_COUNT}(?=\s*\[[A-Za-z])"), lambda m: int(m[1])),
    # or its step before "|"-separated "name value" fields: "250 | loss 4.09 | lr 3e-04 | 13707ms"
    (None, re.compile(rf"^\s*({INT})\s*\|(?=\s*[A-Za-z_])"), lambda m: int(m[1])),
    # or its step before a labelled field: "1336 Loss : 1.4627" (print(epoch, "Loss :", loss)),
    # "100: loss=6.7"
    # (not a date's day before its month, RecBole's "27 Nov 14:49    INFO  epoch 0 training [...")
    (None, re.compile(rf"^\s*({INT}):?(?!\s+{_MONTH}\w*\.?\s+\d){_NAME_THEN_VALUE}"), lambda m: int(m[1])),
    # a batch counted over its total, where no other marker reads the line: DCGAN-for-Bird-Generation's
    # "Batch 168/170 generator loss | …" (an epoch's batches are counted across epochs above)
    (None, re.compile(rf"(?<![\w/.])[Bb]atch\s+({INT})\s*/\s*{INT}(?![\w/]|\.\d)"), lambda m: int(m[1])),
)
# the lookahead only skips the positions no separator starts at (most of them) before the
# alternatives are tried: the same splits, in half the time; a number ending a sentence ("Mean
# Reward: -57.270. Std of Reward: 0.000.", ML-Agents' summary) ends its field, and so does a word
# of four letters or more ending one ("Epoch 3 finished. Loss: 2.1"; "Avg. Loss" stays one name);
# a tab or spaces after a name's colon are the gap before its value ("epoch:\t0\treward:\t0.10", a
# print with sep="\t"; wav2letter's right-aligned "loss:        inf"), and a run of spaces before a
# number is the gap between a name and its value ("| loss  7.66 |"), no field's end; a gap is only
# tried from its first space (a search from each of a long run's spaces took the run's square)
_SPLIT = re.compile(
    r"(?=[\s|,;.\[\]])(?:(?:(?<!\s)\s+)?\|\s*|,\s+|;\s*|(?<!\s)\s+-\s+|(?<![:=\s])(?:\t+|\s{2,}(?!\s|[-+]?\.?\d))|[\[\]]"
    r"|(?:(?<=\d)|(?<=[Nn]a[Nn])|(?<=[Ii]nf)|(?<=[Ii]nfinity))\.\s+|(?<=[a-z]{4})\.\s+(?=[A-Z]))"
)
_LABELLED = re.compile(
    rf"(?<![\w./@\-])(?P<key>(?:(?i:train|training|val|valid|validation|eval|test)\s)?[A-Za-z_][\w./@\-()]{{0,127}})"
    rf"\s*[:=]\s*(?P<value>{NUMBER})%?(?=[\s,;|)\]}}]|$)"
)  # a split's name before the metric's is the name's ("test acc: 60.67%"); a percentage's sign passed over;
# a name of 128 characters at most, so that a search is not tried to the line's end from each "("
_SIMPLE = re.compile(r"(?P<key>[A-Za-z_][\w./@\-()]*)\s*[:=]\s*(?P<value>\S+)")
_SPACED = re.compile(rf"(?<![\w./@\-])(?P<key>[A-Za-z_][\w./@\-]*)\s+(?P<value>{NUMBER})(?=\s|$)")
_BAR = re.compile(r"(?<!\d)\d+%\|")
_BAR_POSTFIX = re.compile(r"\[[^\]]*?<[^\]]*?,\s*(?P<postfix>[^\]]*)\]")


# a scalar tensor that autograd produced, printed alone on its line (a training loop's print(loss)) or
# after a counter and a name
# (``tensor(3.6976, device='cuda:0', grad_fn=<NllLossBackward0>)``)
_LOSS_TENSOR = re.compile(
    rf"^\s*(?:(?P<step>{INT})\s+)?(?:(?P<name>[A-Za-z_][\w.()]*)\s+)?"  # print(i, "name", tensor)
    rf"tensor\(\s*(?P<value>{NUMBER}|nan|-?inf)\s*,[^()]*grad_fn=<\w+>\s*\)\s*$"
)
# NVIDIA's tacotron2 (and waveglow, flowtron, mellotron): "Train loss {iteration} {loss:.6f} Grad
# Norm {grad_norm:.6f} {duration:.2f}s/it"
# tinygrad's training examples (its MLPerf llama, BERT, ResNet): "    5 4.36 s run, 11.9375 loss,
# 0.000000000003 LR, 1454.57 GB used, 398116.13 GFLOPS", the step first and every value before its name
_TINYGRAD = re.compile(rf"^\s*(?P<step>{INT})\s+(?:{NUMBER})\s+s run,(?P<rest>.*)$")
_VALUE_NAME = re.compile(rf"(?:^|,)\s*(?P<value>{NUMBER})\s+(?P<key>[A-Za-z][\w ]*?)\s*(?=,|$)")
_DARKNET = re.compile(rf"^\s*({INT}):\s*{DARKNET_COUNTS}")  # darknet's iteration line
_TACOTRON = re.compile(rf"^\s*Train loss\s+({INT})\s+({NUMBER})\s+Grad Norm\s+({NUMBER})")
# NVIDIA's WaveGlow: "123873:\t-5.480178833", the iteration and its loss, unnamed, alone on the line;
# a loop's print(step, loss, sep=", ") likewise, and with what it printed after them that is no number
# (a tutorial's "47, 3.43674, array([2, 2, 2, 3]), [('l', 1.035), …]": its predictions)
_COUNTED_VALUE = re.compile(rf"^\s*({INT})(?:[:,]\s+|\s+)({NUMBER})(?:\s*$|,\s+(?=[A-Za-z_\[(]))")
_TABLE_ROW = re.compile(
    rf"^\s*[|│┃]\s*(?P<key>[A-Za-z_][^|│┃]*?)\s*[|│┃]\s*(?P<value>{NUMBER})\s*+(?:[|│┃]\s*+)?$"
)


def marker(line: str) -> tuple[str | None, int, re.Match[str]] | None:
    """The first step marker of ``line``: ``(framework or None, step, match)``."""
    for framework, pattern, step in MARKS:
        match = pattern.search(line)
        if match:
            return framework, step(match), match
    return None


def _quoted_field(match: re.Match[str]) -> str:
    """A quoted name and its quoted value as ``name: value``; with its value bare, only amid fields
    that are not quoted (a line of a dict, or a piece of one a terminal wrapped, is the dict's)."""
    if match["value"] is None and ":" not in match.string[: match.string.find(match.group(1))]:
        return match.group(0)
    return f"{match['key']}: {match['value'] or match['bare']}"


def pairs(text: str) -> dict[str, Any]:
    """Every ``name: value`` / ``name=value`` / ``name value`` field of ``text``; a later name wins.

    A name with no ``:`` or ``=`` before its number counts only when it is a metric a key map
    knows or reads like code (``grad_norm``, ``train/loss``): in prose, ``the loss is NaN`` names
    no metric ``is``.
    """
    out: dict[str, Any] = {}
    text = _LISTED.sub(_list_mean, text) if "[" in text else text
    text = _QUOTED.sub(_quoted_field, text) if "'" in text or '"' in text else text
    text = _COUNT_OUT_OF.sub(r"\g<1>\g<2>", text) if "/" in text else text
    for piece in _SPLIT.split(text):
        piece = piece.strip(" :,-")
        piece = piece[:-1] if piece.endswith(".") and _SENTENCE_END.search(piece) else piece
        simple = _SIMPLE.fullmatch(piece)  # most fields: one labelled plain number, read without the rest
        if simple and (number := plain_number(simple.group("value"))) is not None:
            out[simple.group("key")] = number
        else:
            out.update(_piece_fields(piece))
    if ".py" in text:  # a logger's source file and line ("[INFO: train.py:  280]:") names no metric
        out = {key: value for key, value in out.items() if key[-3:] != ".py"}
    return out


@lru_cache(maxsize=1 << 12)  # a log repeats its other pieces (levels, logger names) line after line
def _piece_fields(piece: str) -> tuple[tuple[str, Any], ...]:
    """The fields of one piece that is not a single labelled plain number, in order."""
    if not _numeric(piece) or _NAME_START.search(piece) is None:  # a time stamp "2024/06/12 09:31:02"
        return ()
    labelled = list(_LABELLED.finditer(piece))
    whole = labelled and labelled[0].start() == 0 and labelled[-1].end() == len(piece)
    found = None if whole or len(piece) >= 200 else field(piece, labelled=True) or field(piece)
    if found and (":" in piece or "=" in piece or _names_a_metric(found[0])):
        return (found,)  # a name with spaces or a unit: "average reward score: 0.2"
    spans = [match.span() for match in labelled]
    spaced = [  # a name and its value a space apart, where no labelled field is (CrossFit's "Step 300
        # Train loss 8761.43 ACC 0.0 on epoch=18": the loss and the accuracy beside the labelled epoch)
        m
        for m in _SPACED.finditer(piece)
        if _named(m.group("key")) and not any(m.start() < end and start < m.end() for start, end in spans)
    ]
    if labelled and not spaced:
        return tuple((match.group("key"), parse_number(match.group("value"))) for match in labelled)
    found_all = [(m.start(), _with_word_before(piece, m), m.group("value")) for m in spaced]
    found_all += [(m.start(), m.group("key"), m.group("value")) for m in labelled]
    return tuple((key, parse_number(value)) for _, key, value in sorted(found_all, key=lambda f: f[0]))


_WORD_BEFORE = re.compile(r"([A-Za-z]+)\s+$")


def _with_word_before(piece: str, match: re.Match[str]) -> str:
    """A bare name with the word before it where the two name a metric a key map knows (an RL
    tutorial's ``episode 6264 score -73.42 average score -178.85``: the average, not a second
    ``score`` over the first), or a held-out split's (RealNVP's ``train loss 10171.217 bpd 4.777
    test loss 552956.313``: the test loss, not a second ``loss``)."""
    before = _WORD_BEFORE.search(piece, 0, match.start())
    longer = f"{before.group(1)} {match.group('key')}" if before else ""
    return longer if before and (is_metric(longer) or _held_out_metric(longer)) else match.group("key")


# an epoch counted out of the run's epochs in a bar's postfix: GluonTS's "epoch=1/10,
# avg_epoch_loss=5.12" (each epoch's bar ends at the same count: read without the epoch, they merged)
_COUNT_OUT_OF = re.compile(rf"(?<![\w/])((?:epoch|episode)\s*=\s*)({INT})/{INT}(?![\w./])", re.IGNORECASE)


# a value printed as an array (PaddlePaddle's fetched tensors, per-device losses): "loss: [nan]",
# "loss: [2.31 2.29]"; read as its mean (NaN where any element is)
_LISTED = re.compile(rf"(?<=[:=])(\s*)\[\s*((?:{NUMBER})(?:(?:\s*,\s*|\s+)(?:{NUMBER}))*)\s*+(?:,\s*+)?\]")


def _list_mean(match: re.Match[str]) -> str:
    """The mean of a printed array's elements, as text in its place."""
    return match.group(1) + repr(mean_of(match.group(2)))


def mean_of(elements: str) -> float | None:
    """The mean of a printed array's elements, split at commas or spaces (``2.31 2.29``; NaN where
    one is), or ``None`` where one is no number."""
    values = [number_or_none(v) for v in re.split(r"[\s,]+", elements.strip())]
    numbers = [v for v in values if v is not None]
    return sum(numbers) / len(numbers) if numbers and len(numbers) == len(values) else None


# a value that ends a sentence, the line's last (TensorFlowTTS: "(Step: 95400) train_f0_loss = 0.0659.",
# ML-Agents' "Std of Reward: 0.000."): a period after a decimal point's digits (a "nan." is left to
# the alerts: TensorFlow's "Model diverged with loss = NaN." says more than a NaN loss)
_SENTENCE_END = re.compile(r"\d\.\d+\.$")
_DIGITISH = re.compile(r"\d|nan|inf", re.IGNORECASE)
# every field names itself, and every name (and the "s" of a bare duration) starts with one of these
_NAME_START = re.compile(r"[A-Za-z_]")


def _numeric(text: str) -> bool:
    """Whether ``text`` can hold a number at all (a cheap test before any pattern runs)."""
    return _DIGITISH.search(text) is not None


def _named(key: str) -> bool:
    """A bare name that is a metric: known to a key map, or written like code (``grad_norm``,
    ``train/loss``, the ImageNet example's ``Acc@1``)."""
    return is_metric(key) or any(c in key for c in "_/@")


def _names_a_metric(name: str) -> bool:
    """Whether the name before a bare number (no ``:`` or ``=``) is a metric's: one word as
    :func:`_named` reads it, several words only when a key map knows them (mlx-lm's ``Total
    rewards mean 0.000``) or they are a held-out metric's (``Val loss 2.9``: read as the bare
    ``loss`` after the prose, a validation loss would stand in for the training loss), as
    prose before a number (``the loss is 3``) names none."""
    if " " not in name:
        return _named(name)
    qualifier, _, rest = name.partition(" ")
    return is_metric(name) or (qualifier.lower() in HELD_OUT and _named(rest))


@cache
def _known_names() -> frozenset[str]:
    """Every foreign key any table maps, as given and normalised (lower case, ``_`` for gaps)."""
    keys = {k for name, table in KEY_MAP.items() if name != "moescope" for k in table}
    return frozenset(keys | {_normal(k) for k in keys} | set(KEY_MAP["moescope"]))


def _normal(key: str) -> str:
    return re.sub(r"[\s.\-]+", "_", key.strip().lower()).strip("_")


# scores no rule reads under a canonical name, but that only a metrics line prints (a loop's
# "(Training) ppl: 69.9, accuracy: 48.1 %")
_SCORES = frozenset(
    {
        "accuracy",
        "acc",
        "ppl",
        "perplexity",
        "wer",
        "cer",
        "bleu",
        "auc",
        "f1",
        "score",
        "success_rate",
    }
)


# a network's metric: "D loss"; not a 12-hour clock's half of the day before a name (DARTS's "07/08
# 05:56:20 AM train_acc 99.684000")
_NETWORK_METRIC = re.compile(r"(?![AP]M )[A-Z]\w{0,2} ([A-Za-z_]\w*)")


_SPLIT_PREFIX = re.compile(r"(?:train|training|val|valid|validation|eval|test|dev)_")
# an accuracy glued to its split's short name: DeepLung's "tracc", "teacc", "bestacc"
_GLUED_ACC = re.compile(r"[a-z]{2,5}acc")
# a top-k accuracy, whatever words come before it: FixMatch's "top-1 acc: 10.00", "Mean top-1 acc", "val_top5"
_TOP_K = re.compile(r"(?:[a-z]+_)*top_?\d+(?:_acc(?:uracy)?)?")
# a loss glued to a network's one or two letters: a GAN's "T_gloss" and "T_closs" (generator,
# critic), SAC's "ALOSS", "CLOSS"
_GLUED_LOSS = re.compile(r"(?:[a-z]+_)*[a-z]{1,2}loss")
# a summary's overlap score: "rouge_1", "rouge-L", "rougeLsum", "val_rouge2"
_ROUGE = re.compile(r"(?:[a-z]+_)*rouge_?(?:[12l]|lsum)")


# a loss named in camel case: a C or Java loop's "TotalLoss nan", "trainLoss"
_CAMEL_LOSS = re.compile(r"[A-Za-z]\w*[a-z0-9]Loss")


def is_metric(key: str) -> bool:
    """A name some key map knows (as given, normalised, or behind a ``train/`` prefix), or a
    code name that says it is a loss (``pid_loss``, ``triplet_loss``: a detector's or a re-id
    model's; WGAN's ``Loss_D``, a segmenter's ``loss_seg1``, a C loop's ``TotalLoss``; words with
    spaces, ``mean center loss``, may be prose)."""
    known, normal = _known_names(), _normal(key)
    if key in known or normal in known or normal in _SCORES or key.removeprefix("train/") in known:
        return True
    split = _SPLIT_PREFIX.match(normal)  # a split's score: "train_acc", "test_acc" (a Keras GCN's print)
    if (
        (split and normal[split.end() :] in _SCORES)
        or _TOP_K.fullmatch(normal)
        or _GLUED_ACC.fullmatch(normal)
        or _GLUED_LOSS.fullmatch(normal)
        or _ROUGE.fullmatch(normal)
    ):
        return True
    net = _NETWORK_METRIC.fullmatch(key)  # a GAN's "D loss", "G loss", "D acc"
    if net and (net.group(1).lower() == "loss" or is_metric(net.group(1))):
        return True
    coded = key.endswith("_loss") or key[:5].lower() == "loss_" or _CAMEL_LOSS.fullmatch(key) is not None
    return coded and " " not in key


def _split_of_first(fields: dict[str, Any]) -> dict[str, Any]:
    """A line that opens on a held-out split's metric: the names after it that name no split are
    that split's too (a loop's ``validation loss: 6.2869, acc: 0.1163`` under its ``train loss:
    6.1543, acc: 0.1207``: the validation accuracy, not a second training one)."""
    first = next(iter(fields))
    split = first.partition(" ")[0]
    if " " not in first or split.lower() not in HELD_OUT or not _held_out_metric(first):
        return fields
    return {
        key if key == first or " " in key or _SPLIT_PREFIX.match(_normal(key)) else f"{split} {key}": value
        for key, value in fields.items()
    }


def _held_out_metric(key: str) -> bool:
    """A held-out split's metric (``Validation loss``, ``test acc``): a line of one makes a record,
    though it votes for no snapshot (a paste's ``Valid loss: 5.11`` lines beside its ``Train loss
    0.35`` records are no key-values snapshot)."""
    split, _, rest = key.partition(" ")
    return bool(rest) and split.lower() in HELD_OUT and " " not in rest and is_metric(rest)


def record(line: str) -> tuple[int | None, str | None, dict[str, Any]] | None:
    """``(step, framework, fields)`` of a record line, or ``None``."""
    line = RAY_PREFIX.sub("", line, count=1)  # "(TaskRunner pid=17)" names no metric "pid"
    if line[:1] in _GLOG_LEVELS and line[1:5].isdigit():  # glog's prefix names no metric "solver.cpp"
        line = (_GLOG_NAMED_PREFIX if line[5:9].isdigit() else _GLOG_PREFIX).sub("", line, count=1)
    output = _CAFFE_OUTPUT.match(line) if "net output #" in line else None
    if output:  # caffe: each net output's value this iteration (the Iteration line's loss is smoothed)
        held_out = output.group("net") == "Test"
        return (
            None,
            None,
            {("valid/" if held_out else "") + output.group("key"): parse_number(output.group("value"))},
        )
    if "%|" not in line and megatron.is_overflow(line):  # a scaler's line: the alerts' to fold
        return None
    line = _last_bar(line) if line.count("%|") > 1 else line
    for literal, pattern, rewritten in _REWRITES:  # the literal first: a search is slow
        if literal in line:
            line = pattern.sub(rewritten, line) if pattern else rewritten(line)
    found = marker(line)
    if found is not None:
        framework, step, match = found
        after, glued = _bar_tail(line, match)
        rest = line[: match.start()] + " | " + after
        bar = _BAR.search(rest) if "%|" in rest else None  # the test first: a search is slow
        if bar:  # a progress bar: the text before it (torchtune's description) and its postfix
            postfix = _BAR_POSTFIX.search(rest, bar.end())
            rest = rest[: bar.start()] + (" | " + postfix.group("postfix") if postfix else "")
        fields = pairs(rest)
        if "%|" in match.group(0):  # a bar's count restarts each epoch: a global step it names wins
            step = _named_step(fields, step, line[: match.start()])
        shown = not fields and "%|" in match.group(0)  # a progress bar, and no field after it
        if shown and (counted := _COUNTED_VALUE.match(line[line.rfind("]") + 1 :])):
            fields = {"loss": parse_number(counted[2])}  # a loop's print(step, loss) glued behind the bar
        return (step, framework, {**fields, **glued}) if fields else None
    row = _TABLE_ROW.match(line)  # a two-column table (tabulate, markdown) of one step's stats
    printed = _LOSS_TENSOR.match(line) if row is None and "grad_fn=" in line else None
    if printed:  # print(loss) in a training loop, or print(i, "ratio.mean()", ratio.mean())
        step, name = printed.group("step"), printed.group("name") or "loss"
        return int(step) if step else None, None, {name: parse_number(printed.group("value"))}
    tinygrad = _TINYGRAD.match(line) if " s run," in line else None
    if tinygrad:  # "    5 4.36 s run, 11.9375 loss, 0.000000000003 LR, …": each value before its name
        fields = {m["key"]: parse_number(m["value"]) for m in _VALUE_NAME.finditer(tinygrad["rest"])}
        return int(tinygrad["step"]), None, fields
    darknet = _DARKNET.match(line) if " avg" in line and " rate," in line else None
    if darknet:  # "999: 0.000000, 0.000000 avg, 0.009960 rate, …": the batch's loss, its running mean, lr
        step, *values = darknet.groups()
        return int(step), None, dict(zip(("loss", "avg_loss", "lr"), map(parse_number, values), strict=True))
    tacotron = _TACOTRON.match(line) if line.lstrip().startswith("Train loss") else None
    if tacotron:  # the iteration between the name and its value: no "loss" of 0, 1, 2, …
        step, loss, norm = tacotron.groups()
        return int(step), None, {"loss": parse_number(loss), "grad_norm": parse_number(norm)}
    counted = _COUNTED_VALUE.match(line) if line[:1].isspace() or line[:1].isdigit() else None
    if counted:  # print(f"{iteration}:\t{loss}"): the one number a loop prints beside its counter
        return int(counted[1]), None, {"loss": parse_number(counted[2])}
    fields = (
        {row.group("key"): parse_number(row.group("value"))} if row else pairs(line) if _numeric(line) else {}
    )
    if fields and (
        row or any(is_metric(k) or _held_out_metric(k) for k in fields)
    ):  # a table's row: any name
        return None, None, fields
    return None


_DESCRIBED_STEP = re.compile(rf"(?<![\w/])(?:global[_ ]step|step)\s+({INT}):\s*$", re.IGNORECASE)


def _redraws(line: str) -> list[str]:
    """A progress bar's states glued on one line, each from its description on (fairseq's ``|
    epoch 009:   3%| | 1/35 […, loss=11.323, …, num_updates=281, …]| epoch 009:   6%| | 2/35 …``, a
    paste that lost the carriage returns between redraws); ``[]`` where the bars' descriptions
    differ (trlx's rollout bar glued before its training bar: :func:`_last_bar`)."""
    first = _BAR.search(line)
    described = line[: first.start()].strip() if first else ""
    if len(described) < 3 or line.count(described) < 2:
        return []
    starts = [m.start() for m in re.finditer(re.escape(described), line)]
    return [line[a:b] for a, b in pairwise([*starts, len(line)])]


def _named_step(fields: dict[str, Any], counted: int, described: str = "") -> int:
    """The global step a bar's description names (Yet-Another-EfficientDet's ``Step: 69983. Epoch:
    1999/2000. Iteration: 19/35. Cls loss: …:  54%|█████▍ | 19/35``), taken out of the fields, or
    the ``step N:`` it ends on (``described``, the text before the bar); else the bar's own count."""
    for key in ("Step", "step", "global_step", "num_updates"):  # fairseq's bar: "num_updates=281"
        value = fields.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            del fields[key]
            return value
    named = _DESCRIBED_STEP.search(described) if "tep" in described else None
    return int(named[1]) if named else counted  # VocGAN's "… | step 5976: 100%|…| 166/166"


_WHOLE_BAR = re.compile(rf"{BAR_HEAD}[^\]]*\]")
# glog (caffe, glog-logging C++ trainers): "I0515 11:05:31.873651 37636 solver.cpp:239] "
_GLOG_LEVELS = frozenset("IWEF")
_GLOG_TIME = r"[IWEF]\d{4} \d\d:\d\d:\d\d\."  # level, date and time, as glog opens a line
_GLOG_PREFIX = re.compile(_GLOG_TIME + r"\d+\s+\d+\s+[\w.\-]+:\d+\]\s*")
# DINOv2's logger, glog's shape with the year, no fraction of a second, and its name: "I20250104
# 12:12:42 90 dinov2 helpers.py:102] Training  [   1250/2500000]  eta: …"
_GLOG_NAMED_PREFIX = re.compile(r"[IWEF]\d{8} \d\d:\d\d:\d\d \d+ [\w.\-]+ [\w.\-]+:\d+\]\s*")
_CAFFE_OUTPUT = re.compile(
    rf"\s*(?P<net>Train|Test) net output #\d+:\s*(?P<key>[\w/.\-]+)\s*=\s*(?P<value>{NUMBER})"
)
# PyTorch-YOLOv3's loss terms, one word each: "[Losses: x 0.1, y 0.2, …, cls 0.5, total 3.2]"
_LOSSES = re.compile(r"\[Losses:\s*([^\]]*)\]")
_TERM = re.compile(rf"([A-Za-z_]\w*)\s+({NUMBER})")


def _named_losses(match: re.Match[str]) -> str:
    """The loss terms as fields: each ``<term>_loss``, ``total`` the loss."""
    terms = _TERM.findall(match.group(1))
    return ", ".join(f"{'loss' if t == 'total' else t + '_loss'}: {v}" for t, v in terms)


# one metric at its step in brackets, a line each: "train_batch_loss[ 6590 ]:  nan" (crnn-pytorch)
_INDEXED = re.compile(rf"^\s*(?P<key>[A-Za-z_][\w./-]*)\[\s*(?P<step>{INT})\s*\]:(?=\s*(?:{NUMBER})\s*$)")
# a name and its value both quoted, a dict's repr of a string, amid other fields (PaddleDetection:
# "iter: 20, lr: 0.000085, 'loss': 'nan', eta: …"), or only the name (PaddleOCR's old trainer:
# "epoch: 0, iter: 2760, lr: 0.001000, 'loss': 18201.227, 'acc': 0.0")
_QUOTED = re.compile(
    rf"""(['"])(?P<key>[\w./-]+)\1\s*:\s*(?:(['"])(?P<value>{NUMBER})\3|(?P<bare>{NUMBER})(?![\w.]))"""
)
# llama-recipes' summary, a metric a line: "Key: avg_eval_loss, Value: inf"
_KEY_VALUE = re.compile(rf"\bKey:\s*(?P<key>[\w./-]+),\s*Value:\s*(?P<value>{NUMBER})")
# NVIDIA's DLLogger (DeepLearningExamples): "DLL 2020-05-30 07:35:01.358301 - PARAMETER loss_scale : 3.7e-09";
# its step field, "PARAMETER" or "()" (a run's summary), names no metric
_DLLOGGER = re.compile(r"^DLL \S+ \S+ - (?:PARAMETER|\(\))?\s*")
# a home-made loop's names in brackets before their numbers: "[Loss] 2.5 | [lr] 1e-4 | [step] 300"
_BRACKETED = re.compile(rf"\[(?P<key>[A-Za-z_][\w./-]*)\]\s*+(?::\s*+)?(?P<value>{NUMBER})(?=[\s|,;]|$)")
# names glued to their values by an underscore, a WaveGlow fork's "step_78540:\tloss_-4.065555573": the
# step's count, and a value with a decimal point (never "top_5", a name)
_GLUED = re.compile(rf"(?<![\w.])(?:step_({INT})|([A-Za-z]+)_(-?\d+\.\d+(?:[eE][-+]?\d+)?))(?![\w.])")


def _unglued(match: re.Match[str]) -> str:
    step, key, value = match.groups()
    return f"step {step}" if step else f"{key}: {value}"


# EDSR's losses, each in brackets after the counter: one is the loss, or several and their "Total"
_SR_LOSSES = re.compile(rf"^(\s*\[{INT}/{INT}\])((?:\s*\[[A-Za-z]\w*:\s*(?:{NUMBER})\])+)")
_SR_TERM = re.compile(rf"\[([A-Za-z]\w*):\s*({NUMBER})\]")


def _sr_losses(match: re.Match[str]) -> str:
    """EDSR's ``[L1: 5.96]`` the loss; of ``[L1: 0.02]\t[VGG54: 0.3]\t[Total: 0.32]`` each term
    ``<term>_loss``, ``Total`` the loss."""
    terms = _SR_TERM.findall(match.group(2))
    named = [("loss" if len(terms) == 1 or t == "Total" else f"{t}_loss", v) for t, v in terms]
    return match.group(1) + " " + ", ".join(f"{name}: {value}" for name, value in named)


# where a Python logger says it logged from, no metric: ESPnet's and TensorFlowTTS's "(base_trainer:831)
# INFO: …", icefall's "INFO [train.py:1047]"
_LOGGED_AT = re.compile(
    r"\((?:[\w.]+):\d+\)\s*(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b)|\[[\w./-]+\.py:\d+\]"
)

# ESPnet2's trainer, the batches of the epoch it reports:
# "1epoch:train:1021-2040batch: iter_time=…, loss=5.321"
_ESPNET_BATCHES = re.compile(rf"(?<!\w)({INT})epoch:train:{INT}-({INT})batch:")

# prose a loop prints: a name, the counter it is "for" / "at", then the value ("The training loss
# for Epoch 1 is 7.3978", LXMERT; "Loss at step 100: 2.31"), written "Epoch 1 | training loss: 7.3978"
_WORDS = r"(?<![\w./\-])[A-Za-z_][\w./\-]*(?:\s+[A-Za-z_][\w./\-]*){0,2}?"  # from a word's start only
_A_VALUE = r"(?=[-+]?(?:\d|\.\d|(?i:nan|inf)\b|(?i:infinity)\b))"
_FOR_COUNTER = re.compile(
    rf"(?:\b[Tt]he\s+)?(?P<key>{_WORDS})\s+(?:for|at|after|in)\s+(?:the\s+)?"
    rf"(?P<mark>(?:[Ee]poch|EPOCH|[Ee]pisode|[Ss]tep|STEP|[Ii]ter(?:ation)?|ITER(?:ATION)?)\s*+(?:#\s*+)?{INT}"
    rf"(?:\s*/\s*{INT})?)"
    rf"\s*+(?:,\s*+)?(?:is|was|[:=])\s*{_A_VALUE}"
)
# and a name said to be a value ("the loss is 7.39", "Epoch 1, training loss was 2.1"): "loss: 7.39"
_SAID_TO_BE = re.compile(rf"(?:\b[Tt]he\s+)?(?P<key>{_WORDS})\s+(?:is|was)(?:\s*:)?\s+{_A_VALUE}")
# or its value, then the counter it is "on" (a Julia callback's "Loss of 0.01318 on iteration 2"):
# "iteration 2 | Loss: 0.01318"
_VALUE_ON_COUNTER = re.compile(
    rf"(?P<key>{_WORDS})\s+of\s+(?P<value>(?>{NUMBER}))\s+(?:on|at|after)\s+(?:the\s+)?"
    rf"(?P<mark>(?:[Ee]poch|[Ee]pisode|[Ss]tep|[Ii]ter(?:ation)?)\s+{INT})\b"
)
# KPConv's trainer, the step counted within the epoch: "e001-i0607 => L=0.000 acc= 82% / t(ms):  38.8 …"
_KPCONV = re.compile(rf"^\s*e({INT})-i({INT})\s*=>\s*L=")

# DARTS's search and its offspring (PC-DARTS, P-DARTS, PDARTS' NAS repositories) print each report
# unnamed: "train 100 6.911373e+00 0.085087 0.605275", the step within the epoch, the running loss,
# top-1 and top-5 accuracy; "valid 050 …" for the held-out split (a time stamp may precede)
_DARTS = re.compile(
    rf"(?P<split>train|valid)\s+(?P<step>{INT})\s+(?P<loss>(?>{NUMBER}))\s+(?P<top1>(?>{NUMBER}))"
    rf"\s+(?P<top5>(?>{NUMBER}))\s*$"
)


def _darts(match: re.Match[str]) -> str:
    """A training report at its step; a validation report (its batches counted from 0 again) read
    into the training step before it."""
    held_out = "valid " if match["split"] == "valid" else ""
    step = "" if held_out else f"step {match['step']} | "
    top = f"{held_out}top1: {match['top1']} | {held_out}top5: {match['top5']}"
    return f"{step}{held_out}loss: {match['loss']} | {top}"


# the console of the MetersGroup logger many continuous-control codebases share (pytorch_sac, DrQ,
# CURL, SAC-AE): "| train | E: 2 | S: 1000 | R: 305.9 | BR: 4.79 | ALOSS: -6.88 | CLOSS: 2.33 |",
# each name an abbreviation its format table defines
_METERS_GROUP = re.compile(
    r"^\s*\|\s*(?P<group>[a-z]+)\s*(?P<fields>(?:\|\s*[A-Z][A-Z0-9]*:\s*[^|]*)+)\|?\s*$"
)
_METERS_FIELD = re.compile(r"\|\s*(?P<key>[A-Z][A-Z0-9]*):\s*(?P<value>[^|]*?)\s*(?=\||$)")
_METERS_NAMES = {
    "E": "episode",
    "F": "frame",
    "L": "episode_length",
    "R": "episode_reward",
    "ER": "episode_reward",
    "TR": "true_episode_reward",
    "SR": "success_rate",
    "BR": "batch_reward",
    "ALOSS": "actor_loss",
    "CLOSS": "critic_loss",
    "TLOSS": "alpha_loss",
    "TVAL": "alpha_value",
    "AENT": "actor_entropy",
    "RLOSS": "ae_loss",
    "BCLOSS": "bc_loss",
    "BS": "buffer_size",
    "FPS": "fps",
}


def _meters_group(match: re.Match[str]) -> str:
    """A MetersGroup line at its step ``S``, each abbreviation under its name; an evaluation's
    under ``eval/`` (its episodes are scored apart from training's); durations and clocks dropped."""
    fields = {m["key"]: m["value"] for m in _METERS_FIELD.finditer(match["fields"])}
    split = "eval/" if match["group"] == "eval" else ""
    step = f"step {fields.pop('S')} | " if "S" in fields else ""
    named = (f"{split}{_METERS_NAMES[key]}: {value}" for key, value in fields.items() if key in _METERS_NAMES)
    return step + " | ".join(named)


# one environment's episode reward, of a vector of them (SheepRL's "reward_env_1=4.0"): the reward
_ENV_REWARD = re.compile(r"\breward_env_\d+\b")


# icefall's ScaledAdam (k2, Zipformer, ZipVoice): the quartiles of the recent steps' gradient norms,
# "Clipping_scale=2.0, grad-norm quartiles 2.485e-02 3.150e-02 3.570e-02 4.058e-02 1.745e+00,
# threshold=7.139e-02, percent-clipped=10.0" (the median the norm, the largest the window's), and
# "Scaling gradients by 0.0732, model_norm_threshold=0.0714" for a step whose norm passed twice the
# threshold (the norm the threshold over the factor; a factor of 0 a norm that was NaN or Inf)
_NORM_QUARTILES = re.compile(
    rf"Clipping_scale=(?>{NUMBER}), grad-norm quartiles (?>{NUMBER}) (?>{NUMBER}) (?P<median>(?>{NUMBER})) "
    rf"(?>{NUMBER}) (?P<max>(?>{NUMBER})), threshold=(?>{NUMBER}), percent-clipped=(?>{NUMBER})"
)
_NORM_SCALED = re.compile(
    rf"Scaling gradients by (?P<factor>(?>{NUMBER})), model_norm_threshold=(?P<threshold>(?>{NUMBER}))"
)


def _norm_scaled(match: re.Match[str]) -> str:
    factor, threshold = parse_number(match["factor"]), parse_number(match["threshold"])
    return f"grad_norm: {threshold / factor if factor > 0 else math.nan!r}"  # NaN over a NaN factor too


# Julia's @show of a counter and a call: "(i, loss(dataset[1]...)) = (3, 0.2960257966 (tracked))"
_SHOWN_PAIR = re.compile(rf"\(\w+, (?P<name>\w+)\(.*\)\) = \((?P<step>{INT}), (?P<value>(?>{NUMBER}))")


# Lightning's ModelCheckpoint saying a monitored metric's value: "Epoch 2, global step 21:
# 'val_roc_auc' reached 0.95089 (best 0.95089), saving model to …" (the best so far is no record)
_CHECKPOINT_REACHED = re.compile(
    rf"Epoch (?P<epoch>{INT}), global step (?P<step>{INT}): '(?P<key>[^']+)' reached (?P<value>(?>{NUMBER}))"
)


# ML-Agents' summary of a period in which no episode ended: "Step: 1000. No episode was completed
# since last summary." (an episode count of 0, which its summaries otherwise leave unsaid)
_NO_EPISODE = re.compile(rf"Step: (?P<step>{INT})\. No episode was completed since last summary")


# LightGBM's evaluation lines name each metric after its data set: "[4]\ttraining's binary_logloss:
# 0.77109\tvalid_1's binary_logloss: 0.770573", read "training/binary_logloss", "valid_1/…" (one
# name for both, the held-out value would replace the training one)
_OWNED = re.compile(r"(?<![\w'])(?P<owner>[A-Za-z_]\w*)'s (?P<key>[A-Za-z_][\w.\-]*)(?=\s*:)")

# a GAN loop's bracketed groups, each opened by its network's loss (Keras-GAN's "5 [D loss: 0.693, acc.:
# 50.00%] [G loss: 0.71]", a DCGAN's "[D loss: 7.97, acc: 0.50]  [A loss: 0.00, acc: 1.00]"): the other
# names of a group are that network's ("D acc", "A acc"), not one "acc" the last group sets
_GAN_GROUP = re.compile(r"\[(?P<net>[A-Z]\w{0,2}) loss: (?P<rest>[^\]]*)\]")
_GROUP_NAME = re.compile(r"(?P<sep>[,|]\s*)(?P<name>[A-Za-z][\w]*)\.?:")
_PERCENT_SIGN = re.compile(r"(?<=\d)%")


def _gan_group(match: re.Match[str]) -> str:
    """One group with each name after the loss given its network's prefix."""
    net = match.group("net")

    def named(field: re.Match[str]) -> str:
        name = field.group("name")
        return field.group(0) if name == net else f"{field.group('sep')}{net} {name}:"

    rest = _PERCENT_SIGN.sub("", match.group("rest"))  # "acc.: 50.00%": a percentage, read as 50.0
    return f"[{net} loss: {_GROUP_NAME.sub(named, rest)}]"


# verl's SFT trainer's tracker, one metric a line, the name after a comment's "#": "[243/256] : (avg (std),
# med) = (    0.2912 [     0.0000] (    0.1269),     0.2669)  # train/grad_norm" (the average the value)
_AVG_STD_MED = re.compile(
    rf"\[({INT})/{INT}\]\s*:\s*\(avg \(std\), med\) = "
    rf"\(\s*({NUMBER})\s*\[[^\]]*\]\s*\([^)]*\),\s*(?:{NUMBER})\)"
    r"\s*#\s*(\S+)\s*$"
)

# MXNet's Speedometer (Sockeye, GluonCV), the batch counted within the epoch: "Epoch[0] Batch [50]\tSpeed:
# 51.34 samples/sec\tperplexity=45560.6", read "epoch: 0 | step 50 |", the batches counted on across epochs
# (InsightFace's prints the batches since the last line: "Batch [0-20]", the last of them the step)
_SPEEDOMETER = re.compile(rf"Epoch\[({INT})\]\s*Batch\s*\[(?:{INT}-)?({INT})\]")

# CNTK's minibatch progress, the samples counted within the epoch: "Epoch[ 1 of 30]-Minibatch[ 501-1000,
# 53.33%]: ce = 2.30221021 * 16000; err = 0.89225000 * 16000;", read "epoch: 1 | step 1000 |", the
# minibatches counted on across epochs (each criterion's "* 16000" is the samples it averaged)
_CNTK_MINIBATCH = re.compile(
    rf"Epoch\[\s*({INT})\s+of\s+{INT}\]-Minibatch\[\s*{INT}\s*-\s*({INT})(?:,[^\]]*)?\]:"
)
_SAMPLES_AVERAGED = re.compile(rf"\s*\\?\*\s*{INT}\s*(?:;|$)")

# the time-series forecasters built on Informer's loop (Informer, Autoformer, FEDformer, PatchTST, the
# Time-Series-Library): "\titers: 100, epoch: 2 | loss: 0.4504840" counted within the epoch, read
# "epoch: 2 | step 100 |" and counted on across epochs; the epoch's summary "Epoch: 2, Steps: 384 |
# Train Loss: 0.28 Vali Loss: 0.62 Test Loss: 0.61" under its sets' own names, with no step of its
# own (it closes the epoch's last iteration; alone, its epoch is the step); "Epoch: 2 cost time:
# 26.3" a duration of no step
_FORECAST_ITERS = re.compile(rf"iters:\s*({INT}),\s*epoch:\s*({INT})\s*\|")
_FORECAST_EPOCH = re.compile(rf"Epoch:\s*({INT}),\s*Steps:\s*{INT}\s*\|\s*Train Loss:")
_FORECAST_VALI = re.compile(r"\s+Vali Loss:")
_FORECAST_TEST = re.compile(r"\s+Test Loss:")
_FORECAST_COST = re.compile(rf"Epoch:\s*{INT}\s+cost time:")
# RecBole's epochs, each a training line and an evaluating one: "epoch 0 training [time: 24.48s, train
# loss: 1.3043]", "epoch 0 evaluating [time: 0.07s, valid_score: 0.428900]", read "epoch 0 | time: …"
_RECBOLE_EPOCH = re.compile(rf"(?<!\w)(epoch\s+{INT})\s+(?:training|evaluating)\s*\[")
# a meter's value and its running mean, the mean not finite while the value is: a step before this
# one gave NaN or Inf (FCOS's "loss: 13.8 (nan)", DINOv2's "koleo_loss: 0.0315 (inf)"), kept as the
# mean's own field, "koleo_loss (mean): inf"; a finite mean is passed over as before, and so is a
# gradient norm's (Swin's "grad_norm 2.1 (inf)": a step fp16 loss scaling skipped, its norm inf)
_NONFINITE_MEAN = re.compile(
    rf"(?<![\w./@\-])(?P<key>[A-Za-z_][\w./@\-]*)(?P<sep>\s*+(?:[:=]\s*+)?)(?P<value>{NUMBER})"
    r"\s*\(\s*(?P<mean>[-+]?(?i:nan|inf))\s*\)"
)


def _nonfinite_mean(match: re.Match[str]) -> str:
    """A running mean that is not finite as a field of its own, but a gradient norm's."""
    if "norm" in match["key"].lower():
        return match.group(0)
    return f"{match['key']}{match['sep']}{match['value']} | {match['key']} (mean): {match['mean']}"


# a loop that names its batch in a word: "The train loss of epoch3-batch-50:0.23037758469581604"
# (hualin95's DeepLab v3+), read "epoch: 3 | step 50 | train loss: …", counted on across epochs
_OF_EPOCH_BATCH = re.compile(
    rf"(?:\b[Tt]he\s+)?({_WORDS})\s+of\s+epoch\s*({INT})\s*-\s*batch\s*-\s*({INT})\s*:"
)
# a statistic of a YOLO layer that saw no object in the batch, a mean over no box (AlexeyAB's darknet:
# "Region 130 Avg (IOU: -nan, GIOU: -nan), Class: -nan, …, count: 0, loss = 74375.8"): left out
_REGION_NAN = re.compile(r"[\w.]+:\s*-?nan\b,?", re.IGNORECASE)


def _region_without_nan(match: re.Match[str]) -> str:
    return _REGION_NAN.sub("", match.group(0))


# a schedule's announcement: "Updating learning rate to 5e-05" (the same loop), "Setting LR to 0.01"
_LR_SET_TO = re.compile(
    r"\b(?:[Uu]pdat|[Ss]ett|[Aa]djust|[Cc]hang|[Dd]ecay|[Rr]educ)(?:e|es|ed|ing)\s+(?:the\s+)?"
    r"(?:learning[ _]rate|lr|LR)\s+to\s*(?=[-+]?(?:\d|\.\d))"
)

# 3D Gaussian Splatting's evaluation (graphdeco-inria and its forks): "[ITER 7000] Evaluating test: L1
# 0.4732 PSNR 5.3944", each set's metrics under its name ("test/L1"), not one L1 the train set replaces
_SPLAT_EVAL = re.compile(rf"\[ITER\s+({INT})\]\s+Evaluating\s+(\w+):\s+L1\s+({NUMBER})\s+PSNR\s+({NUMBER})")

# DeiT's (ConvNeXt's, BEiT's, MAE's) evaluation, after its epoch's "Averaged stats:": "Accuracy of the
# network on the 50000 test images: 81.8%" (its top-1 accuracy)
_TEST_IMAGES = re.compile(rf"Accuracy of the (?:model|network) on the {INT} test images:\s*(?=(?>{NUMBER})%)")

# EESEN's CTC trainer (Kaldi's logging): "VLOG[1] (train-ctc-parallel:EvalParallel():ctc-loss.cc:182)
# After 280196 sequences (343.467Hr): Obj(log[Pzx]) = -34.12   TokenAcc = 65.5557%", the sequences
# seen the step, the objective log P(z|x) a log-likelihood: its negation is the CTC loss
_EESEN = re.compile(
    rf"^.*?\bAfter\s+({INT})\s+sequences\s*\([\d.]+\s*Hr\):\s*Obj\(log\[Pzx\]\)\s*=\s*(?P<obj>{NUMBER})"
)


def _eesen(match: re.Match[str]) -> str:
    obj = match["obj"]
    return f"step {match[1]} | ctc loss: {obj[1:] if obj.startswith('-') else '-' + obj.lstrip('+')} |"


# a counter and one number after it, unnamed: an RL loop's "Episode 399: 12.0" (the episode's reward),
# a list typed out by hand, "epoch 5: 2.838" (a value the log does not name)
_COUNTER_VALUE = re.compile(
    rf"^\s*(?P<counter>[Ee]pisode|[Ee]poch|[Ss]tep|[Ii]teration|[Ii]ter)\s*+(?:#\s*+)?({INT})\s*:\s*(?=(?>{NUMBER})\s*$)"
)


def _counter_value(match: re.Match[str]) -> str:
    name = "episode_reward" if match["counter"].lower() == "episode" else "value"
    return f"{match['counter']} {match[2]} | {name}: "


# an RL loop's sentence: "Episode ended with reward: 1.0" (Haiku's IMPALA), "Episode finished, return: 3"
_EPISODE_ENDED = re.compile(
    r"\b[Ee]pisode\s+(?:ended|finished|done|completed?)\s*(?:with|,)?\s*(?:a\s+|total\s+)?(reward|return|score)\b"
)


# names, then their values in the same order, each list cut at "|": DCGAN-for-Bird-Generation's
# "Batch 168/170 generator loss | discriminator loss : 3.7583103 | 0.9910032 - batch took 2.1 s."; the
# values found first (each colon tried once), the names walked back from them, so that a long line
# of bars costs its length, not its square
_VALUES_AFTER_NAMES = re.compile(rf":\s*+(?P<values>(?>{NUMBER})(?:\s*+\|\s*+(?>{NUMBER}))++)")
_NAME = re.compile(r"[A-Za-z_][\w .]*")


def _names_then_values(line: str) -> str:
    """``line`` with ``a | b : 1 | 2`` written ``a: 1 | b: 2``: the names are the whole names cut at
    ``|`` before the colon, and the name that ends the piece before them, as many as the values."""
    found = _VALUES_AFTER_NAMES.search(line)
    if found is None:
        return line
    values = [value.strip() for value in found["values"].split("|")]
    pieces = line[: found.start()].split("|")
    first = len(pieces)
    while first and _NAME.fullmatch(pieces[first - 1].strip()):
        first -= 1
    names = [piece.strip() for piece in pieces[first:]]
    before = pieces[first - 1].rstrip() if first else ""
    lead = _trailing_name(before)  # the piece before them ends in a name ("Batch 168/170 generator loss")
    if len(names) + bool(lead) != len(values) or len(values) < 2:
        return line
    if lead:
        names = [lead, *names]
        at = sum(len(piece) + 1 for piece in pieces[: first - 1]) + len(before) - len(lead)
    else:
        whole = pieces[first]
        at = sum(len(piece) + 1 for piece in pieces[:first]) + len(whole) - len(whole.lstrip())
    written = " | ".join(f"{name}: {value}" for name, value in zip(names, values, strict=True))
    return line[:at] + written + line[found.end() :]


def _trailing_name(text: str) -> str:
    """The name ``text`` ends in (words, digits, ``_`` and ``.`` from a letter on), walked back from
    its end; ``""`` where it ends otherwise."""
    start = len(text)
    while start and (text[start - 1].isalnum() or text[start - 1] in "_ ."):
        start -= 1
    while start < len(text) and not (text[start].isalpha() or text[start] == "_"):
        start += 1
    return text[start:]


# names joined by "/" or "|" before one colon, their values joined the same way after it, as many:
# triplet-reid's "loss min|avg|max: 0.713|2.607|60.013" (a word before the names heads each of
# them), InvSR's "ldif/ldis/llpips/real/fake:t(100):0.43/+0.0076/0.231/+0.01/-0.05, t(250):0.44/…"
# (each list of values after a label of its own, the names read once for all)
_JOINED_NAMES = re.compile(
    r"(?<![\w./|])(?:(?P<head>[A-Za-z_]\w*) )?"
    r"(?P<names>[A-Za-z_]\w*(?P<sep>[/|])[A-Za-z_]\w*(?:(?P=sep)[A-Za-z_]\w*)*):"
)
_JOINED_VALUES = re.compile(
    rf"\s*+(?:(?P<label>[A-Za-z_][\w()]*):\s*+)?(?P<values>(?>{NUMBER})(?:\s*[/|]\s*(?>{NUMBER}))+)(?:\s*,)?"
)


def _joined_names(line: str) -> str:
    """``line`` with ``a|b: 1|2`` written ``a: 1 | b: 2`` (:data:`_JOINED_NAMES`)."""
    found = _JOINED_NAMES.search(line) if "/" in line or "|" in line else None
    if found is None:
        return line
    names = found["names"].split(found["sep"])
    if any(name.startswith("total") for name in names):  # a counter over its total: "step/total_step: 5/60"
        return line
    if found["head"]:
        names = [f"{found['head']}_{name}" for name in names]
    written, at = [], found.end()
    while (values := _JOINED_VALUES.match(line, at)) is not None:
        numbers = re.split(r"\s*[/|]\s*", values["values"].strip())
        if len(numbers) != len(names):
            break
        label = f"{values['label']}/" if values["label"] else ""
        written += [f"{label}{name}: {number}" for name, number in zip(names, numbers, strict=True)]
        at = values.end()
    if not written:
        return line
    return f"{line[: found.start()]}{' | '.join(written)} | {line[at:].lstrip()}"


# a loss and its terms in parentheses after its name: TensorLayer's SRGAN "g_loss(mse:0.000, vgg:0.000,
# adv:0.001) d_loss: 1.387", each term named after the loss
_TERMS = re.compile(
    rf"(?<![\w./])(?P<loss>[A-Za-z_]\w*)\((?P<terms>[A-Za-z_]\w*\s*[:=]\s*(?>{NUMBER})"
    rf"(?:\s*,\s*[A-Za-z_]\w*\s*[:=]\s*(?>{NUMBER}))+)\)"
)


def _terms(match: re.Match[str]) -> str:
    pairs = (term.split(":" if ":" in term else "=", 1) for term in match["terms"].split(","))
    return " | ".join(f"{match['loss']}/{name.strip()}: {value.strip()}" for name, value in pairs) + " |"


# a label, a colon, then short names each before its number, the line's opening: VocGAN's "Avg : g
# 1.3729 d 0.0000 ad 0.0000| step 5976: 100%|…" (the generator's, the discriminators' losses)
_LABELLED_PAIRS = re.compile(
    rf"^\s*[A-Za-z][A-Za-z ]{{0,20}}?\s*:\s*(?P<pairs>[A-Za-z_]\w{{0,15}}\s+(?:{NUMBER})"
    rf"(?:\s+[A-Za-z_]\w{{0,15}}\s+(?:{NUMBER}))+)\s*(?=\||$)"
)


def _labelled_pairs(match: re.Match[str]) -> str:
    tokens = match["pairs"].split()
    return " | ".join(f"{name}: {value}" for name, value in zip(tokens[::2], tokens[1::2], strict=True)) + " "


_PROSE: tuple[tuple[str, re.Pattern[str], Any], ...] = (
    *((word, _FOR_COUNTER, r"\g<mark> | \g<key>: ") for word in (" for ", " at ", " after ", " in ")),
    (" is ", _SAID_TO_BE, r"\g<key>: "),
    (" was ", _SAID_TO_BE, r"\g<key>: "),
    (" is: ", _SAID_TO_BE, r"\g<key>: "),  # NeuralPDE's "Current loss is: 133.45, Iteration: 92"
    (" of ", _VALUE_ON_COUNTER, r"\g<mark> | \g<key>: \g<value>"),
)
# the shapes written as "name: value" fields (or a step marker) before a line is read, each where
# its literal is in the line
_REWRITES: tuple[tuple[str, re.Pattern[str] | None, Any], ...] = (
    *_PROSE,
    ("'s ", _OWNED, r"\g<owner>/\g<key>"),
    (" loss: ", _GAN_GROUP, _gan_group),
    ("(avg (std), med)", _AVG_STD_MED, r"step \1 | \3: \2"),
    ("] Evaluating ", _SPLAT_EVAL, r"step \1 | \2/L1: \3 | \2/PSNR: \4"),
    ("] Batch", _SPEEDOMETER, r"epoch: \1 | step \2 |"),
    (" => L=", _KPCONV, r"epoch: \1 | step \2 | loss="),
    ("| S: ", _METERS_GROUP, _meters_group),
    ("reward_env_", _ENV_REWARD, "reward"),
    ("grad-norm quartiles", _NORM_QUARTILES, r"grad_norm: \g<median> | grad_norm_window_max: \g<max>"),
    ("Scaling gradients by", _NORM_SCALED, _norm_scaled),
    (")) = (", _SHOWN_PAIR, r"step \g<step> | \g<name>: \g<value>"),
    ("No episode was completed", _NO_EPISODE, r"step \g<step> | episodes: 0"),
    ("' reached ", _CHECKPOINT_REACHED, r"epoch: \g<epoch> | step \g<step> | \g<key>: \g<value>"),
    ("train ", _DARTS, _darts),
    ("valid ", _DARTS, _darts),
    ("iters:", _FORECAST_ITERS, r"epoch: \2 | step \1 |"),
    (", Steps:", _FORECAST_EPOCH, r"epoch: \1 | Train Loss:"),
    ("Vali Loss:", _FORECAST_VALI, " | val loss:"),
    ("Test Loss:", _FORECAST_TEST, " | test loss:"),
    (" test images: ", _TEST_IMAGES, "test accuracy: "),
    (" sequences (", _EESEN, _eesen),
    (":", _COUNTER_VALUE, _counter_value),
    (" : ", _LABELLED_PAIRS, _labelled_pairs),
    (" | ", None, _names_then_values),  # a function of the line: its names are walked back
    (":", None, _joined_names),  # names joined by "/" or "|" before a colon
    ("(", _TERMS, _terms),
    ("pisode ", _EPISODE_ENDED, r"episode_\1"),
    (" cost time:", _FORECAST_COST, "epoch time:"),
    ("rate to", _LR_SET_TO, "lr: "),
    ("lr to", _LR_SET_TO, "lr: "),
    ("LR to", _LR_SET_TO, "lr: "),
    ("ing [", _RECBOLE_EPOCH, r"\1 | "),
    ("-batch-", _OF_EPOCH_BATCH, r"epoch: \2 | step \3 | \1: "),
    ("count: 0", EMPTY_REGION, _region_without_nan),
    ("(nan", _NONFINITE_MEAN, _nonfinite_mean),
    ("(inf", _NONFINITE_MEAN, _nonfinite_mean),
    ("]-Minibatch[", _CNTK_MINIBATCH, r"epoch: \1 | step \2 |"),
    ("]-Minibatch[", _SAMPLES_AVERAGED, " | "),
    ("] ", _BRACKETED, r"\g<key>: \g<value>"),
    ("]:", _BRACKETED, r"\g<key>: \g<value>"),  # CoupletAI's "[epoch]: 199, [batch]: 23900, [loss]: 4.99"
    ("]:", _INDEXED, r"step \g<step> | \g<key>:"),
    ("Key:", _KEY_VALUE, r"\g<key>: \g<value>"),
    ("DLL ", _DLLOGGER, ""),
    ("[Losses:", _LOSSES, _named_losses),
    ("step_", _GLUED, _unglued),
    ("]\t[", _SR_LOSSES, _sr_losses),
    (":", _LOGGED_AT, ""),
    ("epoch:train:", _ESPNET_BATCHES, r"epoch: \1 | step \2 |"),
)


def unprose(line: str) -> str:
    """``line`` with a loop's prose written as fields: "Loss at step 100 is 2.31" → "step 100 |
    Loss: 2.31" (:data:`_FOR_COUNTER`, :data:`_SAID_TO_BE`)."""
    for literal, pattern, rewritten in _PROSE:
        line = pattern.sub(rewritten, line) if literal in line else line
    return line


def _last_bar(line: str) -> str:
    """``line`` from the end of its bar before last: trlx prints its rollout bar ``[rollout 128 /
    128]: 100%|…| 128/128 […]`` glued before the training bar ``[losses/…]:  16%|…| 1044/6400 […]``
    (trlx#342), and the step is the training bar's count, its description the losses."""
    bars = list(_WHOLE_BAR.finditer(line))
    return line[bars[-2].end() :] if len(bars) > 1 else line


def _bar_tail(line: str, match: re.Match[str]) -> tuple[str, dict[str, Any]]:
    """The text after a step marker, and what a framework's warning glued behind it says when the
    marker is a progress bar: the bar's bracket ends its postfix, and a warning after it
    (trlx#342: ``…| 1044/6400 [1:16:09<1:07:04,  1.33it/s][…] [deepspeed] OVERFLOW! … reducing
    to 64.0``) is folded into the step the bar counts, kept verbatim in ``health/alerts``."""
    after = line[match.end() :]
    close = after.find("]") if "%|" in match.group(0) else -1
    tail = after[close + 1 :].strip() if close >= 0 else ""
    found = said(tail) if tail else {}
    if not found:
        return after, {}
    return after[: close + 1], {**found, S.ALERTS: tail}


def is_stepped(line: str) -> bool:
    """A record line with a step marker (what the format vote counts)."""
    found = record(line)
    return found is not None and found[0] is not None


def read(log: LogFile) -> Parsed:
    """One row per record (consecutive records of one step merged)."""
    return _template.attempt(lambda bulk: _read(log, bulk))


def _read(log: LogFile, bulk: bool) -> Parsed:
    """:func:`read`, with the bulk path of :mod:`~moescope.analyze.readers._template` or without."""
    frameworks: list[str] = []
    width = wrap_width(log.lines)

    epoch = None  # the epoch of Keras's last "Epoch e/E" (or "Epoch e") header, and whether it has /E
    banner = None  # the epoch of the last banner line ("EPOCH 1:", "[ Epoch 0 ]")

    counted = False  # whether a record named its step

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        nonlocal epoch, banner, counted
        end = unwrap(lines, i, width)  # a record a terminal wrapped at its width: pieces rejoined
        text = lines[i] if end == i + 1 else "".join(lines[i:end])
        header = _epoch_header(text)
        if header:
            epoch = header
            return [], end
        redrawn = _redraws(text) if text.count("%|") > 1 else []
        if redrawn:  # a bar's redraws on one line, the carriage returns between them lost in the paste
            read = [(found, piece) for piece in redrawn if (found := record(piece)) is not None]
            return [row_of(found, piece, i) for found, piece in read], end
        found = record(text)
        if found is None:
            mark = marker(text)  # "Train step 5/1000 done.": the step the lines below belong to
            if not (mark and _marks_only(text, mark[2])) or _KERAS_CALLBACK.match(text):
                return None
            # MetricLogger's "Epoch: [3] Total time: …" over its epoch's averages: their step only
            # where no iteration line gave one (else they join the epoch's last iteration)
            summary = _EPOCH_SUMMARY in text
            if summary and counted:
                return None
            banner = mark[1] if mark[2].re is _EPOCH_LINE and not summary else banner
            return [Row(mark[1], {}, text, i + 1)], end
        return [row_of(found, text, i)], end

    def row_of(found: tuple[int | None, str | None, dict[str, Any]], text: str, i: int) -> Row:
        """The row of a record found on ``text`` (line ``i``)."""
        nonlocal counted
        step, framework, fields = found
        counted = counted or step is not None
        if banner is not None and step is not None and "epoch" not in fields:
            fields["epoch"] = banner  # a counter under an epoch's banner starts over each epoch
        if framework:
            frameworks.append(framework)
        # fairseq's validation line, or one tagged "(Validation)", "[valid]": its loss is no training
        # loss (the literal first: a hot path)
        if ("valid on" in text and _HELD_OUT_LINE.search(text)) or _HELD_OUT_TAG.match(text):
            fields = {f"valid/{key}": value for key, value in fields.items()}
        elif len(fields) > 1:
            fields = _split_of_first(fields)
        return Row(_keras_step(text, epoch, step), fields, text, i + 1)

    fast = _template.bulk(log.lines, parse_at, template, took=frameworks.extend) if bulk else parse_at
    parsed = scan(log.lines, fast)
    _epochs_opened(parsed.rows)
    if epoch is None:
        _bars_as_epochs(parsed.rows)
    parsed.rows = [r for r in _merge_runs(parsed.rows) if r.metrics]
    steps_in_tables(parsed)
    _epochs_printed_within(parsed)
    epochs_as_steps(parsed)
    keys = {k for row in parsed.rows for k in row.metrics}
    named = max(set(frameworks), key=frameworks.count) if frameworks else None
    parsed.framework = named or guess_beyond_generic(keys)
    for row in parsed.rows:
        row.metrics = canonical_names(parsed.framework, row.metrics)
    parsed.keymap = "moescope"  # renamed here: the framework's table, then the generic one
    return parsed


_HELD_OUT_LINE = re.compile(r"\|\s*valid on '[^']*' subset\s*\|")  # fairseq: "| valid on 'valid' subset |"
# a held-out record's tag before its fields, after a time stamp or a list's dash at most: Marian's
# "[2019-10-17 17:51:28] [valid] Ep. 2 : Up. 80000 : cross-entropy : 53.9", a loop's
# "  - (Validation) ppl: 86.35"
_HELD_OUT_TAG = re.compile(
    r"\s*(?:\[[\d\-/: ,.]+\]\s*)?[-*]?\s*[(\[](?:valid|validation|val|eval|evaluation|test)[)\]]",
    re.IGNORECASE,
)
_KERAS_EPOCH = re.compile(rf"\s*Epoch\s+({INT})(/{INT})?\s*")
# a Keras callback's message after its epoch's record ("Epoch 00044: val_acc did not improve",
# "Epoch 7: val_loss improved from 0.52 to 0.49, saving model to …"): no marker of the lines below
_KERAS_CALLBACK = re.compile(
    r"\s*Epoch\s+\d+: (?:\S+ (?:did not improve|improved from)|early stopping|ReduceLROnPlateau|saving model)"
)
_KERAS_INTERVAL = re.compile(rf"\s*Interval\s+({INT})\s+\({INT} steps performed\)\s*")
# Keras's bar, or its verbose=2 line without one: "100/100 - 3s - loss: 0.49 - accuracy: 0.80"
_KERAS_BAR = re.compile(rf"\s*({INT})/({INT})\s+(?:\[[=>.]*\]|-\s+\d+m?s\b)")
# an old Keras's verbose=2 line, its time alone before the metrics: " - 1782s - loss: 4.63 - …"
_KERAS_TIMED = re.compile(r"\s*-\s+\d+m?s\s+-\s")
# EDSR's epoch header, "[Epoch 26]\tLearning rate: 1.00e-4", over its "[1600/16000]\t[L1: 5.96]" lines
_SR_EPOCH = re.compile(rf"\s*\[Epoch\s+({INT})\](?=\s*(?:Learning rate:|$))")
_SR_COUNTER = re.compile(rf"\s*{_SR_COUNT}")


def _epoch_header(text: str) -> tuple[int, bool] | None:
    """The epoch a header line opens, and whether the counter of the lines below it starts over
    each epoch: Keras's ``Epoch 2/10`` (an old Keras's bare ``Epoch 9``: not), keras-rl's
    ``Interval 5 (40000 steps performed)`` (its bar counts the interval's steps), EDSR's
    ``[Epoch 26]\tLearning rate: 1.00e-4``; ``None`` for any other line."""
    keras = _KERAS_EPOCH.fullmatch(text)
    if keras:
        return int(keras[1]), keras[2] is not None
    edsr = _SR_EPOCH.match(text) if text.lstrip().startswith("[Epoch") else None
    interval = edsr or _KERAS_INTERVAL.fullmatch(text)
    return (int(interval[1]), True) if interval else None


def _keras_step(text: str, epoch: tuple[int, bool] | None, step: int | None) -> int | None:
    """A Keras progress line's step: its batch counter ``i/n`` after the epochs before it (Keras
    counts them from 1; keras-rl's ``Interval 5 (40000 steps performed)`` and EDSR's ``[Epoch 26]``
    over its ``[1600/16000]`` lines alike), as each epoch's
    counter starts over; under an old Keras's bare ``Epoch e`` header (epochs from 0, one line an
    epoch: its sample counter, the same every epoch, is no step), or for a line with no counter,
    its time alone (`` - 1782s - loss: …``), the epoch itself; ``step`` for any other line."""
    bar = (_KERAS_BAR.match(text) or _SR_COUNTER.match(text)) if epoch is not None else None
    if bar is None and epoch is not None and step is None and _KERAS_TIMED.match(text):
        return epoch[0]
    if bar is None or epoch is None:
        return step
    number, counted = epoch
    return (number - 1) * int(bar[2]) + int(bar[1]) if counted else number


def _bars_as_epochs(rows: list[Row]) -> None:
    """Keras's bars pasted without their ``Epoch e/E`` headers, every one finished (``1875/1875
    [=====] - 5s 3ms/step - loss: 0.49``, a line an epoch; an old Keras counts past the end,
    ``215424/215375``) but the last, the epoch the paste ends in: each bar's total is the same, so the
    bars are numbered as the epochs they end, from 1 (read as their count, they were one step)."""
    bars = [(row, _KERAS_BAR.match(row.raw)) for row in rows]
    ended = [(row, bar) for row, bar in bars if bar is not None]
    # an old Keras overshoots (215424/215375); the last bar may be the epoch the paste ends in
    finished = all(int(bar[1]) >= int(bar[2]) for _, bar in ended[:-1])
    if len(ended) < 2 or not finished or len({bar[2] for _, bar in ended}) > 1:
        return
    for epoch, (row, _) in enumerate(ended, start=1):
        row.step = epoch


def wrap_width(lines: list[str]) -> int | None:
    """The width a terminal wrapped the log's lines at: a length of 60 or more that several lines
    with a step marker (or Keras's progress lines, which count within an epoch) share exactly while
    others are shorter, and that half of them or more are followed by a line without one (its
    rest), else ``None``: records of one fixed width, line after line (LightGBM's ``[2]\ttraining's
    binary_logloss: 0.732192\t…``), were not wrapped. One such line is enough where the line after
    it is a rest of that width too (a record cut in three pieces or more: a paste of one epoch of
    a Keras model with many outputs)."""
    head = lines[:5000]
    marked = [i for i, line in enumerate(head) if len(line) >= 60 and (marker(line) or _keras_line(line))]
    lengths = Counter(len(head[i]) for i in marked)
    if not lengths:
        return None
    width, n = lengths.most_common(1)[0]
    width = width if n > 1 else max(lengths)  # no length shared: the longest may be a wrap's
    if width != max(len(line) for line in head):
        return None
    full = [i for i in marked if len(head[i]) == width]
    if n < 2:  # one: a wrap where the next line is a rest of the same width
        i = full[0]
        return (
            width
            if i + 1 < len(head) and len(head[i + 1]) == width and _rest_of(head[i], head[i + 1])
            else None
        )
    rests = sum(1 for i in full if i + 1 < len(head) and _rest_of(head[i], head[i + 1]))
    return width if 2 * rests >= len(full) else None


def _keras_line(line: str) -> bool:
    """A Keras progress line (``1875/1875 [====] - 5s - loss: …``, an old one's `` - 1782s - loss:
    …``): a record's head, though it names no step."""
    return _KERAS_BAR.match(line) is not None or _KERAS_TIMED.match(line) is not None


def _rest_of(piece: str, after: str) -> bool:
    """Whether ``after`` may be the rest of a record the terminal cut at ``piece``'s end: not blank,
    and no record of its own (no step marker, or a number the wrap cut in two)."""
    return bool(after.strip()) and (marker(after) is None or _cut_number(piece, after))


def unwrap(lines: list[str], i: int, width: int | None) -> int:
    """The index after the record starting at line ``i``: while a piece fills the wrap width
    exactly, the next line (no record of its own: no step marker, no time stamp a logger opens
    its lines with) continues it."""
    end = i + 1
    if width is None:
        return end
    while (
        end < len(lines)
        and end - i < MAX_PIECES
        and len(lines[end - 1]) == width
        and _rest_of(lines[end - 1], lines[end])
        and not _KERAS_EPOCH.fullmatch(lines[end])  # a header of the records below, no piece
        and not megatron.is_overflow(lines[end])  # DeepSpeed's line between two records
        and not said(lines[end])  # a framework's warning (Paddle's "Found inf or nan, current scale is: …")
        and not _DATED.match(lines[end])  # a logger's next line (mmengine's "… INFO - Exp name: …")
    ):
        end += 1
    return end


def _cut_number(piece: str, after: str) -> bool:
    """Whether the wrap cut a number in two, so that the rest opens the next line like a loop's
    counter (fairseq's ``… | gnorm 0.58`` then ``0 | clip 0.000 | …``): no record of its own, as
    it names none of the fields the piece names. Records of one shape and width (Keras's ``84/2560
    […] - loss: 6.36 - …`` over ``85/2560 […] - loss: nan - …``) name the same fields."""
    found = marker(after)
    if not (piece[-1:].isdigit() and after[:1].isdigit() and found is not None and found[2].start() == 0):
        return False
    return not pairs(piece).keys() & pairs(after).keys()


# a line a logger opened with its time or level: "2024/06/12 09:31:02 - mmengine", glog's
# "I0515 11:05:31.873651", Python logging's "ERROR:tensorflow:Model diverged with loss = NaN."
_DATED = re.compile(
    r"\s*\[?\d{4}[-/]\d\d[-/]\d\d[ T]\d\d:\d\d"
    rf"|{_GLOG_TIME}|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\w"
)


_EPOCH_SUMMARY = "] Total time:"


def is_banner(line: str) -> bool:
    """A line that is only a step marker, the records below it its step's (``Epoch: [3] Total
    time: 0:00:41``, ``EPOCH 1:``), where it is no record (:func:`record` tells, first)."""
    mark = marker(line)
    return mark is not None and _marks_only(line, mark[2])


def _marks_only(line: str, match: re.Match[str]) -> bool:
    """A short line that is mostly its step marker (a banner, not prose that mentions a step)."""
    return len(line.strip()) <= 3 * len(match.group(0)) + 20


# the row a logger's boxed table gives its step in, among the metrics (OpenAI baselines' and
# guided-diffusion's "| step | 1.53e+05 |", baselines' DQN "| steps | 4008662 |", SB3's
# "|    total_timesteps  | 2048 |"), or its column (ParlAI's "total_train_updates")
TABLE_STEPS = (
    "step",
    "steps",
    "total_timesteps",
    "timesteps",
    "nupdates",
    "global_step",
    "total_train_updates",
)


def steps_in_tables(parsed: Parsed) -> None:
    """Number the records of tables by the step row (or column) each holds, where no record has a
    step marker and every one holds the same step row, whole and rising: an alphabetical table
    writes that row among the others (``time/total_timesteps``), so the block's rows were merged
    before it was known."""
    if not parsed.rows or any(row.step is not None for row in parsed.rows):
        return
    named = {k.rsplit("/", 1)[-1]: k for k in parsed.rows[0].metrics}  # "time/total_timesteps" too
    key = next((named[k] for k in TABLE_STEPS if k in named), None)
    steps = [as_step(row.metrics.get(key)) for row in parsed.rows] if key else []
    if not steps or None in steps or any(b <= a for a, b in pairwise(steps)):
        return
    for row, step in zip(parsed.rows, steps, strict=True):
        row.step = step
        del row.metrics[key]
    parsed.rows = [row for row in parsed.rows if row.metrics]


def _epochs_printed_within(parsed: Parsed) -> None:
    """A loop that prints its epoch on each line it logs within the epoch (``Epoch 3: loss 2.14``
    … ``Epoch 3: loss 2.09``): where every record with a step has it from an epoch's line and two
    records in a row or more repeat an epoch with the same names and other values, the records
    are indexed in order, each keeping its epoch; read on their epoch they would merge, a later
    value replacing the one before (a spike, a climb within the epoch)."""
    stepped = [row for row in parsed.rows if row.step is not None]
    repeats = [
        b
        for a, b in pairwise(stepped)
        if a.step == b.step and a.metrics.keys() == b.metrics.keys() and a.metrics != b.metrics
    ]
    # the repeats' own markers first: a log of another counter (ranks' copies of a step) is
    # passed over without reading the marker of each of its records again
    if len(repeats) < 2 or not all(_epoch_marked(row.raw) for row in (stepped[0], *repeats[:8])):
        return
    if not all(_epoch_marked(row.raw) for row in stepped):
        return
    for row in stepped:
        row.metrics.setdefault("epoch", row.step)
        row.step = None
    parsed.notes.append(
        f"the epoch repeats on records of the same metrics (a loop that prints several lines an epoch): "
        f"its {len(stepped)} records are indexed in order, each keeping its epoch"
    )


def _epochs_opened(rows: list[Row]) -> None:
    """A loop that opens each epoch with a line of its learning rate alone (DARTS's ``epoch 49 lr
    1.023679e-03``) and then counts its reports within the epoch (``train 000 …``, ``train 050
    …``): such a line is a banner, not a step. Each stepped record is read in the epoch of the
    opening line above it (one above the first opening: a paste that starts within an epoch), and
    the opening's rate joins the first record under it; the counter that starts over is then
    counted on across epochs, not read as a second run. Not where another record's step is an
    epoch too (NeRF's ``==> Start Training Epoch 9, lr=…`` before its ``Finished Epoch 9, loss=…``)."""
    opening = [row.step is not None and _opens_epoch(row) for row in rows]
    if not any(opening):
        return
    others = [row for row, opens in zip(rows, opening, strict=True) if row.step is not None and not opens]
    if not others or any(_epoch_marked(row.raw) for row in others):
        return
    first = rows[opening.index(True)].step
    epoch, rate = (first - 1 if first else None), {}
    for row, opens in zip(rows, opening, strict=True):
        if opens:
            epoch, rate = row.step, row.metrics
        elif row.step is not None:
            if epoch is not None:
                row.metrics.setdefault("epoch", epoch)
            row.metrics, rate = {**rate, **row.metrics}, {}
    rows[:] = [row for row, opens in zip(rows, opening, strict=True) if not opens]


def _opens_epoch(row: Row) -> bool:
    """Whether a record is an epoch's line that ends on its learning rate and says nothing else
    (not flair's ``EPOCH 1: lr 0.1000 - bad epochs 0``, which closes the epoch)."""
    if len(row.metrics) != 1 or canonical("generic", next(iter(row.metrics))) != S.LR:
        return False
    found = marker(row.raw)
    return (
        found is not None
        and found[2].re is _EPOCH_LINE
        and _RATE_ALONE.fullmatch(row.raw, found[2].end()) is not None
    )


_RATE_ALONE = re.compile(rf"\W*(?:lr|learning[ _]rate)\W*(?:{NUMBER})\W*", re.IGNORECASE)


def _epoch_marked(raw: str) -> bool:
    """Whether the record's step came from an epoch's own line (``Epoch 3: …``, ``Epoch [3/20], …``)."""
    found = marker(raw)
    return found is not None and (found[2].re is _EPOCH_LINE or found[2].re is _EPOCH_OUT_OF)


def _merge_runs(rows: list[Row]) -> list[Row]:
    """Consecutive rows of one step (or none) with no name in common as one row: one metric a
    line (``iteration 10: lbl: …``), a table of a step's stats under its banner. A caffe net
    output joins its iteration whatever its name, and its value wins: the iteration line's
    ``loss`` is a running mean over ``average_loss`` iterations, the output this iteration's own."""
    out: list[Row] = []
    for row in rows:
        last = out[-1] if out else None
        if (
            last is not None
            and (row.step is None or row.step == last.step)
            and (not (row.metrics.keys() & last.metrics.keys()) or _is_caffe_output(row.raw))
        ):
            last.metrics.update(row.metrics)
            last.raw += "\n" + row.raw
        else:
            out.append(row)
    return out


def _is_caffe_output(raw: str) -> bool:
    return "net output #" in raw and _CAFFE_OUTPUT.search(raw) is not None


def canonical_names(framework: str | None, metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics under canonical names: the framework's table first, then the generic one; of two
    names for one canonical metric the first keeps it, the other its own name."""
    return dict(zip(_canonical_keys(framework, tuple(metrics)), metrics.values(), strict=True))


@lru_cache(maxsize=1 << 12)  # a log's records repeat one or a few key lists
def _canonical_keys(framework: str | None, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The names ``keys`` are kept under, in order (a name given twice: the later value wins, as
    a later assignment would). The HF Trainer's end-of-run summary (``train_runtime`` beside its
    ``train_loss``, the run's mean) keeps its names: its loss is no step's."""
    if "train_runtime" in keys:
        return keys
    names: list[str] = []
    for key in keys:
        name = (framework and canonical(framework, key)) or canonical("generic", key) or key
        names.append(name if name not in names else key)
    return tuple(names)


_LETTER = re.compile(r"[A-Za-z_]")
_CLOCK = re.compile(r"[A-Za-z_]\w*: \d+(?::\d+)+")  # mmengine's "eta: 1:07:12"


def template(line: str) -> _template.Template | None:
    """The template of an mmengine ``Iter(train) [i/n]`` line, for the bulk path of
    :mod:`~moescope.analyze.readers._template`.

    The line is cut as :func:`record` cuts it; a ``name: number`` piece becomes a value, a piece
    without letters (a time stamp) or a clock (``eta: 1:07:12``) any digits, as no digits make a
    field of those, and any other piece stays as written when it holds no field. ``None`` for a
    line of another shape, or whose reading could turn on what its numbers are."""
    found = marker(line)
    if found is None or found[2].re is not MARKS[0][1] or RAY_PREFIX.match(line) or "%|" in line:
        return None
    cut = found[2].start()
    rest = line[:cut] + " | " + line[found[2].end() :]  # as record() joins them
    parts, keys, edge = [], [], 0
    for sep in [*_SPLIT.finditer(rest), None]:
        end = sep.start() if sep else len(rest)
        if end > edge:
            piece = _piece(rest[edge:end], rest[end : end + 1], keys)
            if piece is None or (edge < cut + 3 and end > cut) or (keys and end <= cut):
                return None  # a piece astride the marker, or a value before it (group 1 is the step)
            parts.append(piece)
        if sep is not None:
            parts.append(_literal(sep.group(), sep.start(), cut, MARKS[0][1].pattern))
            edge = sep.end()
    if not keys:
        return None
    return _template.Template(re.compile("".join(parts)), tuple(keys), "mmengine")


def _literal(text: str, start: int, cut: int, mark: str) -> str:
    """``text`` (from ``start`` in the joined line) as a pattern, ``mark`` where :func:`record`
    put `` | `` in place of the marker (from ``cut``, three characters)."""
    head, tail = text[: max(cut - start, 0)], text[max(cut + 3 - start, 0) :]
    return re.escape(head) + (mark if start <= cut < start + len(text) else "") + re.escape(tail)


def _piece(raw: str, after: str, keys: list[str]) -> str | None:
    """The pattern of one piece of a record line (``keys`` takes the name of a value), or
    ``None`` where the piece holds a field that would stay the same on every line."""
    piece = raw.strip(" :,-")
    simple = _SIMPLE.fullmatch(piece)
    if simple and plain_number(simple.group("value")) is not None:
        if after == "." or not re.fullmatch(_template.VALUE, simple.group("value")):
            return None  # "5. " ends a sentence where "nan. " does not
        lead = len(raw) - len(raw.lstrip(" :,-"))
        start, end = lead + simple.start("value"), lead + simple.end("value")
        keys.append(simple.group("key"))
        return re.escape(raw[:start]) + _template.value() + re.escape(raw[end:])
    if not _LETTER.search(raw) or _CLOCK.fullmatch(piece):
        return _template.loose(raw)
    return re.escape(raw) if not _piece_fields(piece) else None
