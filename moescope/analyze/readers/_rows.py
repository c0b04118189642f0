"""From the records a reader found to a :class:`~moescope.traces.Trace`.

Every reader produces :class:`Row` s (a step number or ``None``, the metrics under the
framework's own names, the raw text) and hands them to :func:`assemble`, which owns the rules
all formats share, so they hold the same everywhere:

- keys are renamed through :mod:`moescope.analyze.readers.keymap`; unknown keys keep their names;
- values are kept as read: a missing key stays missing, NaN stays ``float('nan')`` and a
  logged ``null`` stays ``None``;
- a log without any step number is indexed in order from 0; a row without a step in a log
  that has them belongs to the step before it (an evaluation or summary line printed after the
  training line of its step), or to the first step when it comes before all of them, and adds
  only what its step did not log: a summary's averages (MetricLogger's ``Averaged stats:`` after
  an epoch's last step) must not replace the step's own values, a NaN among them;
- several rows for one step (verl's validation line and training line) are merged, a later
  value winning, their raw texts joined;
- steps come out in step order, each as ``{"step": N, **metrics, "raw": text}``; a logged key
  that is itself called ``step`` or ``raw`` is kept as ``logged_step`` / ``logged_raw``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from moescope.analyze.readers._text import as_step, quoted_number
from moescope.analyze.readers.keymap import rename
from moescope.errors import MoescopeError
from moescope.schema import ACTOR_LOSS, ALERTS, LOSS_SCALE, NONFINITE, RAW, STEP
from moescope.traces import Trace

STEP_KEYS = (
    "step",
    "global_step",
    "global_step/max_steps",
    "train/global_step",
    "trainer/global_step",
    "current_steps",  # LLaMA-Factory's trainer_log.jsonl
    "iteration",
    "_step",
)


@dataclass(slots=True)  # a large log has a million of them
class Row:
    """One record as found: ``step`` is ``None`` when the record does not say."""

    step: int | None
    metrics: dict[str, Any]
    raw: str
    line: int | None = None  # 1-based line the record starts on, for notes


@dataclass
class Parsed:
    """What a reader found; ``skipped`` are the 1-based numbers of non-empty lines it did not use."""

    rows: list[Row]
    framework: str | None
    notes: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    lines: int = 0  # non-empty lines read
    header: dict[str, Any] = field(default_factory=dict)
    keymap: str | None = None  # the KEY_MAP table to rename with, when not the framework's own


def flat_row(record: dict[str, Any], raw: str, line: int | None, step: int | None = None) -> Row:
    """A row from a flat ``{key: value}`` record; its step comes from the first step-like key, and
    a number written as a string is read as the number (:func:`quoted_number`)."""
    metrics = {k: quoted_number(v) for k, v in record.items() if k != STEP}
    return Row(logged_step(record) if step is None else step, metrics, raw, line)


def steps_from_epochs(parsed: Parsed) -> bool:
    """Number ``parsed``'s rows by the epoch counter every one logs (``epoch``, ``Epoch``, an episode's),
    where it is a whole number rising from row to row, and say so; whether it did. A loop that
    logs once an epoch names no other step."""
    epochs = _epoch_counters(parsed.rows)
    if not epochs or any(a >= b for a, b in pairwise(epochs)):
        return False
    for row, epoch in zip(parsed.rows, epochs, strict=True):
        row.step = epoch
    which = "its one record's" if len(epochs) == 1 else "each record's"
    parsed.notes.append(f"no step named: {which} epoch counter is its step")
    return True


_EPOCH_KEYS = ("epoch", "Epoch", "episode", "Episode")  # an RL loop's episode counts as its epoch does


def _epoch_counters(rows: list[Row]) -> list[int] | None:
    """The whole-number epoch (or episode) counter each of ``rows`` logs, or ``None`` where one
    does not."""
    epochs = [next((row.metrics[k] for k in _EPOCH_KEYS if k in row.metrics), None) for row in rows]
    whole = all(isinstance(e, int) and not isinstance(e, bool) for e in epochs)
    return epochs if whole else None


def epochs_as_steps(parsed: Parsed) -> None:
    """A loop that logs once an epoch (``epoch: 3451 loss: nan``, DINO's ``{"train_loss": …,
    "epoch": 201}``) and names no step: its epoch counter is the step, when every record has one,
    a whole number rising from record to record (records of a loop that logs within an epoch
    repeat it and stay indexed in order)."""
    if len(parsed.rows) >= 2 and all(r.step is None for r in parsed.rows):
        steps_from_epochs(parsed)


def steps_across_epochs(parsed: Parsed) -> bool:
    """Number ``parsed``'s steps across epochs where the step counter starts over each time the
    epoch counter every stepped row logs rises (``Epoch 2, Step 0``, DeepSpeed-Chat's ``epoch: 1|step:
    0|``), and say so; whether it did. Such a step counts within its epoch: the restart is the next
    epoch of one run, not a second run pasted after the first (whose epoch does not rise)."""
    stepped = [(row, row.step) for row in parsed.rows if row.step is not None]
    epochs = _epoch_counters([row for row, _ in stepped])
    if epochs is None or len(epochs) < 2 or any(b < a for a, b in pairwise(epochs)):
        return False
    if len({step for _, step in stepped}) == 1 and all(b > a for a, b in pairwise(epochs)):
        for (row, _), epoch in zip(stepped, epochs, strict=True):  # a bar an epoch, ended at one count
            row.step = epoch
        parsed.notes.append("every record ends its epoch's bar at the same count: the epoch is the step")
        return True
    # a step at or below the one before starts the count over, but for the same step of the same
    # epoch again (a step's second line: mindyolo's "Epoch 35/300, Step 4/4, step time: …")
    restarts = [
        i
        for i in range(1, len(stepped))
        if stepped[i][1] < stepped[i - 1][1]
        or (stepped[i][1] == stepped[i - 1][1] and epochs[i] != epochs[i - 1])
    ]
    if not restarts or any(epochs[i] == epochs[i - 1] for i in restarts):
        return False
    # an epoch's count goes on from the last count before it: its first record one step on where
    # it counts from 0, its own count on where that is a print interval's ("iters: 100" of the epoch)
    offset, counted, starts = 0, -1, set(restarts)
    for i, (row, step) in enumerate(stepped):
        if i in starts:
            offset = counted + (1 if step == 0 else 0)
        row.step = counted = step + offset
    parsed.notes.append(
        f"the step counter starts over as the epoch rises (line {stepped[restarts[0]][0].line or '?'}): "
        "steps are counted on across epochs"
    )
    return True


def logged_step(record: dict[str, Any]) -> int | None:
    """The step a record logs itself under the first of :data:`STEP_KEYS` it holds as a whole
    number (``global_step=1.000`` too), else ``None``."""
    found = (as_step(record.get(k)) for k in STEP_KEYS)
    return next((s for s in found if s is not None), None)


def scan(lines: list[str], parse_at: Callable[[list[str], int], tuple[list[Row], int] | None]) -> Parsed:
    """Walk ``lines``: ``parse_at(lines, i)`` returns the rows starting at line ``i`` and the
    index after them, or ``None`` for a line that is no record (counted as skipped). Blank
    lines and ``#`` comments are passed over."""
    rows: list[Row] = []
    skipped: list[int] = []
    i, nonblank = 0, 0
    while i < len(lines):
        if _passed_over(lines[i]):
            i += 1
            continue
        got = parse_at(lines, i)
        if got is None:
            skipped.append(i + 1)
            nonblank, i = nonblank + 1, i + 1
            continue
        found, end = got
        rows += found
        nonblank += 1 if end <= i + 1 else sum(1 for line in lines[i:end] if line.strip())
        i = max(end, i + 1)
    return Parsed(rows, None, skipped=skipped, lines=nonblank)


