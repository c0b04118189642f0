"""Metrics pasted one per line: a snapshot without steps, or NeMo-RL's console blocks.

A user copies a run's latest metrics out of W&B or a console, one ``name: value`` per line
(``actor/entropy:0.021``, ``  • Loss: 0.0123``; a leading bullet ``•``, ``-``, ``*`` is passed
over), or as rllab / rlkit's ``dump_tabular`` prints them: a two-column table without a
separator, ``trainer/QF1 Loss      1.35779e+19`` (a name of words one space apart, the value
after a gap of two spaces or more), between rules of dashes. With no step anywhere, those lines
are one step, step 0 — unless a name comes again (ML-Agents' ``Mean Reward: 69.94`` printed line
after line): then the lines are a series, a new record wherever a name repeats, their steps
counted 0, 1, 2, … in order, or the epochs they log where each logs one, whole and rising (rlkit
closes each epoch's table on its ``Epoch  49`` row). NeMo-RL prints a banner before each step's
block::

    ========================= Step 3/100 =========================
    📊 Training Results:
      • Loss: 0.0123
      • Generation KL Error: 0.0011
      • Avg Reward: 0.4531

so a banner starts a step and the ``name: value`` lines up to the next banner are its metrics
(the timing block's durations too, under their own names). rsl-rl (IsaacLab, legged_gym) prints
the same shape: a centred ``Learning iteration 8391/10000`` over right-aligned ``Value function
loss: 0.0123`` lines, the banner read as the step, and so does PPO-for-Beginners: ``------
Iteration #50 ------`` over ``Average Loss: nan`` (``Epoch #N`` and ``Step #N`` alike, the
number after ``#`` the step). In a log that has banners, lines before the first one (a config
dump) are skipped. The framework is guessed from the keys
against every table of the key map; when none recognises more of them than the ``generic``
table of common names does, that table renames them and no framework is named.

This format is detected only when no other line format is found in the file: a config dump's
``key: value`` lines must not outvote a real log's records.
"""

from __future__ import annotations

import re
from typing import Any

from moescope.analyze.readers._fields import field
from moescope.analyze.readers._rows import Parsed, Row, scan, steps_from_epochs
from moescope.analyze.readers._text import INT, NUMBER, LogFile, parse_number
from moescope.analyze.readers.keymap import KEY_MAP, guess_framework

# "Step 3/100", rsl-rl's "Learning iteration 8391/10000", PPO-for-Beginners' "Iteration #50"
BANNER = re.compile(
    rf"[\s=#*\-─]*(?:(?:step|learning\s+iteration)\s+|(?:step|iteration|epoch)\s*#\s*|epoch\s+(?={INT}\s*\())"
    rf"({INT})(?:\s*/\s*{INT})?(?:\s*\(\s*{INT}\s*/\s*{INT}\s*\))?[\s=#*\-─:]*",
    re.IGNORECASE,
)
_BULLET = re.compile(r"\s*(?:[•·*\-–]\s*)?")
# rllab / rlkit's dump_tabular (tabulate, no header): a name of words one space apart, then the
# value after tabulate's gap of two or more spaces: "trainer/QF1 Loss      1.35779e+19"
_TABULAR_ROW = re.compile(
    rf"\s*(?P<key>[A-Za-z_][\w.()/@%+\-]*(?: [\w.()/@%+\-]+)*)(?: {{2,}}|\t+)(?P<value>{NUMBER})\s*"
)
_FRAMEWORKS = tuple(name for name in KEY_MAP if name not in ("moescope", "generic"))


def line_field(line: str) -> tuple[str, Any] | None:
    """The ``name: value`` a line is (after a bullet; a pretty-printed JSON dict's ``"train_loss":
    6.0587,``, its quotes and comma passed over), or ``None``."""
    quoted = _QUOTED_LINE.fullmatch(line) if line.lstrip()[:1] in ("'", '"') else None
    if quoted is not None:
        return field(f"{quoted['key']}: {quoted['value']}", labelled=True)
    return field(line[_BULLET.match(line).end() :], labelled=True)


# a pretty-printed JSON (or Python) dict's line: Open-GroundingDino's ' "train_loss": 6.0587, '
_QUOTED_LINE = re.compile(r"""\s*(["'])(?P<key>[^"'\n]{1,128})\1\s*:\s*(?P<value>[^,\s]+)\s*,?\s*""")


def table_field(line: str) -> tuple[str, Any] | None:
    """The ``(name, value)`` of a two-column table row (:data:`_TABULAR_ROW`), or ``None``."""
    row = _TABULAR_ROW.fullmatch(line)
    return (row.group("key"), parse_number(row.group("value"))) if row else None


