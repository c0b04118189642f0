"""Which format a log is, from its content (and a file name where content cannot tell).

Whole-file shapes are recognised first: a directory or file name with ``tfevents`` (or a file
whose first record is a TensorBoard ``brain.Event``) → ``tensorboard``; a directory with a
``trainer_state.json``, or a JSON document with ``log_history`` → ``trainer-state``; a first line
that is a moescope trace header → ``moescope``. Otherwise every line is classified — verl's
``step:N - ``, Megatron's ``iteration N/ M |`` and DeepSpeed's ``OVERFLOW!`` (which count for
step lines instead where a file has those and no iteration line) and its engine's ``step=N,
skipped=K, lr=[…]`` (which count for the file's most common other format), a Python dict, a
JSON object (verl's ``{"step","data"}``, ROLL's ``metrics_tag:``, a flat one), a progress bar
with a ``key=value`` postfix (OpenRLHF), printed top-k expert ids, a ``Step N |
name value`` line (prime-rl and trainers not listed), whitespace columns, a W&B summary line,
any other line with a step marker and a field (``records``) — and the format with most lines wins,
unless lines that name a metric and a number without a step outnumber it: then ``records``;
a notebook's ``Step | …`` progress table is recognised before the vote, its rows being bare
numbers. The scan stops once enough lines are recognised, so a long preamble (verl prints its
whole config first) costs a pass, not a guess.
Columns are ``entropy-log`` or ``expert-load`` by the file name when it says (``entropy_log.txt``,
``expert_load.log``), else by their shape, but for bare numbers in a file no name announces as
an entropy log: two a line a loop's ``print(step, loss)`` (``records``), more a table without
its header (``step-table``). A text log with none of these is ``jsonl`` when it
holds JSON objects printed over several lines (``json.dumps(..., indent=2)``), else ``key-values``
when it has ``name: value`` lines (a pasted snapshot, NeMo-RL's console blocks, rlkit's
``name   value`` table rows) at least as many as its other lines mentioning NaN/Inf, and,
against lines that attach numbers to metric names, at least as many naming a metric (a config
dump outvotes no metrics line), else
``records`` when lines without a step name a metric and a number, else ``plain`` when it has
lines mentioning NaN/Inf.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import moescope.analyze.readers.alerts as alerts
import moescope.analyze.readers.columns as columns
import moescope.analyze.readers.jsonl as jsonl
import moescope.analyze.readers.keyvalues as keyvalues
import moescope.analyze.readers.megatron as megatron
import moescope.analyze.readers.openrlhf as openrlhf
import moescope.analyze.readers.plain as plain
import moescope.analyze.readers.records as records
import moescope.analyze.readers.steplines as steplines
import moescope.analyze.readers.table as table
import moescope.analyze.readers.tensorboard as tensorboard
import moescope.analyze.readers.topk as topk
import moescope.analyze.readers.trl as trl
import moescope.analyze.readers.verl as verl
import moescope.analyze.readers.wandb as wandb
from moescope.analyze.readers._text import LogFile, number_or_none
from moescope.errors import MoescopeError

ENOUGH = 500  # recognised lines after which the vote is settled
_LINE_KINDS = (
    jsonl.kind,
    lambda line: "verl-console" if verl.is_record(line) else None,
    megatron.kind,
    lambda line: "trl-console" if trl.is_record(line) else None,
    lambda line: "openrlhf-console" if openrlhf.is_record(line) else None,
    lambda line: "topk-indices" if topk.is_record(line) else None,
    columns.kind,  # before step lines: "step=7 layer=1 expert=3 tokens=30" is an expert-load row
    lambda line: "step-lines" if steplines.is_record(line) else None,
    lambda line: "wandb-summary" if wandb.is_record(line) else None,
)  # then the fallback of any step-like line, records (:func:`_vote`)


@dataclass(frozen=True)
class Sniff:
    """The detected format and, for line formats, how many lines each candidate had."""

    format: str
    counts: Counter[str]


def detect_format(path: str | Path) -> str:
    """The name of ``path``'s log format (one of :data:`moescope.analyze.readers.FORMATS`)."""
    return sniff(LogFile(Path(path))).format


