"""Megatron-LM iteration lines and DeepSpeed fp16 overflow lines.

Megatron (and the consoles of slime, NeMo-RL's mcore path, ms-swift ``megatron``) prints one
``|``-separated line per logging interval::

     [2025-03-01 10:00:00] iteration       10/     100 | consumed samples: 640 | …
     | lm loss: 1.234E+00 | loss scale: 1.0 | grad norm: 0.752 | number of skipped iterations: 0 |

Every ``key: value`` field is read (E-notation included). Megatron prints an averaged loss
only ``if avg >= 0.0``, so a NaN loss *vanishes* from its line: it is kept absent — never
invented — and a note names the steps where a loss the other lines carry is missing, for the
diagnosis to treat as a suspected non-finite loss; not a line whose every iteration was skipped
(fp16 loss-scale calibration at the start), which has no loss to average. A line with no loss at
all though its ``number of skipped iterations`` shows it made updates (0 skipped, or fewer than
its interval) has lost its loss the same way, however many lines the paste has: it is marked
``health/loss_missing`` (Megatron-DeepSpeed's ``number of nan iterations`` stays 0 there).

DeepSpeed's ``[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing
to 32768`` (its older fused optimizer's ``[Rank 0] Overflow detected. Skipping step. Attempted loss
scale: 1, reducing to 1``, apex's ``Gradient overflow. Skipping step, … reducing loss scale to
32768.0``, its older ``Using dynamic loss scale of 4096.0`` after ``Grad overflow on iteration 8``;
fairseq's ``NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0``),
possibly wrapped over two lines, carries no step number. It is put on the **next** iteration
line: Megatron prints an iteration's line after that iteration's optimizer step, so overflows
printed before a line happened in the interval it reports. On that step ``number of skipped
iterations`` (→ ``optim/skipped``) becomes the larger of the line's count and the number of
overflows (counted on one rank; every rank prints its own), with a note where they disagree —
Megatron's counter stayed 0 in real overflow cases — and ``loss scale`` (→ ``optim/loss_scale``)
is the reduced scale when the line has none. Overflows after the last iteration line go on the
step after it; a log with overflow lines only (OpenRLHF, plain DeepSpeed) has one step per
overflow, indexed in order, unless the line names its iteration or is glued behind a progress bar
(``  0%|▋ | 98/24128 [00:40<2:40:10,  2.50it/s][…] [deepscale] OVERFLOW! …``): then it is on that
step, and one that names none goes on the next step named (or, after the last, on that one).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from moescope import schema as S
from moescope.analyze.readers._rows import Parsed, Row, listing, scan, wholly_skipped
from moescope.analyze.readers._text import (
    BAR_HEAD,
    INT,
    NUMBER,
    LogFile,
    gather,
    number_or_none,
    parse_number,
    plain_number,
)
from moescope.analyze.readers.keymap import KEY_MAP

# "iteration" at a word boundary, the literal first (as verl.STEP_START: a search skips to it)
ITERATION = re.compile(rf"iteration(?<=\biteration)\s+({INT})\s*/\s*\d+\s*\|")
_NEMO = re.compile(r"Training epoch\s+\d+\s*,\s*iteration")  # NeMo 2.0's line: read as records
# apex's older FP16_Optimizer prints "Grad overflow on iteration 8" and then the reduced scale,
# "Using dynamic loss scale of 4096.0": the event read is the second (DeepSpeed's fused optimizer
# prints the first before its own "Overflow detected." line, which is the one read there)
# fairseq: "NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0"
# (older: "| WARNING: overflow detected, setting loss scale to: 0.25")
OVERFLOW = re.compile(
    r"OVERFLOW!|overflow!|Gradient overflow\.|Overflow detected\.|Using dynamic loss scale of"
    r"|overflow detected,(?: ignoring gradient,)? setting loss scale to"
)
SCALES = re.compile(
    rf"Attempted\s*loss\s*scale:\s*({NUMBER})\s*,\s*reducing\s*to\s*({NUMBER})|reducing\s*loss\s*scale\s*to\s*({NUMBER})"
    rf"|Using\s*dynamic\s*loss\s*scale\s*of\s*({NUMBER})|setting\s*loss\s*scale\s*to:\s*({NUMBER})"
)
_RANK = re.compile(rf"\bRank\s*({INT})", re.IGNORECASE)
_NAMED_STEP = re.compile(rf"\b(?:iteration|step)[\s:=]+({INT})")
GLUED_BAR = re.compile(rf"^\s*{BAR_HEAD}")  # a bar the line opens with
_FIELD = re.compile(r"\s*([^|:]*[^|:\s])\s*:\s*(\S+)\s*")
_PARTIAL_FIELD = re.compile(r"[^|:]*(?::\s*\S*)?\s*")
SKIPPED_KEY = "number of skipped iterations"
SCALE_KEY = "loss scale"
ATTEMPTED_KEY = "attempted loss scale"
OVERFLOW_KIND = "deepspeed-overflow"  # a detection vote: the format that folds these lines takes it
ENGINE_KIND = "deepspeed-engine"  # a detection vote: the trainer's own records take it, if any
# DeepSpeed's engine every steps_per_print: "[Rank 0] step=10, skipped=0, lr=[1e-05], mom=[…]"
_ENGINE = re.compile(r"\bstep=\d+, skipped=\d+, lr=\[")


@dataclass
class Overflow:
    rank: int | None
    attempted: Any
    reduced: Any
    step: int | None
    raw: str
    line: int | None = None  # 1-based, where the line starts


def is_record(line: str) -> bool:
    """An iteration line or an overflow line (the start of one, if wrapped)."""
    return _iteration(line) is not None or is_overflow(line)


def kind(line: str) -> str | None:
    """``megatron`` for an iteration line, ``ENGINE_KIND`` for DeepSpeed's engine line (``step=10,
    skipped=0, lr=[…]``), ``OVERFLOW_KIND`` for a DeepSpeed overflow line,
    unless it is glued behind a progress bar whose postfix logs metrics (ColossalAI's ``1/8614
    [00:00<…, loss=265.25, lr=2.5e-05][deepscale] OVERFLOW! …``): that line is a record, its
    overflow folded into the bar's step by the records reader (here its loss was lost)."""
    if _iteration(line) is not None:
        return "megatron"
    if _ENGINE.search(line):
        return ENGINE_KIND
    return OVERFLOW_KIND if is_overflow(line) and not _BAR_WITH_FIELDS.search(line) else None