def _passed_over(line: str) -> bool:
    """A blank line or a ``#`` comment (tested without copying the line, as most are neither)."""
    first = line[:1]
    if first == "#" or not first:
        return True
    return first.isspace() and (line.isspace() or line.lstrip().startswith("#"))


def split_runs(rows: list[Row]) -> list[list[Row]]:
    """The runs of a log that holds several pasted one after another: a run ends where the step
    counter starts over, at or below the first step of the run (a run resumed from a checkpoint
    goes back only to that checkpoint, and stays one run). Rows without a step stay with the
    record before them."""
    runs: list[list[Row]] = [[]]
    first = last = None
    for row in rows:
        if row.step is not None:
            if last is not None and row.step < last and row.step <= first and len(runs[-1]) > 1:
                runs.append([])
                first = None
            first = row.step if first is None else first
            last = row.step
        runs[-1].append(row)
    return runs


def assemble(parsed: Parsed, fmt: str, path: Path) -> Trace:
    """The trace of ``parsed``: steps assigned, duplicates merged, keys canonical, notes written.

    The rows' metrics move into the trace (each row's ``metrics`` is left empty).
    """
    if not parsed.rows:
        raise MoescopeError(
            f"{path} has no step this reader recognises as {fmt}; pass format=... with the right "
            "format (see moescope.analyze.readers.FORMATS) or check it is a training log."
        )
    notes = list(parsed.notes)
    steps = _assign_steps(parsed.rows, path, notes)
    table = parsed.keymap or parsed.framework
    merged: dict[int, dict[str, Any]] = {}
    repeated: dict[int, None] = {}  # in order of first repeat; a dict, as a log may repeat every step
    kept: set[str] = set()
    hidden: list[tuple[str, int | None]] = []  # a joined line's non-finite value its step logs finite
    placeholders: list[int | None] = []  # rows whose bar's loss=nan is Lightning's, unfilled by NeMo
    for step, row in zip(steps, parsed.rows, strict=True):
        if REDUCED_TRAIN_LOSS in row.metrics and _placeholder_loss(row.metrics):
            row.metrics = _without_placeholder(row.metrics)
            placeholders.append(row.line)
        metrics, lost = rename(table, row.metrics)
        metrics = _scale_from_log2(metrics)
        row.metrics = {}  # handed over: a large log's records are not held twice
        if STEP in metrics or RAW in metrics:  # a logged key of that name must not replace ours
            for reserved in (STEP, RAW):
                if reserved in metrics:
                    metrics[f"logged_{reserved}"] = metrics.pop(reserved)
        if lost:
            kept.update(lost)
        record = merged.get(step)
        if record is None:
            merged[step] = {STEP: step, **metrics, RAW: row.raw}
            continue
        if row.step is not None:  # an explicit step seen before, not a row that joined its step
            repeated[step] = None
            # a NaN that a later print of the step logs finite stays: a tqdm bar redrawn, another
            # rank's line
            metrics = {key: value for key, value in metrics.items() if not _hides(record.get(key), value)}
        else:  # joined the step before: adds to it, never replaces what the step logged
            lost = [
                (key, row.line)
                for key, value in metrics.items()
                if key in record and _hides(value, record[key])
            ]
            metrics = {key: value for key, value in metrics.items() if key not in record}
            if lost:  # the NaN was printed all the same: counted on the step, as a skipped line's is
                metrics[NONFINITE] = record.get(NONFINITE, 0) + len(lost)
                metrics[ALERTS] = "\n".join(filter(None, [record.get(ALERTS), row.raw]))
                hidden += lost
        raw = record.pop(RAW) + "\n" + row.raw
        record.update(metrics)
        record[RAW] = raw  # raw stays last
    if repeated:
        duplicates = list(repeated)
        notes.append(
            f"step {listing(duplicates)} appeared in more than one record (e.g. a validation line and a "
            "training line); merged them, a later value winning but never over a NaN/Inf"
        )
    if hidden:
        keys = listing(list(dict.fromkeys(key for key, _ in hidden)))
        lines = listing([line for _, line in hidden if line is not None]) or "?"
        notes.append(
            f"{keys} is NaN/Inf on line {lines}, a line without a step number that joined a step "
            "already logging it finite: the step keeps the finite value (a joining line never replaces one) "
            "and counts it non-finite (health/nonfinite)"
        )
    if placeholders:
        notes.append(
            f"the progress bar's loss=nan beside reduced_train_loss (line {placeholders[0] or '?'}) is "
            "Lightning's running loss, which NeMo's Megatron models leave unfilled: left out, "
            "reduced_train_loss read"
        )
    if kept:
        notes.append(
            f"{listing(sorted(kept))} kept their own names: another key of the step took the canonical one"
        )
    if parsed.skipped:
        notes.append(
            f"{len(parsed.skipped)} of {parsed.lines} non-empty lines are not "
            f"{'records' if fmt == 'records' else fmt + ' records'} and were skipped "
            f"(the first is line {parsed.skipped[0]})"
        )
    header = {
        **parsed.header,
        "kind": "header",
        "format": fmt,
        "source": str(path),
        "framework": parsed.framework,
    }
    return Trace(header=header, steps=[merged[s] for s in sorted(merged)], path=path, notes=notes)