def sniff(log: LogFile) -> Sniff:
    """Detect the format of ``log``; a file that is no training log raises a :class:`MoescopeError`."""
    path = log.path
    if not path.exists():
        raise MoescopeError(
            f"{path} does not exist; pass the path of a training log, a trainer_state.json or a "
            "TensorBoard event file or directory."
        )
    if path.is_dir():
        return Sniff(_directory(path), Counter())
    if tensorboard.MARK in path.name or b"brain.Event:" in log.data[:64]:
        return Sniff("tensorboard", Counter())
    if trl.is_trainer_state(log.head()):
        return Sniff("trainer-state", Counter())
    first = next((line for line in log.lines if line.strip()), "")
    if jsonl.is_trace_header(first):
        return Sniff("moescope", Counter())
    if table.header(log.lines) is not None:  # a notebook's progress table: its rows are bare numbers
        return Sniff("step-table", Counter())
    counts, loose = _vote(log.lines)
    if counts and counts.most_common(1)[0][1] >= loose:
        return Sniff(_columns_by_name(path, counts.most_common(1)[0][0], log.lines), counts)
    if counts:  # more records without a step than lines of the winning format: those are the log
        return Sniff("records", counts + Counter({"records": loose}))
    spread = jsonl.spread_objects(log.lines)  # JSON objects printed over several lines each
    if spread:
        return Sniff("jsonl", Counter({"jsonl": spread}))
    read = [(line, keyvalues.snapshot_field(line)) for line in log.lines]
    fields = [found for _, found in read if found is not None]
    rest = [line for line, found in read if found is None]
    unread = [line for line in rest if records.record(line) is None]
    loose = len(rest) - len(unread)
    mentions = sum(1 for line in rest if plain.is_record(line))
    banners = sum(1 for line in unread if records.is_banner(line)) if loose else 0  # the records' steps
    if fields and _snapshot_votes(fields, loose) >= max(loose + banners, mentions):
        return Sniff("key-values", Counter({"key-values": len(fields)}))
    if loose:
        return Sniff("records", Counter({"records": loose}))
    if table.headerless(log.lines) is not None:  # a table whose header row the paste left out
        return Sniff("step-table", Counter())
    if mentions:
        return Sniff("plain", counts)
    if any(alerts.said(line) for line in log.lines):  # a framework's warnings alone: each is a record
        return Sniff("records", Counter())
    raise MoescopeError(
        f"{path} has no step this reader recognises: no line attaches a number to a metric name; pass "
        "format=... (see moescope.analyze.readers.FORMATS) or check it is a training log."
    )


def _snapshot_votes(fields: list[tuple[str, object]], loose: int) -> int:
    """The ``name: value`` lines that vote for a snapshot: all of them, or, against lines that
    attach numbers to metric names, only those naming a metric themselves: a config dump's
    ``max_epochs: 100`` must not outvote the one metrics line pasted above it."""
    return sum(1 for name, _ in fields if records.is_metric(name)) if loose else len(fields)


def _directory(path: Path) -> str:
    if tensorboard.event_files(path):
        return "tensorboard"
    if (path / "trainer_state.json").is_file():
        return "trainer-state"
    raise MoescopeError(
        f"{path} is a directory with no TensorBoard event file or trainer_state.json in it; "
        "pass the log file itself."
    )


def _kind(line: str) -> str | None:
    """The first line format of :data:`_LINE_KINDS` that reads ``line``."""
    return next((k for kind in _LINE_KINDS if (k := kind(line))), None)


def line_kind(line: str) -> str | None:
    """The format the vote counts ``line`` for (``records`` for any other line with a step)."""
    return _kind(line) or ("records" if records.is_stepped(line) else None)