def is_overflow(line: str) -> bool:
    """A DeepSpeed / apex overflow line (the start of one). Every match holds ``OVERFLOW``,
    ``overflow`` or apex's ``loss scale of``: looking for those first is several times faster
    than the search alone."""
    marked = "OVERFLOW" in line or "verflow" in line or "scale of" in line
    return marked and OVERFLOW.search(line) is not None


def _iteration(line: str) -> re.Match[str] | None:
    """Megatron's ``iteration i/ n |`` (not NeMo 2.0's ``Training epoch E, iteration i/n |``)."""
    match = ITERATION.search(line)
    return None if match is None or _NEMO.search(line) else match


_BAR_WITH_FIELDS = re.compile(BAR_HEAD + r"[^\]]*,\s*[A-Za-z_][\w/.]*=")  # a tqdm postfix's "key="
_BARE_KEY = re.compile(r"[A-Za-z][A-Za-z_ ()-]*")  # words: no counter ("iteration 700/ 3000")


def fields(text: str) -> dict[str, Any]:
    """The ``key: value`` fields of a ``|``-separated line; a value that is no number stays text.
    A field without its colon (older forks: ``| lm loss 6.758929E+00 | loss scale 64.0 |``) is
    read where its last word is a number."""
    out: dict[str, Any] = {}
    for part in text.split("|"):  # str methods, not a pattern: a log has millions of fields
        key, colon, value = part.partition(":")
        if not colon:
            key, _, value = part.strip().rpartition(" ")
            key = key.strip()
            if _BARE_KEY.fullmatch(key) and (number := number_or_none(value)) is not None:
                out[key] = number
            continue
        key, value = key.strip(), value.strip()
        if not key:
            continue
        number = plain_number(value)  # the common field, read at once (a number it reads has no space)
        if number is not None:
            out[key] = number
        elif value and len(value.split(maxsplit=1)) == 1:
            try:
                out[key] = parse_number(value)
            except ValueError:
                out[key] = value
    return out


def _iteration_fits(joined: str, piece: str) -> bool:
    if is_record(piece):
        return False
    parts = joined[ITERATION.search(joined).end() :].split("|")
    done = all(_FIELD.fullmatch(p) or not p.strip() for p in parts[:-1])
    return done and _PARTIAL_FIELD.fullmatch(parts[-1]) is not None


def _has_scales(text: str) -> bool:
    return SCALES.search(text) is not None


