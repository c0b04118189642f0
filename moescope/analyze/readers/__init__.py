"""Training logs of many RL frameworks, read into moescope's canonical trace form.

A failed run's evidence comes in whatever its framework wrote: verl's console or JSONL file,
TRL / HF Trainer's ``trainer_state.json`` or console, Megatron-LM iteration lines with DeepSpeed
overflow lines, ms-swift and ROLL JSON lines, TensorBoard event files (OpenRLHF, NeMo-RL, slime),
OpenRLHF's progress-bar postfixes, prime-rl's ``Step N | …`` lines (and any trainer's ``step N``
lines of ``name value`` fields), NeMo-RL's console blocks, a snapshot of metrics pasted one per
line, a W&B run summary, a notebook's progress table, a user's printed top-k expert ids, the
simple column files of a deployment guide, any line that attaches numbers to metric names
(mmengine / XTuner, NeMo 2.0, torchtune, tqdm postfixes, home-made loops: ``records``), or just
any text with NaNs in it. What users paste is tolerated: rank labels, terminal wraps, a sentence
before the log, several runs one after another (``run=``).
:func:`read_log` turns each into a :class:`~moescope.traces.Trace` that the diagnosis reads:

- ``header``: ``{"kind": "header", "format": <name>, "source": <path>, "framework": <name or None>}``;
- ``steps``: ``{"step": N, <metrics>, "raw": <the text the step came from>}`` in step order, with
  foreign keys renamed to canonical ones (:data:`KEY_MAP`) and the rest kept as logged; a key
  that is absent stays absent, NaN stays NaN and a logged ``null`` stays ``None``;
- ``notes``: what the reader had to decide (duplicate steps merged, rows without a step,
  skipped lines, a second format in the same file).

Lines between the records where the framework itself warns (Megatron's NaN checks, DeepSpeed
overflows, PyTorch's anomaly mode) are folded into their steps (:mod:`~moescope.analyze.readers.alerts`).

A large log that is nothing but one format's step lines (verl's console, Megatron's iteration
lines, mmengine's ``Iter(train)`` lines) is read a column at a time instead, to the same trace
(:mod:`~moescope.analyze.readers.vectorized`); any other log is read line by line.

Bad input — a missing path, an empty or binary file, a log with no step a reader recognises —
raises a :class:`~moescope.errors.MoescopeError` whose message names the problem and the fix.

Examples
--------
>>> import tempfile, pathlib, math
>>> log = pathlib.Path(tempfile.mkdtemp()) / "train.log"
>>> _ = log.write_text("(TaskRunner pid=7) step:1 - actor/entropy_loss:0.52 - actor/grad_norm:nan\\n")
>>> trace = read_log(log)
>>> trace.header["format"], trace.steps[0]["actor/entropy"], math.isnan(trace.steps[0]["actor/grad_norm"])
('verl-console', 0.52, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from moescope.analyze.readers import (
    alerts,
    columns,
    jsonl,
    keyvalues,
    megatron,
    openrlhf,
    plain,
    records,
    steplines,
    table,
    tensorboard,
    topk,
    trl,
    vectorized,
    verl,
    wandb,
)
from moescope.analyze.readers._rows import Parsed, assemble, split_runs, steps_across_epochs
from moescope.analyze.readers._text import MAX_LINE, LogFile
from moescope.analyze.readers.detect import detect_format, line_kind, sniff
from moescope.analyze.readers.hints import RATIO_LEVEL, RECOMPUTE, ratio_level, recompute
from moescope.analyze.readers.keymap import KEY_MAP
from moescope.errors import MoescopeError
from moescope.traces import Trace

READERS: dict[str, Callable[[LogFile], Parsed]] = {
    "moescope": jsonl.read_moescope,
    "verl-console": verl.read,
    "verl-jsonl": jsonl.read_verl,
    "trainer-state": trl.read_state,
    "trl-console": trl.read_console,
    "jsonl": jsonl.read_flat,
    "roll": jsonl.read_roll,
    "megatron": megatron.read,
    "openrlhf-console": openrlhf.read,
    "step-lines": steplines.read,
    "tensorboard": tensorboard.read,
    "entropy-log": columns.read_entropy,
    "expert-load": columns.read_expert_load,
    "topk-indices": topk.read,
    "wandb-summary": wandb.read,
    "step-table": table.read,
    "records": records.read,
    "key-values": keyvalues.read,
    "plain": plain.read,
}
FORMATS: tuple[str, ...] = tuple(READERS)

__all__ = ["FORMATS", "KEY_MAP", "detect_format", "read_log", "read_runs"]


def read_log(
    path: str | Path, format: str | None = None, *, num_experts: int | None = None, run: int = -1
) -> Trace:
    """Read a training log into a :class:`~moescope.traces.Trace`.

    Parameters
    ----------
    path
        A log file, a ``trainer_state.json`` (or the checkpoint directory holding it), or a
        TensorBoard event file or directory.
    format
        One of :data:`FORMATS` to skip detection (``"verl-console"``, ``"megatron"``, …).
    num_experts
        The model's routed experts per layer, for an ``expert-load`` log: dead experts are then
        counted among all of them, not only among the ids the log mentions.
    run
        Which run to read when the log holds several pasted one after another (the step counter
        starts over): 0 the first, -1 (the default) the last. :func:`read_runs` reads them all.
    """
    fast = vectorized.read(Path(path), format, _reference)  # a large log of one line shape
    if fast is not None:
        return fast
    log, format, parsed, notes = _parse(Path(path), format, num_experts)
    runs = _runs(parsed)
    if len(runs) > 1:
        if not -len(runs) <= run < len(runs):
            raise MoescopeError(
                f"the log holds {len(runs)} runs; pass run= from 0 to {len(runs) - 1}, or -1."
            )
        starts = ", ".join(str(r.rows[0].line) for r in runs[1:])
        notes.append(
            f"the log holds {len(runs)} runs pasted one after another (the step counter starts over at line "
            f"{starts}); read run {run % len(runs)} of them (pass run=0 … {len(runs) - 1} to read another)"
        )
    return _trace(log, format, runs[run % len(runs)], Path(path), notes)


def read_runs(path: str | Path, format: str | None = None, *, num_experts: int | None = None) -> list[Trace]:
    """Every run of a log, each its own :class:`~moescope.traces.Trace`, in the order pasted.

    A user comparing two attempts pastes both logs into one file; each run (it ends where the
    step counter starts over) is read as :func:`read_log` reads a log of one run, with a note
    that says where it starts. A log of one run gives one trace. Parameters as in
    :func:`read_log`.
    """
    fast = vectorized.read(Path(path), format, _reference)  # one run: its steps only rise
    if fast is not None:
        return [fast]
    log, format, parsed, notes = _parse(Path(path), format, num_experts)
    runs = _runs(parsed)
    if len(runs) == 1:
        return [_trace(log, format, parsed, Path(path), notes)]
    return [
        _trace(
            log,
            format,
            part,
            Path(path),
            [
                *notes,
                f"run {i} of the {len(runs)} pasted one after another: from line {part.rows[0].line or 1}",
            ],
        )
        for i, part in enumerate(runs)
    ]


def _parse(path: Path, format: str | None, num_experts: int | None) -> tuple[LogFile, str, Parsed, list[str]]:
    """The log read by its reader: the file, its format, the records found and the notes so far."""
    log = LogFile(path, num_experts=num_experts)
    others: list[tuple[int, str]] = []  # other formats the file has lines of
    if format is None:
        found = sniff(log)
        format = found.format
        dominant = found.counts[format]
        others = [
            (n, f)
            for f, n in found.counts.items()
            if f != format and n >= max(2, dominant / 10) and not (f == "megatron" and _all_overflows(log, n))
        ]
    elif format not in READERS:
        raise MoescopeError(f"unknown log format {format!r}; use one of {', '.join(FORMATS)}.")
    elif not log.path.exists():
        raise MoescopeError(f"{log.path} does not exist; pass the path of a training log.")
    if log.path.is_dir() and format != "tensorboard":
        state = log.path / "trainer_state.json"
        if format != "trainer-state" or not state.is_file():
            raise MoescopeError(f"{log.path} is a directory; pass the {format} log file in it.")
        log = LogFile(state)
    parsed = READERS[format](log)
    # a format whose lines this reader read too (a step line's dict below it, hiertext#6) needs no note
    unread = {line_kind(log.lines[n - 1]) for n in parsed.skipped} if others else set()
    notes = [
        f"the file also has {n} {f} lines; read them with format={f!r}" for n, f in others if f in unread
    ]
    return log, format, parsed, notes


def _reference(log: LogFile, format: str) -> Trace:
    """The line reader's trace of ``log`` in ``format``: what the fast path's rows are checked
    against (:mod:`~moescope.analyze.readers.vectorized`)."""
    return _trace(log, format, READERS[format](log), log.path, [])


def _all_overflows(log: LogFile, megatron_lines: int) -> bool:
    """Whether the lines detection counted as Megatron's are all DeepSpeed overflow lines, which
    a log of another format reads into its steps (:mod:`~moescope.analyze.readers.alerts`)."""
    return sum(1 for line in log.lines if megatron.is_overflow(line)) >= megatron_lines


def _trace(log: LogFile, format: str, parsed: Parsed, path: Path, notes: list[str]) -> Trace:
    """The trace of one run's records, with the framework's warnings and the setup hints read in."""
    if parsed.skipped:  # a text log: the framework's warning lines among the non-records
        parsed = alerts.fold(parsed, log.lines)
    trace = assemble(parsed, format, path)
    said = ratio_level(log.lines) if format != "tensorboard" else None
    if said is not None:
        trace.header[RATIO_LEVEL] = said[0]
        notes = [
            *notes,
            f"line {said[1]} sets sequence-level ratios (GSPO): a high clip fraction is expected there, "
            "not judged",
        ]
    recomputed = recompute(log.lines) if format != "tensorboard" else None
    if recomputed is not None:
        trace.header[RECOMPUTE] = True
        notes = [
            *notes,
            f"line {recomputed} turns activation recompute on: Megatron before its fix (Megatron-LM#1330) "
            "counts the load-balancing loss twice then, so it is read halved",
        ]
    trace.notes.extend(notes)
    if log.cut:
        trace.notes.append(f"{log.cut} line(s) longer than {MAX_LINE >> 20} MiB were read only in part")
    return trace


def _runs(parsed: Parsed) -> list[Parsed]:
    """``parsed`` split into the runs pasted one after another (itself alone for a log of one):
    each with its own rows and the skipped lines between its first line and the next run's."""
    steps_across_epochs(parsed)
    runs = split_runs(parsed.rows)
    if len(runs) == 1:
        return [parsed]
    out = []
    for index, rows in enumerate(runs):
        lo = rows[0].line or 0 if index else 0
        hi = runs[index + 1][0].line or 0 if index + 1 < len(runs) else None
        skipped = [n for n in parsed.skipped if n >= lo and (hi is None or n < hi)]
        out.append(replace(parsed, rows=rows, skipped=skipped, notes=list(parsed.notes)))
    return out
