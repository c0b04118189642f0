"""Rows of numbers under a header row: the progress table HF Trainer (TRL, unsloth) draws in a
notebook, as users copy it out, and the tables other trainers print.

::

    Step | Training Loss | reward | reward_std | kl | entropy
    -- | -- | -- | -- | -- | --
    1 | -0.283600 | 13.437500 | 21.810942 | nan | 0
    2 | -0.149100 | 6.931818 | 14.526671 | nan | No Log

A header row whose first cell is ``Step`` (or ``steps``, ``iteration``, ``updates``, … as other
trainers print it: chainerrl's tab-separated ``steps episodes elapsed mean …``), then one row per
logging step whose first cell is the step; cells split at ``|``, tabs or runs of two or more
spaces (a copied HTML table pastes with tabs). ``No Log`` and empty cells are absent values.

A table without a step column is read too: a header row of names only (cut at ``|``, tabs or
runs of spaces), then rows of numbers only, as the width of the header — OpenAI baselines' PPO prints
one a iteration, a row per optimisation epoch (``pol_surr | pol_entpen | vf_loss | kl | ent``).
Its rows name no step and are indexed in order, unless a column is one (Stable Baselines'
``time/total_timesteps``). A CSV logger's file or paste (``progress.csv``, ``metrics.csv``,
``step,total_loss,mlm_loss``) is such a table, cut at its commas, an empty cell a column not
logged on that row. Column names are read as the Trainer logged
them — the HTML table prints ``completions / mean_length`` for ``completions/mean_length`` and
``Training Loss`` for ``loss`` — so both are put back before the key map (TRL's, then the
generic names) renames them.

YOLOv5 / v7 / ultralytics print a header over each epoch's row, the row ending in the epoch's
progress bar, and a validation table below it::

     Epoch   gpu_mem       box       obj       cls     total    labels  img_size
    41/299     65.1G       nan   0.01516         0       nan      1869       320: 100%|███| 729/729
               Class      Images      Labels           P           R      mAP@.5  mAP@.5:.95: 100%|███|

An ``Epoch`` header's rows start with ``e/E`` and hold as many whitespace-separated cells as the
header before the bar's ``:``; the epoch is the step (a bar redrawn on the same epoch is merged),
a cell with a unit (``65.1G``) is no value, and YOLOv5's loss columns ``box``, ``obj``, ``cls``
and ``total`` are named as the later versions name them (``box_loss``, …). Rows pasted above the
first header are read under it.

A table pasted without its header row (rows of numbers of one width behind whatever prefix the
logger wrote, cut at ``|``) is read with its columns numbered, the one of whole numbers rising on
every row its step; no metric is named, so only a non-finite cell is judged.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import pairwise
from typing import Any

from moescope.analyze.readers._rows import Parsed, Row, scan
from moescope.analyze.readers._text import INT, NUMBER, LogFile, number_or_none
from moescope.analyze.readers.keymap import guess_beyond_generic
from moescope.analyze.readers.records import canonical_names, mean_of, steps_in_tables

_CELLS = re.compile(r"\s*\|\s*|\t+|\s{2,}")
# the step column's name: HF's "Step", chainerrl's "steps", a loop's "iteration" or "updates",
# Chainer's PrintReport "epoch" (over rows of whole epochs, not YOLO's "e/E"), spaCy 3's "E" before
# its "#" (the epoch, then the step)
_HEADER = re.compile(
    r"^\s*+(?:\|\s*+)?(?:steps?|global_step|total_timesteps|timesteps|iter|iterations?|updates?|epoch|e(?=\s++#\s))"
    r"(?:\s*+[|,]|\s{2}|[^\S\t]*\t)",  # a bar or comma, two spaces, or a tab: each space read one way
    re.IGNORECASE,
)
_RULE = re.compile(r"^[\s|:\-=+]+$")
_EPOCH_HEADER = re.compile(r"^\s*epoch\s{2,}[A-Za-z_]", re.IGNORECASE)
_EPOCH_ROW = re.compile(rf"^\s*({INT})/{INT}\s+([^:]*?)\s*(?::|$)")
_STEP = re.compile(rf"^{INT}$")
_FINER_STEP = re.compile(r"iteration|iter|steps?|global_step|updates?|#", re.IGNORECASE)
_RENAMED = {"training loss": "loss", "validation loss": "eval_loss"}
_LETTER = re.compile(r"[A-Za-z_]")


def cells(line: str) -> list[str]:
    """The cells of a table line, without the empty ones its outer bars make; a CSV line's at its
    commas (empty ones kept: a column not logged on that row)."""
    if _csv(line):
        return [c.strip() for c in line.strip().split(",")]
    parts = _CELLS.split(line.strip())
    return [p for p in parts if p != ""] if line.strip().startswith("|") else parts


def _csv(line: str) -> bool:
    """A line of comma-separated values (a CSV logger's: Stable Baselines' ``progress.csv``,
    Lightning's ``metrics.csv``, ``step,total_loss,mlm_loss``), cut at nothing else."""
    return "," in line and "|" not in line and "\t" not in line and "  " not in line.strip()


def header(lines: list[str]) -> int | None:
    """The index of a header row followed by a row of its width, else ``None``: a ``Step | …``
    row over rows that start with a step, a ``|`` row of names over rows of numbers, or an
    ``Epoch`` header over ``e/E`` rows."""
    for i, line in enumerate(lines[:5000]):
        if _yolo_header(lines, i) or _transposed(lines, i) or _one_name_over_numbers(lines, i):
            return i
        stepped = _HEADER.match(line) is not None
        if not stepped and not _names_only(line):
            continue
        names = cells(line)
        trial = _trial_step(names)
        stepped, column = stepped or trial is not None, trial or 0
        rows = (_row_cells(x, len(names)) for x in lines[i + 1 : i + 4] if x.strip() and not _RULE.match(x))
        if len(names) >= 2 and any(
            _fits(r, stepped, column) and _width_fits(r, names, stepped) for r in rows
        ):
            return i
    return None


def _one_name_over_numbers(lines: list[str], i: int) -> bool:
    """Whether line ``i`` names one column, a number a line below it, three or more (a paste of an
    epoch's top-1 accuracies under ``Top-1``)."""
    if not _ONE_NAME.fullmatch(lines[i]) or number_or_none(lines[i]) is not None:  # "Nan" is a value
        return False
    below = [x for x in lines[i + 1 : i + 8] if x.strip()][:3]
    return len(below) == 3 and all(_ONE_NUMBER.fullmatch(x) for x in below)


_ONE_NAME = re.compile(r"\s*[A-Za-z][\w@/.\-]*(?: [A-Za-z][\w@/.\-]*){0,2}\s*")
_ONE_NUMBER = re.compile(rf"\s*(?:{NUMBER})\s*")


def _row_cells(line: str, width: int) -> list[str]:
    """The cells of a row under a header ``width`` names wide: without the clock printed after
    them or a comma ending a CSV row, and, aligned with spaces, split at every space where that
    gives the header's width (two columns one space apart: ParlAI's ``404.1 1.565e-31`` under
    ``gnorm        lr``)."""
    row = _clock_cut(cells(line), width)
    if _csv(line) and len(row) == width + 1 and not row[-1]:
        return row[:-1]  # a comma that ends every row opens no column (AdaAD's "…, Aug16-15:41:04,")
    if _space_aligned(line) and len(row) != width and len(split := line.split()) == width:
        return split
    return row


def _space_aligned(line: str) -> bool:
    """Whether a table's line is aligned with spaces alone (no bars, tabs or commas cut it)."""
    return "|" not in line and "\t" not in line and not _csv(line)


def _width_fits(row: list[str], names: list[str], stepped: bool) -> bool:
    """A row as wide as its header, or, under a step's header, narrower by the columns it does not
    log (Chainer's ``LogReport`` leaves its validation columns blank between evaluations)."""
    return len(row) == len(names) or (stepped and 2 <= len(row) < len(names))


def _aligned(header: str, line: str, width: int) -> list[str] | None:
    """The cells of a whitespace-aligned row that leaves some columns blank, each under the header
    column it starts below (Chainer prints every value from its column's first character); ``None``
    where two cells would fall under one column."""
    starts = [m.start() for m in _ALIGNED_CELL.finditer(header)]
    row = [""] * width
    for m in _ALIGNED_CELL.finditer(line):
        column = bisect_right(starts, m.start()) - 1
        if column < 0 or column >= width or row[column]:
            return None
        row[column] = m.group()
    return row


_ALIGNED_CELL = re.compile(r"\S+(?: \S+)*")  # a cell of a table aligned with spaces: two or more end it


def _transposed(lines: list[str], i: int) -> tuple[list[Row], int] | None:
    """A table turned on its side, as a PR or a report prints a few steps (NeMo-RL's ``| step | 1 |
    2 | … |`` over ``| reward | .406 | .441 | … |``): the header's cells after the first are the
    steps, each row below a metric named by its first cell; the rows of each step, the index after
    the table. ``None`` where line ``i`` is no such header over such a row."""
    steps = _step_cells(lines[i])
    if steps is None:
        return None
    by_step: dict[int, dict[str, Any]] = {}
    end = i + 1
    while end < len(lines) and (_RULE.match(lines[end]) or _metric_row(lines[end], len(steps))):
        if not _RULE.match(lines[end]):
            name, *values = _sideways_cells(lines[end])
            for step, value in zip(steps, values, strict=True):
                if step is not None and (number := _number(value)) is not None:
                    by_step.setdefault(step, {})[_name(name)] = number
        end += 1
    if not by_step:
        return None
    rows = [Row(step, metrics, "\n".join(lines[i:end]), i + 1) for step, metrics in by_step.items()]
    return rows, end


def _step_cells(line: str) -> list[int | None] | None:
    """The steps a sideways table's header names (``None`` for a cell that is no whole number, an
    ``→ eval@20``), where its first cell is a step column's name and two others are steps."""
    found = _sideways_cells(line)
    if len(found) < 3 or not _SIDEWAYS.fullmatch(found[0]):
        return None
    steps = [int(c) if _STEP.match(c) else None for c in found[1:]]
    return steps if steps.count(None) <= 1 and len(steps) >= 2 else None


def _sideways_cells(line: str) -> list[str]:
    """A sideways table's cells, cut at ``|`` or tabs only (a Markdown table, a copied one)."""
    if "|" not in line and "\t" not in line:
        return []
    parts = [p.strip() for p in re.split(r"\||\t", line.strip())]
    return [p for p in parts if p != ""] if line.strip().startswith("|") else parts


def _metric_row(line: str, width: int) -> bool:
    """A row of a sideways table: a name, then ``width`` cells, numbers among them."""
    found = _sideways_cells(line)
    return (
        len(found) == width + 1
        and _LETTER.match(found[0]) is not None
        and any(_number(c) is not None for c in found[1:])
    )


_SIDEWAYS = re.compile(r"steps?|iterations?|iter|epochs?|updates?", re.IGNORECASE)


def headerless(lines: list[str]) -> tuple[int, int] | None:
    """``(width, step column)`` of a table pasted without its header row (WeSpeaker's ``[ INFO :
    … ] - |       150|     16300|5.0113e-05|  0.2|    1.1553|    78.579|``): three rows or more of
    the same width, three cells or more, cut at ``|`` after whatever prefix the logger wrote, every
    cell a number, one column of whole numbers rising on every row (the step), or never falling
    where each rank of a multi-GPU run printed the row (WeSpeaker#396: ``|  149|  1000|…`` five
    times, then ``|  149|  1066|…``; of such columns the one with the most values, not the epoch's);
    else ``None``."""
    rows = [_unruled_cells(line) for line in lines[:5000] if line.strip()]
    rows = [row for row in rows if len(row) >= 3 and all(_cell_number(c) is not None for c in row)]
    widths = {len(row) for row in rows}
    if len(rows) < 3 or len(widths) != 1:
        return None
    width = widths.pop()
    columns = [[row[column] for row in rows] for column in range(width)]
    counted = [[_count(v) for v in values] for values in columns]
    counts = [c if None not in c else [] for c in counted]
    rising = next((k for k, c in enumerate(counts) if c and all(a < b for a, b in pairwise(c))), None)
    if rising is not None:
        return width, rising
    kept = [(len(set(c)), k) for k, c in enumerate(counts) if c and all(a <= b for a, b in pairwise(c))]
    most, column = max(kept, default=(0, 0))
    return (width, column) if most >= 2 else None


def _unruled_cells(line: str) -> list[str]:
    """The cells of a headerless table's row: cut at ``|`` after whatever prefix comes before the
    first, else at whitespace (``print(epoch, loss, acc)``) from the first cell that is a number or
    a count over its total (JDE's ``2020-02-09 16:22:54 [INFO]:    2/272    400/1963     0.647 …``,
    its logger's prefix passed over)."""
    if "|" in line:
        return _sideways_cells(line[line.index("|") :])
    cells = _BRACKETED_OR_WORD.findall(line) if "[" in line else line.split()
    first = next((k for k, cell in enumerate(cells) if _cell_number(cell) is not None), len(cells))
    return cells[first:]


# a cell split at whitespace, an array printed in brackets one (DeepXDE's "[1.22e-03, 2.16e-04]")
_BRACKETED_OR_WORD = re.compile(r"\[[^\]]*\]|\S+")
# a count over its total in a headerless row: JDE's epoch "2/272" and batch "400/1963", the count read
_COUNT_OF = re.compile(rf"({INT})/{INT}")


def _cell_number(cell: str) -> float | int | None:
    """A headerless row's cell as a number: a count over its total read as the count."""
    count = _COUNT_OF.fullmatch(cell)
    return int(count[1]) if count else _number(cell)


def _count(cell: str) -> int | None:
    """A whole-number cell's value, or a count over its total's count; ``None`` for any other cell."""
    count = _COUNT_OF.fullmatch(cell)
    return int(count[1]) if count else int(cell) if _STEP.match(cell) else None


def _headerless_rows(lines: list[str], i: int, shape: tuple[int, int]) -> tuple[list[Row], int] | None:
    """The row at line ``i`` of a table without its header: on its step column's count, the other
    cells under their column's number (``column 5``)."""
    if not lines[i].strip():
        return None
    row = _unruled_cells(lines[i])
    width, step = shape
    count = _count(row[step]) if len(row) == width else None
    if count is None:
        return None
    metrics = {
        f"column {k + 1}": v for k, c in enumerate(row) if k != step and (v := _cell_number(c)) is not None
    }
    return [Row(count, metrics, lines[i], i + 1)], i + 1


def _yolo_header(lines: list[str], i: int) -> bool:
    """Whether line ``i`` is an ``Epoch`` header over ``e/E`` rows (YOLO's), not over rows that
    open with a whole epoch (Chainer's ``epoch  main/loss …``, read as any step table)."""
    if not _EPOCH_HEADER.match(lines[i]):
        return False
    width = len(lines[i].split())
    return any(_epoch_row(x, width) for x in lines[i + 1 : i + 4])


def _epoch_row(line: str, width: int) -> tuple[int, list[str]] | None:
    """The epoch and cells of a row under an ``Epoch`` header ``width`` names wide, else ``None``."""
    match = _EPOCH_ROW.match(line)
    if match is None:
        return None
    values = match[2].split()
    return (int(match[1]), values) if len(values) == width - 1 else None


# a clock or a duration printed after a row's columns, under no name of its own: CT-GAN's "0.004051 |
# 100 | 6.248324 | 2 days, 12:04:16.416641" under "D_loss       acc     G_loss"
_CLOCK = re.compile(r"(?:\d+\s+days?,?\s*)?\d{1,2}:\d\d(?::\d\d(?:\.\d+)?)?")


def _clock_cut(row: list[str], width: int) -> list[str]:
    """``row`` without the clock printed after its ``width`` columns (none: as it is)."""
    return row[:width] if len(row) > width and _CLOCK.fullmatch(" ".join(row[width:])) else row


def _names_only(line: str) -> bool:
    """A row of two cells or more, cut at ``|``, tabs, runs of spaces or a CSV's commas, whose cells
    are all names (none a number): a header without a step (spaCy's ``LOSS      P       R       F``,
    TimeCycle's tab-separated ``Learning Rate\tTrain Loss\tTheta Loss``)."""
    if not ("|" in line or "\t" in line or "  " in line or "," in line) or _RULE.match(line):
        return False  # the substring tests first: every line of a log passes here
    found = cells(line)
    return len(found) >= 2 and all(_LETTER.match(c) and number_or_none(c) is None for c in found)


def _numbers_only(row: list[str]) -> bool:
    """Every cell a number, or empty (a CSV's column not logged on that row), or a time stamp
    (Lightning's ``metrics.csv`` with a ``created_at`` column), one a number at least."""
    numbers = [_number(c) for c in row]
    return any(v is not None for v in numbers) and all(
        v is not None or c == "" or _TIME_STAMP.fullmatch(c) for c, v in zip(row, numbers, strict=True)
    )


# a date, or a clock time with whatever date the logger glued to it (AdaAD's "Aug16-15:41:04")
_TIME_STAMP = re.compile(
    r"\d{4}-\d\d-\d\d(?:[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?)?|[\w\-/.]*\d\d:\d\d:\d\d(?:\.\d+)?"
)


def _number(cell: str) -> float | int | None:
    """A cell's number; a cell printed as an array (DeepXDE's ``[5.47e+03]``, one element a loss
    term) is the mean of its elements, as the records reader reads ``loss: [nan]``."""
    bracketed = cell[:1] == "[" and cell[-1:] == "]"
    return mean_of(cell[1:-1]) if bracketed else number_or_none(cell)


def _fits(row: list[str], stepped: bool, step_column: int = 0) -> bool:
    """Whether ``row`` is a data row under a header with (``stepped``) or without a step column;
    under a header that opens with a step's name, a row of numbers whose first is no whole number
    is read as one without (torchmd-net's ``metrics.csv``: ``epoch,lr,step,…`` over ``20.0,…``, its
    ``step`` column found among the others)."""
    step = row[step_column] if step_column < len(row) else ""  # a row cut short: no step
    return _numbers_only(row) or (stepped and _STEP.match(step) is not None)


def _trial_step(names: list[str]) -> int | None:
    """The column of the step in Ray Tune's status table (``| Trial name | status | loc | iter | … |``,
    a row a trial, its name, status and address no metrics), else ``None``."""
    lowered = [name.lower() for name in names]
    return lowered.index("iter") if lowered[:1] == ["trial name"] and "iter" in lowered else None


def _name(cell: str) -> str:
    name = re.sub(r"\s*/\s*", "/", cell.strip())
    return _RENAMED.get(name.lower(), name)


_YOLO_LOSSES = {"box", "obj", "cls", "total"}  # YOLOv5 / v7's columns; ultralytics 8 says box_loss


def _logged(names: list[str], values: list[str]) -> dict[str, Any]:
    """The cells that hold a number, by their column's name (``No Log``, empty cells: not logged)."""
    return {n: v for n, c in zip(names, values, strict=True) if (v := _number(c)) is not None}


def _epoch_names(line: str) -> list[str]:
    return [f"{name}_loss" if name.lower() in _YOLO_LOSSES else name for name in line.split()]


def _epoch_rows(lines: list[str], i: int, names: list[str]) -> tuple[list[Row], int] | None:
    """The row at line ``i`` under an ``Epoch`` header, on its epoch."""
    found = _epoch_row(lines[i], len(names))
    if found is None:
        return None
    epoch, values = found
    metrics = _logged(names[1:], values)
    return [Row(epoch, metrics, lines[i], i + 1)], i + 1


def read(log: LogFile) -> Parsed:
    """One row per table row under the header (a second header, another table, resets the names)."""
    first = header(log.lines)  # an Epoch header names the rows pasted above it too
    unnamed = headerless(log.lines) if first is None else None
    yolo = first is not None and _yolo_header(log.lines, first)
    names: list[str] = _epoch_names(log.lines[first]) if yolo else []
    stepped = True

    heading = ""  # the header line, where a row leaves columns blank
    trials: list[str] = []  # the trials of a Ray Tune status table, in the order of their rows
    by_trial = False  # a Ray Tune status table's rows: a trial each
    step_column = 0  # Chainer's "epoch  iteration": the iteration is the step, the epoch a metric

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        nonlocal names, stepped, yolo, heading, step_column, by_trial
        if unnamed is not None:
            return _headerless_rows(lines, i, unnamed)
        if _yolo_header(lines, i):
            names, stepped, yolo = _epoch_names(lines[i]), True, True
            return [], i + 1
        if yolo:
            return _epoch_rows(lines, i, names)
        sideways = _transposed(lines, i)
        if sideways:
            return sideways
        if _HEADER.match(lines[i]) or _names_only(lines[i]) or _one_name_over_numbers(lines, i):
            names, stepped = [_name(c) for c in cells(lines[i])], _HEADER.match(lines[i]) is not None
            heading = lines[i]
            finer = stepped and len(names) > 2 and names[0].lower() in ("epoch", "e")
            step_column = 1 if finer and _FINER_STEP.fullmatch(names[1]) else 0
            trial = _trial_step(names)
            by_trial = trial is not None
            if trial is not None:
                stepped, step_column = True, trial
            names[0] = "epoch" if step_column and names[0] == "E" else names[0]  # spaCy's "E"
            return [], i + 1
        if _RULE.match(lines[i]):
            return [], i + 1
        row = _row_cells(lines[i], len(names))
        if stepped and 2 <= len(row) < len(names) and not _csv(lines[i]):
            # the columns not logged on this row: under the header's columns it is printed below, or
            # the last ones (DeepXDE's test loss and metric between its evaluations)
            aligned = _aligned(heading, lines[i], len(names)) if _space_aligned(lines[i]) else None
            row = aligned or row + [""] * (len(names) - len(row))
        if not names or len(row) != len(names) or not _fits(row, stepped, step_column):
            return None
        step = row[step_column]
        if by_trial:  # a trial a row: the first trial's are read
            if row[0] not in trials:
                trials.append(row[0])
            if row[0] != trials[0]:
                return [], i + 1
        if not stepped or _STEP.match(step) is None:
            return [Row(None, _logged(names, row), lines[i], i + 1)], i + 1
        others = [k for k in range(len(names)) if k != step_column]
        metrics = _logged([names[k] for k in others], [row[k] for k in others])
        return [Row(int(step), metrics, lines[i], i + 1)], i + 1

    parsed = scan(log.lines, parse_at)
    if len(trials) > 1:
        parsed.notes.append(
            f"a Ray Tune status table of {len(trials)} trials, a row each: the first, {trials[0]}, is read; "
            "the others are runs of their own (diagnose each trial's result log)"
        )
    if unnamed is not None:
        steps = [row.step for row in parsed.rows]
        rising = "rising on every row" if len(set(steps)) == len(steps) else "never falling from row to row"
        parsed.notes.append(
            f"a table pasted without its header row: its {unnamed[0]} columns are numbered, column "
            f"{unnamed[1] + 1} (whole numbers {rising}) the step; no metric is named"
        )
    steps_in_tables(parsed)  # a table without a step column may log one among the others
    keys = {k for row in parsed.rows for k in row.metrics}
    parsed.framework = guess_beyond_generic(keys) or ("trl" if "reward" in keys or "loss" in keys else None)
    for row in parsed.rows:
        row.metrics = canonical_names(parsed.framework, row.metrics)
    parsed.keymap = "moescope"
    return parsed