def _overflow_fits(joined: str, piece: str) -> bool:
    return not is_record(piece) and _has_scales(joined)  # a wrapped overflow line joins only to complete


def overflow_event(lines: list[str], i: int) -> tuple[Overflow, int]:
    """The overflow line at ``lines[i]`` (rejoined if wrapped) and the index after it."""
    text, end = gather(lines, i, _has_scales, _overflow_fits)
    scales = SCALES.search(text)
    attempted, reduced = (scales.group(1), reduced_scale(scales)) if scales else (None, None)
    rank, step = _RANK.search(text), _NAMED_STEP.search(text) or GLUED_BAR.match(text)
    return Overflow(
        int(rank.group(1)) if rank else None,
        parse_number(attempted) if attempted else None,
        parse_number(reduced) if reduced else None,
        int(step.group(1)) if step else None,
        "\n".join(lines[i:end]),
        i + 1,
    ), end


def reduced_scale(scales: re.Match[str]) -> str | None:
    """The loss scale an overflow line (a :data:`SCALES` match) says it reduced to."""
    return scales.group(2) or scales.group(3) or scales.group(4) or scales.group(5)


def _apply(metrics: dict[str, Any], events: list[Overflow], step: int | None, notes: list[str]) -> None:
    """Fold overflow events into one step's Megatron-named metrics."""
    found = overflow_fields(events)
    count = found[SKIPPED_KEY]
    logged = metrics.get(SKIPPED_KEY)
    if isinstance(logged, int | float) and logged < count:
        notes.append(
            f"step {step}: {count} DeepSpeed overflow(s) but the line counts {logged} skipped; kept {count}"
        )
    metrics[SKIPPED_KEY] = max(count, logged) if isinstance(logged, int | float) else count
    if SCALE_KEY in found:
        metrics.setdefault(SCALE_KEY, found[SCALE_KEY])
    if ATTEMPTED_KEY in found:
        metrics[ATTEMPTED_KEY] = found[ATTEMPTED_KEY]


def overflow_fields(events: list[Overflow]) -> dict[str, Any]:
    """One step's overflows under Megatron's names: how many (on one rank; every rank prints
    its own), the scale they left and the scale the last one tried."""
    found: dict[str, Any] = {SKIPPED_KEY: max(Counter(e.rank for e in events).values())}
    reduced = [e.reduced for e in events if e.reduced is not None]
    if reduced:
        found[SCALE_KEY] = reduced[-1]
    if events[-1].attempted is not None:
        found[ATTEMPTED_KEY] = events[-1].attempted
    return found


def as_canonical(metrics: dict[str, Any]) -> dict[str, Any]:
    """Overflow fields under Megatron's names (:func:`overflow_fields`) as the canonical keys,
    for readers of other formats that fold DeepSpeed's overflow lines into their records."""
    names = KEY_MAP["megatron"]
    return {names[k]: v for k, v in metrics.items()}


def read(log: LogFile) -> Parsed:
    """Iteration lines, with the overflow lines before each folded into it."""
    pending: list[Overflow] = []
    notes: list[str] = []
    last: list[Overflow | None] = [None]  # the overflow line before, with no iteration line since

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        if is_overflow(lines[i]):
            event, end = overflow_event(lines, i)
            event = last[0] = _tried_where_left(event, last[0])
            pending.append(event)
            return [], end
        match = _iteration(lines[i])
        if match is None:
            return None
        last[0] = None
        text, end = gather(lines, i, lambda t: t.rstrip().endswith("|"), _iteration_fits)
        metrics = fields(text[match.end() :])
        raw = lines[i] if end == i + 1 and not pending else "\n".join([e.raw for e in pending] + lines[i:end])
        if pending:
            _apply(metrics, pending, int(match.group(1)), notes)
            pending.clear()
        return [Row(int(match.group(1)), metrics, raw, i + 1)], end

    parsed = scan(log.lines, parse_at)
    parsed.rows += leftovers(pending, parsed.rows, notes)
    parsed.framework = "megatron" if any(ITERATION.search(r.raw) for r in parsed.rows) else "deepspeed"
    parsed.keymap = "megatron"  # overflow lines are folded in under Megatron's names
    lines = [r for r in parsed.rows if ITERATION.search(r.raw)]
    idle = wholly_skipped([r.step for r in lines], [r.metrics.get(SKIPPED_KEY) for r in lines])
    parsed.notes += notes + _missing_losses(lines, idle)
    _mark_lossless(lines, idle)
    return parsed


