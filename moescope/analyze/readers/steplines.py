"""One line per step that starts with its step number: prime-rl, and trainers not listed.

prime-rl's trainer and orchestrator print (through loguru, behind torchrun's ``[default0]:``
when run with it)::

    10:01:02 SUCCESS Step 12 | Time: 3.21s | Loss: 0.0123 | Entropy: 0.53 | Mismatch KL: 0.0012
    | Grad. Norm: 0.41 | LR: 1.00e-06 | Throughput: 1234 tokens/s | MFU: 12.3% | Max Vio: 0.82
    10:00:55 SUCCESS Step 12 | Time: 30.2s | Reward: 0.4123 | Seq. Length: 512.3 tokens/sample

(newer trainers drop the colons and print the time bare: ``Step 12 |   3.21s | Loss 0.0123``).
The trainer's and the orchestrator's line of one step are merged. Any other trainer that prints
``step N[/M]`` and then ``name value`` fields separated by ``|``, ``,`` or `` - ``
(``step 10/100 | loss 0.51 | grad_norm 1.2 | lr 1e-5``, ``Step 3: loss=0.5, reward=0.2``, DeepSpeed's
pipeline engine's ``steps: 227 loss: 7.4369 iter time (s): 34.995``) is read
the same way; where ``iter N`` comes right before ``step M`` (litgpt logs every micro-batch as
``iter 1151 step 144: loss 1.70, iter time: …``), the iteration, which advances every line, is
the step and ``M`` is kept as ``optimizer step`` (:mod:`moescope.analyze.readers._fields`); the
framework is guessed from the names
(DeepSpeed-Chat's ``epoch: 0|step: 3|ppo_ep: 1|act_loss: …``, NeMo Automodel's ``step 8 | epoch 0
| loss 0.78 | grad_norm 1.70``, torchtune's ``Step 1 | loss:2.08 lr:2e-05``), and names its table
lacks are read through the ``generic`` one (``loss``, ``grad_norm``, ``lr``, ``reward``, …). A step
line that ends in ``:`` over a Python dict printed on the lines below (the TF Model Garden
controller's ``train | step: 140 | … | output:``) takes that dict's metrics. A line
without a step whose names are metrics (DeepSpeed-Chat's ``average reward score: 0.2``) joins the
step before it; DeepSpeed's fp16 overflow lines go on the step line after them, as in
:mod:`moescope.analyze.readers.megatron` (``optim/skipped``, ``optim/loss_scale``,
``optim/loss_scale_tried``).
"""

from __future__ import annotations

import re

from moescope import schema as S
from moescope.analyze.readers import megatron
from moescope.analyze.readers._fields import fields
from moescope.analyze.readers._rows import Parsed, Row, scan
from moescope.analyze.readers._text import INT, NUMBER, LogFile
from moescope.analyze.readers.alerts import said
from moescope.analyze.readers.keymap import FRAMEWORK_TABLES, MARKERS, guess_beyond_generic
from moescope.analyze.readers.records import canonical_names, is_metric, pairs, record, unprose
from moescope.analyze.readers.trl import dict_over_lines

_TABLES = tuple(name for name in FRAMEWORK_TABLES if name != "prime-rl")
_ITER = re.compile(rf"(?<![\w/])iter(?:ation)?\s*+(?:[:=#]\s*+)?({INT})\s+$", re.IGNORECASE)
OPTIMIZER_STEP = "optimizer step"  # the coarser counter of a line that also names its iteration
# "steps:" (plural) only where a line starts with it (DeepSpeed's pipeline engine): keras-rl's
# "episode steps: 144" inside a record is an episode's length, not the step
STEP = re.compile(
    rf"(?:^\s*steps|(?<![\w/])step)\s*+(?:[:=#]\s*+)?({INT})(?:\s*/\s*{INT})?(?![\w.%])\s*[|,:\-]?",
    re.IGNORECASE,
)


_PER_STEP_TIME = re.compile(rf"\bStep {INT} per-step time {NUMBER}s\s*$")  # TF OD API's model_lib_v2
_EPOCH = re.compile(rf"(?<![\w/])epoch\s*+(?:[:=#]\s*+)?({INT})(?:\s*/\s*{INT})?(?![\w.])", re.IGNORECASE)


