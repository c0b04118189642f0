"""Line templates: the bulk path a long log's records take, with the reader's own result.

A long log repeats one line shape tens of thousands of times: the same prefix, the same keys in
the same order, only the numbers differ. The readers' grammars (rejoining wrapped lines, every
number notation, prose around the fields) cost ~20 µs a line in Python. A template is one
compiled pattern made from a line the reader has read: its text kept literally, its step and
each of its values a capture group that only a plain number fills. A line the template matches
in full is then read with one ``fullmatch``, and its numbers a column at a time
(:func:`~moescope.analyze.readers._text.plain_numbers`), not a field at a time.

A reader says how to make a template of a line (``template_of``); a template may only match
lines the reader would read into one record of that step and those values, as it read the
sample, and whose record never takes the next line. That is checked, not only argued: the first
``CHECKED`` lines a template reads, and one in every ``EVERY`` after them, are read the slow way
too, and any difference raises :class:`Mismatch`, on which :func:`attempt` reads the whole log
again the slow way. Logs shorter than ``MIN_LINES`` are read the slow way only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from moescope.analyze.readers._rows import Parsed, Row
from moescope.analyze.readers._text import plain_numbers

MIN_LINES = 2000  # below this a log reads fast enough line by line
CHECKED = 64  # lines read both ways before the template's rows are trusted
EVERY = 1024  # and one in this many after that
MOST = 4  # templates per log: training, validation and evaluation lines of one trainer
HEAD = 2000  # lines looked at for the samples templates are made of
CHUNK = 8192  # lines matched and read in bulk at a time
# a plain number that plain_number reads as float() / int() do: ints of at most 300 digits,
# no trailing "." (a "5. " would end a sentence for the records reader), lower-case nan / inf
VALUE = r"-?(?:\d{1,300}(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?|nan|-?inf"
ParseAt = Callable[[list[str], int], "tuple[list[Row], int] | None"]


class Mismatch(Exception):
    """A template read a line otherwise than its reader does: the log is read again slowly."""


@dataclass(frozen=True)
class Template:
    """A compiled line shape: group 1 the step, the next groups the values of ``keys``; ``tag``
    what the reader notes of each record it reads (the records reader: the framework)."""

    pattern: re.Pattern[str]
    keys: tuple[str, ...]
    tag: str | None = None


def value() -> str:
    """The group a value's text becomes in a template."""
    return f"({VALUE})"


def loose(text: str) -> str:
    """``text`` as a pattern with each run of digits any run of digits: a time stamp or a date,
    which a reader passes over whatever its digits (only for text without letters)."""
    return re.sub(r"\d+", lambda _: r"\d+", re.escape(text))


def attempt(read: Callable[[bool], Parsed]) -> Parsed:
    """``read(True)``, a reader with its bulk path on; the slow read ``read(False)`` when a
    template turned out to read a line otherwise than the reader does."""
    try:
        return read(True)
    except Mismatch:
        return read(False)


def bulk(
    lines: list[str],
    parse_at: ParseAt,
    template_of: Callable[[str], Template | None],
    *,
    took: Callable[[list[str | None]], object] = lambda tags: None,
) -> ParseAt:
    """``parse_at`` with the lines templates read answered from rows made ahead in bulk: a run
    of such lines in one answer, which :func:`~moescope.analyze.readers._rows.scan` takes as
    one record spanning them.

    ``template_of(line)`` makes the template of a record line, or ``None`` where it cannot;
    ``took(tags)`` is told of the records taken so (their templates' tags), as ``parse_at``
    notes what it reads.
    """
    if len(lines) < MIN_LINES:
        return parse_at
    templates = _templates(lines, template_of)
    return _Ahead(lines, templates, parse_at, took) if templates else parse_at


