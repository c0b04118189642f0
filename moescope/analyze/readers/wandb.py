"""The block W&B prints when a run ends: ``wandb: Run summary:``, one right-aligned key a line.

::

    wandb: Run summary:
    wandb:       train/global_step 100
    wandb:         train/grad_norm nan
    wandb:              train/loss 0.0
    wandb:               train loss nan

(a key logged with a space in it, as home-made loops do, is printed with it). The summary is the
run's last logged value of every key: one record, on the step one of its keys names
(``train/global_step``, ``_step``), else step 0. The ``Run history:`` block above it draws
sparklines, no numbers, and is passed over. Keys are read through the guessed framework's
table, then the generic one (as :mod:`moescope.analyze.readers.records` does).
"""

from __future__ import annotations

import re

from moescope.analyze.readers._rows import STEP_KEYS, Parsed, Row, flat_row, scan
from moescope.analyze.readers._text import NUMBER, LogFile, parse_number
from moescope.analyze.readers.keymap import guess_beyond_generic
from moescope.analyze.readers.records import canonical_names

# a key as logged: one token, or words a single space apart (a loop's ``train loss``)
LINE = re.compile(rf"\s*wandb:\s+(?P<key>[^\s:][^\s]*(?: [^\s:]+)*)\s+(?P<value>{NUMBER})\s*$")


def is_record(line: str) -> bool:
    """A ``wandb:  key value`` summary line."""
    return LINE.match(line) is not None


def read(log: LogFile) -> Parsed:
    """The summary lines as one record."""
    found: dict[str, object] = {}
    raws: list[str] = []

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        match = LINE.match(lines[i])
        if match is None:
            return None
        found[match.group("key")] = parse_number(match.group("value"))
        raws.append(lines[i])
        return [], i + 1

    parsed = scan(log.lines, parse_at)
    parsed.framework = guess_beyond_generic(set(found))
    row = flat_row(found, "\n".join(raws), None)
    if row.step is None:
        row.step = 0
    row.metrics = canonical_names(
        parsed.framework, {k: v for k, v in row.metrics.items() if k not in STEP_KEYS}
    )
    parsed.rows = [row] if found else []
    parsed.keymap = "moescope"
    parsed.notes.append(f"a W&B run summary: its {len(found)} values are the run's last, read as one step")
    return parsed