def _tried_where_left(event: Overflow, before: Overflow | None) -> Overflow:
    """``event`` with the scale it tried, where its line does not say it (apex's ``reducing loss
    scale to 1.0``) and the overflow line just before, of its rank, left the scale where this one
    leaves it: the scale tried was kept, the scaler at its minimum (NeMo's QuartzNet, ``reducing
    loss scale to 1.0`` step after step beside ``Loss is NaN or inf``)."""
    if (
        event.attempted is None
        and event.reduced is not None
        and before is not None
        and (before.rank, before.reduced) == (event.rank, event.reduced)
    ):
        return replace(event, attempted=event.reduced)
    return event


def leftovers(
    pending: list[Overflow], rows: list[Row], notes: list[str], after: str = "iteration line"
) -> list[Row]:
    """Rows, under Megatron's names, for overflows no ``after`` (the reader's step line) followed:
    on the step after the last one read, or each on its own where none was."""
    if not pending:
        return []
    if rows:
        step = max((row.step for row in rows if row.step is not None), default=-1) + 1
        notes.append(f"overflow lines after the last {after} were put on step {step}")
        groups = [(step, pending)]
    else:
        groups = _on_named_steps(pending)
    out = []
    for step, events in groups:
        metrics: dict[str, Any] = {}
        _apply(metrics, events, step, notes)
        out.append(Row(step, metrics, "\n".join(e.raw for e in events), events[0].line))
    return out


def _on_named_steps(pending: list[Overflow]) -> list[tuple[int | None, list[Overflow]]]:
    """Overflows each on its own step; where some name theirs, one that names none joins the
    next that does (or, after the last, that one), as a record takes the warnings printed
    before it."""
    named = [i for i, e in enumerate(pending) if e.step is not None]
    if not named:
        return [(None, group) for group in _one_per_rank(pending)]
    owner = [next((j for j in named if j >= i), named[-1]) for i in range(len(pending))]
    return [(pending[j].step, [e for e, o in zip(pending, owner, strict=True) if o == j]) for j in named]


def _one_per_rank(events: list[Overflow]) -> list[list[Overflow]]:
    """Overflows that name no step, grouped a step at a time: every rank prints its own line for
    one step (``Rank 4 … Rank 6 … Rank 0 Skipping step``), so a rank seen again, or a line that
    names no rank, starts the next step."""
    groups: list[list[Overflow]] = []
    ranks: set[int] = set()
    for event in events:
        if not groups or event.rank is None or event.rank in ranks:
            groups.append([])
            ranks = set()
        groups[-1].append(event)
        if event.rank is not None:
            ranks.add(event.rank)
    return groups


def _mark_lossless(lines: list[Row], idle: set[int]) -> None:
    """Mark the iteration lines that made updates yet log no loss (see the module's docstring):
    a skipped count below the line's interval (``idle``: the steps whose every iteration was
    skipped), or 0 where a lone line has no interval to tell. Whether a line logs a loss is
    decided once per list of keys (a log has a few)."""
    logs_loss: dict[tuple[str, ...], bool] = {}
    for row in lines:
        skipped = row.metrics.get(SKIPPED_KEY)
        known = isinstance(skipped, int | float) and (skipped == 0 or len(lines) > 1)
        keys = tuple(row.metrics)
        if keys not in logs_loss:
            logs_loss[keys] = any(_is_loss(k) for k in keys)
        if known and row.step not in idle and not logs_loss[keys]:
            row.metrics[S.LOSS_MISSING] = 1


def _is_loss(key: str) -> bool:
    return key.endswith("loss") and key != SCALE_KEY


def _missing_losses(lines: list[Row], idle: set[int]) -> list[str]:
    """Notes for loss fields that vanish from some iteration ``lines`` (Megatron hides NaN losses),
    but from the ``idle`` steps, which made no update to log a loss of."""
    shapes = Counter(tuple(r.metrics) for r in lines)  # a few key lists, counted once each
    counts: Counter[str] = Counter()
    for keys, n in shapes.items():
        counts.update(dict.fromkeys((k for k in keys if _is_loss(k)), n))
    notes = []
    for key, n in counts.items():
        missing = [r.step for r in lines if key not in r.metrics and r.step not in idle]
        if missing and n >= len(missing):
            notes.append(
                f"'{key}' is missing from step {listing(missing)} though other lines log it: "
                "Megatron omits a NaN (or negative) loss, so treat those steps as suspected non-finite"
            )
    return notes