def _vote(lines: list[str]) -> tuple[Counter[str], int]:
    """Lines per format, in order of first appearance (ties go to the earlier format), and the
    record lines without a step (``<time>:INFO: train loss:nan``) that no format took.

    Those are counted apart: they vote for ``records`` only against a winner with fewer lines,
    so that one stray line a format reads (``133 <time>:INFO: acc 0.74 - f1 0.02`` is a column
    row to the entropy log) does not outvote ten consistent records (sequence_tagging#47)."""
    counts: Counter[str] = Counter()
    loose = 0
    for line in lines:
        found = _kind(line)
        if found is None and (read := records.record(line)) is not None:
            found = "records" if read[0] is not None else None
            loose += found is None
        if found:
            counts[found] += 1
            if counts.total() >= ENOUGH:
                break
    return _engine_counted(_overflows_counted(counts)), loose


def _overflows_counted(counts: Counter[str]) -> Counter[str]:
    """DeepSpeed's overflow lines vote for the format that folds them into its steps: Megatron's
    reader where the file has an iteration line (or no other format: it also reads them alone),
    else step lines (DeepSpeed-Chat prints them between its ``step: N|…`` lines) where it has
    some, else the file's most common other format, whose skipped lines
    :mod:`~moescope.analyze.readers.alerts` folds (Chinese-LLaMA-Alpaca#534: five overflow lines
    outvoted the one HF ``{'loss': …}`` record between them, which Megatron's reader skipped)."""
    if megatron.OVERFLOW_KIND not in counts:
        return counts
    others = [name for name in counts if name not in (megatron.OVERFLOW_KIND, "megatron")]
    target = "step-lines" if "step-lines" in counts else max(others, key=counts.__getitem__, default="")
    target = "megatron" if "megatron" in counts or not target else target
    out: Counter[str] = Counter()
    for name, count in counts.items():
        out[target if name == megatron.OVERFLOW_KIND else name] += count
    return out


def _engine_counted(counts: Counter[str]) -> Counter[str]:
    """DeepSpeed's engine lines (``step=10, skipped=0, lr=[1e-05], mom=[…]``, every
    ``steps_per_print``) vote for the trainer's own records where the file has some: HF's
    ``{'loss': nan, …}`` between them held the run's loss, which a tie lost to the engine's
    bookkeeping; alone, they are step lines (their skipped count is the overflows')."""
    engine = counts.pop(megatron.ENGINE_KIND, 0)
    if engine:
        counts[max(counts, key=counts.__getitem__, default="step-lines")] += engine
    return counts


def _columns_by_name(path: Path, best: str, lines: list[str]) -> str:
    """Columns by the file's name where it says; else by their shape, but for bare numbers that
    no name announces as an entropy log: two a line are a loop's ``print(step, loss)`` (``records``
    reads the number as the loss), more a table without its header (columns numbered, the one
    rising on every row the step), not an entropy in the last column; a line or two of other text
    among them (``tail lcurve.out`` above DeePMD's learning curve) changes nothing."""
    if best not in ("entropy-log", "expert-load"):
        return best
    name = path.name.lower()
    if "entropy" in name:
        return "entropy-log"
    if "expert" in name or "load" in name:
        return "expert-load"
    rows = [line.split() for line in lines[:200] if line.strip() and not line.lstrip().startswith("#")]
    numeric = [row for row in rows if _bare_numbers(row)]  # a command or a sentence pasted above is no row
    if best != "entropy-log" or len(numeric) < 2 or len(numeric) < len(rows) - 2:
        return best
    rows = numeric
    if all(len(row) == 2 for row in rows):
        return "records"
    return "step-table" if table.headerless(lines) is not None else best


def _bare_numbers(tokens: list[str]) -> bool:
    """Whether every token is a number with no label (``12``, ``0.52``; not ``entropy=0.52``)."""
    return all(number_or_none(token) is not None for token in tokens)