def snapshot_field(line: str) -> tuple[str, Any] | None:
    """The field a line of a snapshot is: ``name: value``, or a table row ``name   value`` (after
    the prefix Python's logging puts before it, :data:`_LOGGED`: a ``name: value`` behind a logger
    is a record's, and the records reader reads it beside the logger's other lines)."""
    found = line_field(line)
    if found is not None:
        return found
    logged = _LOGGED.match(line) if line[:1] in _LOGGED_STARTS else None
    return table_field(line[logged.end() :] if logged else line)


# Python's logging before a metric a line: a time stamp, the logger's names, then the level (flgo's
# "2023-08-11 12:35:17,211 simple_logger.py log_once [line:28] INFO test_loss     nan", behind a
# paste's "- > " quote marks)
_LOGGED = re.compile(
    r"[\s\->]*\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d+)?\s[^\n]{0,120}?"
    r"\b(?:DEBUG|INFO|WARNING|ERROR)\b(?:\s*[:\-]\s*|\s+)"
)
_LOGGED_STARTS = frozenset(" ->0123456789")


def is_record(line: str) -> bool:
    """A ``name: value`` line."""
    return line_field(line) is not None


def read(log: LogFile) -> Parsed:
    """One row per banner's block, or one row for a snapshot without banners."""
    banners = any(BANNER.fullmatch(line) for line in log.lines)
    step: int | None = None

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        nonlocal step
        banner = BANNER.fullmatch(lines[i])
        if banner:
            step = int(banner.group(1))
            return [], i + 1
        one = snapshot_field(lines[i])
        # under banners, a line of several: "Test Instance Accuracy: 0.040453, Class Accuracy: 0.025000"
        found = [one] if one is not None else _fields_of_line(lines[i]) if banners else []
        if not found or (banners and step is None):
            return None
        return [Row(step if banners else 0, dict(found), lines[i], i + 1)], i + 1

    parsed = scan(log.lines, parse_at)
    series = [] if banners else _series(parsed.rows)
    parsed.rows = series if len(series) > 1 else _blocks(parsed.rows)
    if banners or not steps_from_epochs(parsed):  # rlkit closes each epoch's table on "Epoch  49"
        _note_steps_counted(parsed, series, banners)
    keys = {key for row in parsed.rows for key in row.metrics}
    guess = guess_framework(
        keys, (*_FRAMEWORKS, "generic")
    )  # a framework must name more than the common names
    parsed.framework = None if guess == "generic" else guess
    parsed.keymap = guess or "generic"
    return parsed


_QUALIFIER = re.compile(r"(?:train|training|test|val|valid|validation|eval|best)\s", re.IGNORECASE)


def _fields_of_line(line: str) -> list[tuple[str, Any]]:
    """The ``name: value`` fields of a line that holds several, split at ``, ``; a later name
    without the split or "best" its first name opens with takes it (yanx27's PointNet++: ``Test
    Instance Accuracy: 0.04, Class Accuracy: 0.025`` and ``Best Instance Accuracy: …, Class
    Accuracy: …``, whose class accuracies are the test's and the best's)."""
    pieces = line.split(", ")
    fields = [found for piece in pieces if (found := line_field(piece)) is not None]
    if len(pieces) < 2 or len(fields) < len(pieces):
        return []
    first = _QUALIFIER.match(fields[0][0])
    prefix = first.group(0) if first else ""
    return [(name if _QUALIFIER.match(name) else prefix + name, value) for name, value in fields]


def _note_steps_counted(parsed: Parsed, series: list[Row], banners: bool) -> None:
    """Say how steps were given to records that log none: counted in order, or one snapshot at 0."""
    if len(series) > 1:
        parsed.notes.append(
            f"the same metrics repeat line after line without steps: read as a series of {len(series)} "
            "records, their steps counted 0, 1, 2, … (not logged)"
        )
    elif not banners and parsed.rows:
        parsed.notes.append(
            f"a snapshot without steps: its {len(parsed.rows[0].metrics)} metrics are read as step 0"
        )


def _series(rows: list[Row]) -> list[Row]:
    """Lines without steps cut into records, a new one wherever a name repeats one the record
    already holds (ML-Agents' ``Mean Reward: 69.94`` printed line after line, ml-agents#101: a
    series, not one snapshot whose last value wins); each record's step is its place in order.
    A snapshot (each name once) stays one record."""
    out: list[Row] = []
    for row in rows:
        if out and not (row.metrics.keys() & out[-1].metrics.keys()):
            out[-1].metrics.update(row.metrics)
            out[-1].raw += "\n" + row.raw
        else:
            out.append(Row(len(out), dict(row.metrics), row.raw, row.line))
    return out


def _blocks(rows: list[Row]) -> list[Row]:
    """The lines of one step as one row (a later value of a name wins)."""
    out: dict[int | None, Row] = {}
    for row in rows:
        if row.step in out:
            out[row.step].metrics.update(row.metrics)
            out[row.step].raw += "\n" + row.raw
        else:
            out[row.step] = Row(row.step, dict(row.metrics), row.raw, row.line)
    return list(out.values())
