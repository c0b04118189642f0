"""Debug prints of the router's choices: a layer number and the expert ids it picked per token.

A user chasing a router collapse prints the top-k indices instead of metrics::

    [XXX] layer:  1 topk_idx: [30, 30, 30, 30, 30, 30, 30, 30]
    layer 2 selected experts: tensor([[19, 4], [19, 7], [19, 4]])

Each line is one layer's choices for a batch; the ids are counted into the expert load of that
layer, exactly as an ``expert_load.log`` is (:mod:`moescope.analyze.readers.columns`): shares per
layer, ``moe/max_load_share``, ``moe/dead_experts`` and ``moe/load_cv``. A line names its step
when it says ``step N``; otherwise a new forward pass begins where the layer numbers start over,
and passes are numbered in order.
"""

from __future__ import annotations

import re
from collections import Counter

from moescope.analyze.readers._rows import Parsed, scan
from moescope.analyze.readers._text import INT, LogFile
from moescope.analyze.readers.columns import MAX_ID, LoadTally
from moescope.analyze.readers.plain import STEP_IN_LINE

LINE = re.compile(
    rf"(?i)\blayer\b[\s:=#_]*(?P<layer>{INT})\b[^\[]*?"
    r"(?:top_?k|expert|idx|indices|selected|routed|routing)[^\[]*?(?P<ids>\[[\d\s,\[\]]*\])"
)


def parse(line: str) -> tuple[int, list[int]] | None:
    """``(layer, expert ids)`` of a top-k print, or ``None``."""
    match = LINE.search(line)
    if match is None:
        return None
    ids = [int(i) for i in re.findall(r"\d{1,6}", match.group("ids"))]
    layer = int(match.group("layer"))
    if not ids or layer >= MAX_ID or max(ids) >= MAX_ID:
        return None
    return layer, ids


def is_record(line: str) -> bool:
    """A layer's printed top-k expert ids."""
    return parse(line) is not None


def read(log: LogFile) -> Parsed:
    """The expert load of every forward pass the prints show."""
    tally = LoadTally()
    state = {"pass": 0, "last": None}

    def parse_at(lines: list[str], i: int) -> tuple[list, int] | None:
        found = parse(lines[i])
        if found is None:
            return None
        layer, ids = found
        named = STEP_IN_LINE.search(lines[i])
        if named is None and state["last"] is not None and layer <= state["last"]:
            state["pass"] += 1
        state["last"] = layer
        tally.add(int(named.group(1)) if named else state["pass"], layer, dict(Counter(ids)), lines[i])
        return [], i + 1

    return tally.finish(scan(log.lines, parse_at), log)