class _Ahead:
    """The bulk rows of ``CHUNK`` lines at a time, made when the scan reaches them: what the
    bulk path holds beyond the rows themselves stays one chunk's matches and numbers."""

    def __init__(
        self,
        lines: list[str],
        templates: list[Template],
        parse_at: ParseAt,
        took: Callable[[list[str | None]], object],
    ) -> None:
        self.lines, self.templates, self.parse_at, self.took = lines, templates, parse_at, took
        self.end = 0  # the lines before it are in chunks made
        self.made: dict[int, tuple[Row, str | None]] = {}
        self.runs: dict[int, int] = {}
        self.taken = 0  # template lines in the chunks made before this one

    def __call__(self, lines: list[str], i: int) -> tuple[list[Row], int] | None:
        if i >= self.end:
            self._chunk(i)
        end = self.runs.get(i)
        if end is None:
            return self.parse_at(lines, i)
        if end < 0:  # a line read both ways, to check the template
            slow = self.parse_at(lines, i)
            if (
                slow is None
                or slow[1] != i + 1
                or len(slow[0]) != 1
                or not _same(slow[0][0], self.made[i][0])
            ):
                raise Mismatch(f"line {i + 1}")
            return slow
        found = [self.made[j] for j in range(i, end)]
        self.took([tag for _, tag in found])
        return [row for row, _ in found], end

    def _chunk(self, start: int) -> None:
        self.end = min(start + CHUNK, len(self.lines))
        self.made = _rows(self.lines, self.templates, start, self.end)
        self.runs = _runs(sorted(self.made), self.taken)
        self.taken += len(self.made)


def _runs(taken: list[int], before: int) -> dict[int, int]:
    """Where each run of consecutive template lines starts, and the index after it; a line to
    be checked (the first ``CHECKED`` of the log, then one in ``EVERY``; ``before`` of them came
    in earlier chunks) stands alone, with ``-1``."""
    runs: dict[int, int] = {}
    start = None
    for k, i in enumerate(taken, before):
        if k < CHECKED or k % EVERY == 0:
            runs[i] = -1
            start = None
        elif start is not None and runs[start] == i:
            runs[start] = i + 1
        else:
            runs[i], start = i + 1, i
    return runs


def _templates(lines: list[str], template_of: Callable[[str], Template | None]) -> list[Template]:
    """Templates of the first record lines of the head that no earlier template matches."""
    found: list[Template] = []
    for line in lines[:HEAD]:
        if len(found) >= MOST:
            break
        if not line.strip() or any(t.pattern.fullmatch(line) for t in found):
            continue
        template = template_of(line)
        if template is not None and template.pattern.fullmatch(line):
            found.append(template)
    return found


def _rows(
    lines: list[str], templates: list[Template], start: int, stop: int
) -> dict[int, tuple[Row, str | None]]:
    """The rows (with their template's tag) of the lines from ``start`` to ``stop`` that a
    template matches and whose record the next line cannot join: the next line is blank, a
    template line (a record of its own), or none."""
    window = lines[start : stop + 1]  # and the line after, to tell whether it joins the last
    found: list[re.Match[str] | None] = list(map(templates[0].pattern.fullmatch, window))
    owner = [templates[0] if match else None for match in found]
    for template in templates[1:]:
        left = [i for i, match in enumerate(found) if match is None]
        for i, match in zip(left, map(template.pattern.fullmatch, [window[i] for i in left]), strict=True):
            if match is not None:
                found[i], owner[i] = match, template
    ends = [*found[1:], True]  # the line after each: a match, or anything true after the last
    rows: dict[int, tuple[Row, str | None]] = {}
    for template in templates:
        mine = [
            i
            for i, (match, after) in enumerate(zip(found[: stop - start], ends, strict=False))
            if match is not None and owner[i] is template and (after or not window[i + 1].strip())
        ]
        if not mine:
            continue
        groups = [found[i].groups() for i in mine]  # type: ignore[union-attr]
        steps, *texts = zip(*groups, strict=True)
        columns = [plain_numbers(list(text)) for text in texts]
        if any(column is None for column in columns):
            continue  # not reached: VALUE admits only what plain_numbers reads
        values = zip(*columns, strict=True) if columns else ((),) * len(mine)
        keys, tag = template.keys, template.tag
        rows.update(
            (
                start + i,
                (Row(int(step), dict(zip(keys, numbers, strict=True)), window[i], start + i + 1), tag),
            )
            for i, step, numbers in zip(mine, steps, values, strict=True)
        )
    return rows


def _same(a: Row, b: Row) -> bool:
    """Rows equal to the type of every value (``1 == 1.0``, but an int is no float)."""
    return (
        (a.step, a.raw, a.line) == (b.step, b.raw, b.line)
        and list(a.metrics.items()) == list(b.metrics.items())
        and [type(v) for v in a.metrics.values()] == [type(v) for v in b.metrics.values()]
    )