def _fields_after_step(line: str) -> tuple[int, dict] | None:
    """The line's step and its fields; a finer ``iter N`` counter printed before ``step M`` (litgpt's
    ``iter 1151 step 144: loss 1.70``, one line per micro-batch) is the step, ``M`` kept as a field;
    an epoch printed before the step (``Epoch 2, Step 0, Loss: …``) is kept as ``epoch``, since
    such a step may count within its epoch (:func:`~moescope.analyze.readers._rows.steps_across_epochs`);
    a metric a key map knows printed before the step is the step's too (insightface's
    ``Speed 218.82 samples/sec   Loss nan   Epoch: 0   Global Step: 14750``)."""
    line = unprose(line)  # "Loss at step 100 is 2.31": no metric "is"
    match = STEP.search(line)
    if match is None:
        return None
    found = fields(line[match.end() :])
    if not found:
        return None
    if match.start() > 0:
        before = pairs(line[: match.start()])  # split at runs of spaces too
        found = {**{k: v for k, v in before.items() if is_metric(k) and k not in found}, **found}
    epoch = _EPOCH.search(line, 0, match.start())
    if epoch is not None and "epoch" not in found:
        found["epoch"] = int(epoch.group(1))
    finer = _ITER.search(line, 0, match.start())
    if finer is None:
        return int(match.group(1)), found
    return int(finer.group(1)), {**found, OPTIMIZER_STEP: int(match.group(1))}


def _folded(metrics: dict, pending: list[megatron.Overflow]) -> dict:
    """A step's fields with the overflows printed before its line, under the canonical names."""
    if not pending:
        return metrics
    found = megatron.as_canonical(megatron.overflow_fields(pending))
    pending.clear()
    return {**metrics, **found}


def _announced(lines: list[str], i: int) -> tuple[dict, int] | None:
    """The dict a step line ending in ``:`` announces on the lines below it (the TF Model Garden
    controller's ``train | step: 140 | steps/sec: 0.1 | output:`` over ``{'learning_rate': …,``
    … ``'training_loss': 0.47}``, hiertext#6), or the TF Object Detection API's ``Step 100 per-step
    time 0.527s`` over its losses' dict (``{'Loss/classification_loss': 0.5,`` … behind absl's
    prefix, one pair a line): its metrics and the index after it."""
    if i + 1 >= len(lines):
        return None
    if lines[i].rstrip().endswith(":"):
        return dict_over_lines(lines, i + 1) if lines[i + 1].lstrip().startswith("{") else None
    return dict_over_lines(lines, i + 1) if _PER_STEP_TIME.search(lines[i]) else None


def is_record(line: str) -> bool:
    """``step N`` followed by at least one ``name value`` field."""
    return _fields_after_step(line) is not None


def read(log: LogFile) -> Parsed:
    """One row per step line; lines of the same step (trainer and orchestrator) merge, and the
    DeepSpeed overflow lines printed before a step line are folded into it; a step line that is
    the trainer's own warning (:mod:`~moescope.analyze.readers.alerts`) gives what it says."""
    pending: list[megatron.Overflow] = []

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        if megatron.is_overflow(lines[i]):
            event, end = megatron.overflow_event(lines, i)
            pending.append(event)
            return [], end
        found = _fields_after_step(lines[i])
        alert = said(lines[i]) if found else None
        if found and alert:  # the trainer's own warning on its step: what it says, not its fields
            return [Row(found[0], {**alert, S.ALERTS: lines[i].strip()}, lines[i], i + 1)], i + 1
        if found is None:  # a metric line without a step (DeepSpeed-Chat's reward line) joins its step
            loose = record(lines[i])
            return (
                None
                if loose is None or loose[0] is not None
                else ([Row(None, loose[2], lines[i], i + 1)], i + 1)
            )
        step, metrics = found
        output = _announced(lines, i)
        end = output[1] if output else i + 1
        metrics = {**metrics, **output[0]} if output else metrics
        return [Row(step, _folded(metrics, pending), "\n".join(lines[i:end]), i + 1)], end

    parsed = scan(log.lines, parse_at)
    if parsed.rows:
        late = megatron.leftovers(pending, parsed.rows, parsed.notes, after="step line")
        parsed.rows += [Row(row.step, megatron.as_canonical(row.metrics), row.raw) for row in late]
    keys = {key for row in parsed.rows for key in row.metrics}
    if keys & MARKERS["prime-rl"]:
        parsed.framework = parsed.keymap = "prime-rl"
        return parsed
    parsed.framework = guess_beyond_generic(keys, _TABLES)
    for row in parsed.rows:
        row.metrics = canonical_names(parsed.framework, row.metrics)
    parsed.keymap = "moescope"
    return parsed
