"""The fallback for any text log: the lines that mention NaN or Inf.

What ``grep -i "nan\\|inf" train.log`` finds, made into steps: every line with a ``nan`` /
``inf`` / ``-inf`` / ``Infinity`` token (not ``info`` or ``inference``) is a record, on the step a
``step 12`` / ``iteration=12`` / ``global_step: 12`` in the line names, or on the step of the
line before it. ``health/nonfinite`` counts those lines per step — a count of log lines, not of
tensors — and the lines themselves are the step's raw text. Lines before the first step number
are indexed in order, as every reader does. Where no line names a step, a line is on its place
among the lines printed in its shape, finite ones counted: a loop that prints its loss bare
(``tensor(3.2207, device='cuda:0')``, then ``tensor(nan, device='cuda:0')``) turns NaN on its
second print, not its first; a loop that starts each line with its iteration bare (``35000 35%
(1m 4s) nan``), on that count.
"""

from __future__ import annotations

import re
from itertools import pairwise

from moescope import schema as S
from moescope.analyze.readers._rows import Parsed, Row, scan
from moescope.analyze.readers._text import INT, NUMBER, LogFile

NONFINITE = re.compile(r"(?<![\w.])[-+]?(?:nan|inf|infinity)(?!\w)", re.IGNORECASE)
_VALUE = re.compile(rf"(?<![\w.])(?:{NUMBER})(?![\w.])")
_COUNTER = re.compile(r"\s*(\d+)\s")  # a line that starts with a bare count (no date, no decimal point)
EMPTY_REGION = re.compile(r"\bRegion \d+ Avg\b.*\bcount: 0(?![\d.])")
STEP_IN_LINE = re.compile(rf"\b(?:global_step|step|iteration|iter)\b\s*+(?:[:=#]\s*+)?({INT})", re.IGNORECASE)


def is_record(line: str) -> bool:
    """A line that mentions a non-finite value, but for darknet's statistics of a YOLO layer that
    saw no object in the batch (``Region 82 Avg IOU: -nan, Class: -nan, … count: 0``): means over
    no box, 0 / 0, printed every batch of a healthy run."""
    return NONFINITE.search(line) is not None and EMPTY_REGION.search(line) is None


def read(log: LogFile) -> Parsed:
    """One row per step that has lines mentioning NaN/Inf."""

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        if not is_record(lines[i]):
            return None
        step = STEP_IN_LINE.search(lines[i])
        return [Row(int(step.group(1)) if step else None, {S.NONFINITE: 1}, lines[i], i + 1)], i + 1

    parsed = scan(log.lines, parse_at)
    if parsed.rows and all(row.step is None for row in parsed.rows) and not _by_counter(parsed, log.lines):
        _by_place(parsed, log.lines)
    grouped: dict[int, Row] = {}
    loose: list[Row] = []
    last: int | None = None
    for row in parsed.rows:
        last = row.step if row.step is not None else last
        if last is None:
            loose.append(row)
        elif last in grouped:
            grouped[last].metrics[S.NONFINITE] += 1
            grouped[last].raw += "\n" + row.raw
        else:
            grouped[last] = Row(last, dict(row.metrics), row.raw, row.line)
    parsed.rows = loose + list(grouped.values())
    parsed.notes.append("read as plain text: only lines that mention NaN/Inf were kept")
    return parsed


def _by_counter(parsed: Parsed, lines: list[str]) -> bool:
    """Each row on the count its line starts with, where every row's line starts with one and the
    lines that start with a count (finite ones among them, three at least) count upwards: a loop
    that prints its iteration bare (``35000 35% (1m 4s) nan Nam / Russian``). Whether it did."""
    counts = [int(found.group(1)) for line in lines if (found := _COUNTER.match(line))]
    firsts = [_COUNTER.match(row.raw) for row in parsed.rows]
    if len(counts) < 3 or any(a >= b for a, b in pairwise(counts)) or None in firsts:
        return False
    for row, found in zip(parsed.rows, firsts, strict=True):
        row.step = int(found.group(1))
    parsed.notes.append(f"no step named: each line is on the count it starts with ({len(counts)} such lines)")
    return True


def _shape(line: str) -> str:
    """``line`` with every number (NaN and Inf among them) as ``#``: what one print statement
    prints whatever its values."""
    return _VALUE.sub("#", line.strip())


def _by_place(parsed: Parsed, lines: list[str]) -> None:
    """Each row on its place among the lines printed in the shape of some row, finite or not."""
    shapes = {_shape(row.raw) for row in parsed.rows}
    places: dict[int, int] = {}
    for number, line in enumerate(lines, 1):
        if line.strip() and _shape(line) in shapes:
            places[number] = len(places)
    if len(places) == len(parsed.rows):
        return  # no finite print among them: the order is the place
    for row in parsed.rows:
        row.step = places[row.line]
    parsed.notes.append(f"no step named: each line is on its place among the {len(places)} of its shape")