def _placeholder_loss(metrics: dict[str, Any]) -> bool:
    """A bar's ``loss=nan`` beside a finite ``reduced_train_loss``: NeMo 1.x's Megatron models
    report their loss as that, and Lightning's own running ``loss`` in the bar stays NaN
    (aws-neuron/neuronx-nemo-megatron#28: ``loss=nan, … reduced_train_loss=3.910``)."""
    loss = metrics["loss"] if "loss" in metrics else metrics.get(ACTOR_LOSS)
    return isinstance(loss, float) and math.isnan(loss) and _finite(metrics.get(REDUCED_TRAIN_LOSS))


REDUCED_TRAIN_LOSS = "reduced_train_loss"


def _without_placeholder(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` without the bar's ``loss``; where a reader named it the loss already, the
    reduced loss takes that name."""
    if "loss" in metrics:
        return {key: value for key, value in metrics.items() if key != "loss"}
    out = {key: value for key, value in metrics.items() if key not in (ACTOR_LOSS, REDUCED_TRAIN_LOSS)}
    return {**out, ACTOR_LOSS: metrics[REDUCED_TRAIN_LOSS]}


LG_LOSS_SCALE = "lg_loss_scale"  # OpenAI's improved- and guided-diffusion log log2 of the fp16 scale


def _scale_from_log2(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` with the loss scale 2 ** ``lg_loss_scale`` where a record logs only its log2
    (SegDiff#20's table: ``lg_loss_scale -0.821``, a scale of 0.57 fallen from 2^20)."""
    lg = metrics.get(LG_LOSS_SCALE)
    if LOSS_SCALE in metrics or not _finite(lg):
        return metrics
    return {**metrics, LOSS_SCALE: 2.0 ** min(lg, 1024.0)}


def _hides(joined: Any, own: Any) -> bool:
    """A joined line's value that is not finite where the step's own is a finite number."""
    return _finite(own) and isinstance(joined, float) and not math.isfinite(joined)


def _finite(value: Any) -> bool:
    """A logged number (not a bool) that is finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _assign_steps(rows: list[Row], path: Path, notes: list[str]) -> list[int]:
    """The step of every row, by the rules in the module docstring."""
    if all(row.step is None for row in rows):
        notes.append(
            f"{path.name} gives no step numbers; its {len(rows)} records are indexed in order from 0"
        )
        return list(range(len(rows)))
    leading = next(i for i, row in enumerate(rows) if row.step is not None)  # rows before any step
    last = rows[leading].step
    out, orphans = [], []
    for row in rows:
        if row.step is None:
            orphans.append(row.line)
        else:
            last = row.step
        out.append(last)
    if orphans:
        where = listing([n for n in orphans if n is not None]) or "?"
        into = "the step before them" + (", or the first step where none came before" if leading else "")
        notes.append(f"{len(orphans)} records without a step number (line {where}) were merged into {into}")
    return out


def wholly_skipped(steps: list[int], skipped: list[Any]) -> set[int]:
    """The steps whose every iteration since the record before was skipped: the skipped count
    (Megatron's ``number of skipped iterations``) at least the gap in steps, the first record
    measured by the gap after it. Megatron averages a loss over the updates it made, so such an
    interval (fp16 loss-scale calibration) logs no loss at all."""
    gaps = [b - a for a, b in pairwise(steps)]
    return {
        step
        for i, (step, count) in enumerate(zip(steps, skipped, strict=True))
        if (gap := gaps[i - 1] if i else gaps[0] if gaps else None)
        and isinstance(count, int | float)
        and count >= gap
    }


def listing(items: list[Any], most: int = 8) -> str:
    """``1, 2, 3 and 4 more`` — short enough for a note."""
    shown = ", ".join(str(i) for i in items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")
