"""OpenRLHF's console: the metrics it shows in its progress bars' postfix.

OpenRLHF has no structured console log; what a user can paste is tqdm's bars, redrawn with
``\\r`` (a file keeps every redraw on one line)::

    Episode [1/1]:  10%|█         | 5/50 [01:23<12:30, 16.7s/it, policy_loss=0.0123, actor_lr=1e-06,
    reward=0.5, response_length=312, kl=0.001, ppo_clip_ratio=0.02]
    Train epoch [1/1]: 100%|██████████| 8/8 [00:10<00:00, act_loss=0.12, reward=0.5, kl=0.001, act_lr=1e-06]

The outer ``Episode`` bar carries a training step's whole status (``pbar.set_postfix(logs_dict)``
then ``pbar.update()``), so each distinct postfix is one step, numbered by the bar's count after
the update (the largest count drawn with that postfix). The inner ``Train epoch`` bars show one
minibatch's short status (``act_loss``, ``gen_len``, ``act_lr``, …); they are read only when a
paste has no ``Episode`` bar, one step per completed inner bar (its last postfix), in order.

Other trainers draw the same bars — PyTorch Lightning's ``Epoch 0:  22%|██▏  | 4/18 [00:17<01:02,
4.47s/it, loss=10.072, v_num=193315]``, a home-made loop's ``tqdm.set_postfix`` — and a paste of
them often ends before any bar completes. With no ``Episode`` bar and no completed bar, each
distinct postfix is a step on the bar's count, as for ``Episode``, offset by the epoch a
description ``Epoch N`` names (``N × total + count``). A bar drawn once a count (a diffusers
script's ``Steps:   1%|▏ | 16/6000 […, lr=0, step_loss=nan]``) has no redraw to fold: each count
is a step, however often its postfix repeats. Completed bars that each name a later epoch than
the one before (``Epoch 8: 100%|…| 266/266``) are on those epochs. Where every postfix logs its
own step (NeMo's ``global_step=1.000``), that is its step, whatever the count: Lightning draws
each count with the old postfix and then the new one, so a count holds two steps.

A loop may print its epoch's summary under the bar, ``Mean Training loss : nan`` (one name and one
number, nothing else on the line), and that may be the only place a NaN shows: such lines,
between a step's bar and the next bar, are read into that step where its postfix lacks them.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import pairwise
from typing import Any

from moescope.analyze.readers._rows import Parsed, Row, logged_step
from moescope.analyze.readers._text import INT, NUMBER, LogFile, parse_number
from moescope.analyze.readers.alerts import said
from moescope.analyze.readers.keymap import guess_beyond_generic
from moescope.analyze.readers.keyvalues import line_field
from moescope.analyze.readers.records import canonical_names

BAR = re.compile(
    rf"(?P<desc>[A-Za-z][\w ]{{0,80}}?(?:\[\d+/\d+\])?)\s*:\s*\d+%\|[^|]*\|\s*(?P<n>{INT})/(?P<total>{INT})"
    r"\s*\[(?P<inside>[^\]]*)\]"
)
_PAIR = re.compile(rf"(?P<key>[A-Za-z_][\w/.\-]*)=(?P<value>{NUMBER})(?=\s*(?:,|$))")
OUTER = "Episode"
_EPOCH = re.compile(rf"^Epoch\s*({INT})$", re.IGNORECASE)


def renders(line: str) -> list[tuple[str, int, int, dict[str, Any], str]]:
    """``(desc, n, total, postfix, text)`` of every bar drawn on ``line`` that has a postfix."""
    out: list[tuple[str, int, int, dict[str, Any], str]] = []
    if "%|" not in line:  # no bar drawn: spare the pattern a long line
        return out
    for piece in line.split("\r"):
        for bar in BAR.finditer(piece):
            pairs = {
                m.group("key"): parse_number(m.group("value")) for m in _PAIR.finditer(bar.group("inside"))
            }
            if pairs:
                out.append(
                    (
                        bar.group("desc").strip(),
                        int(bar.group("n")),
                        int(bar.group("total")),
                        pairs,
                        bar.group(0),
                    )
                )
    return out


def is_record(line: str) -> bool:
    """A line with at least one progress bar whose postfix holds ``key=value`` metrics."""
    return bool(renders(line))


def read(log: LogFile) -> Parsed:
    """One row per Episode-bar postfix, or per completed inner bar when there is no Episode bar."""
    drawn = [(i + 1, r) for i, line in enumerate(log.lines) for r in renders(line)]
    parsed = _parse(drawn)
    used = {n for n, _ in drawn}  # inner bars beside an Episode bar are passed over, not unread
    used |= _summaries(parsed.rows, sorted(used), log.lines)
    parsed.skipped = [i + 1 for i, line in enumerate(log.lines) if line.strip() and i + 1 not in used]
    parsed.lines = sum(1 for x in log.lines if x.strip())
    return parsed


def _parse(drawn: list[tuple[int, tuple]]) -> Parsed:
    """The rows of the bars drawn, by the first reading of the module's docstring that applies."""
    outer = [(n, r) for n, r in drawn if r[0].startswith(OUTER)]
    if outer:
        return Parsed(_outer_rows(outer), "openrlhf")
    logged = _logged_rows(drawn)
    if logged:
        return _generic(logged, "every postfix logs its step (global_step=…): each is on that step")
    rows = _inner_rows(drawn)
    if rows:
        return Parsed(
            rows, "openrlhf", notes=["no Episode bar: one step per completed inner bar (or epoch it names)"]
        )
    # no bar ever completed: another trainer's bars, read as any postfix
    rows = _outer_rows([(n, _by_epoch(r)) for n, r in drawn])
    return _generic(
        rows, "no Episode bar and no completed bar: one step per postfix drawn, on the bar's count"
    )


def _generic(rows: list[Row], note: str) -> Parsed:
    """``rows`` under the generic names: bars no completed one vouches for as OpenRLHF's
    (Lightning's ``loss`` is the loss)."""
    keys = {k for row in rows for k in row.metrics}
    framework = guess_beyond_generic(keys)
    for row in rows:
        row.metrics = canonical_names(framework, row.metrics)
    return Parsed(rows, framework, keymap="moescope", notes=[note])


def _logged_rows(drawn: list[tuple[int, tuple]]) -> list[Row]:
    """One row per step the postfixes log themselves, where every postfix does (NeMo's
    ``global_step=1.000``): the bar's count runs ahead of it as Lightning redraws around each
    update, and two steps would share a count; of a step drawn again in a row, the last postfix
    wins (a step counter that starts over is a second run, not the same steps)."""
    steps = [logged_step(r[3]) for _, r in drawn]
    if not drawn or None in steps:
        return []
    rows: list[Row] = []
    for step, (line, r) in zip(steps, drawn, strict=True):
        if rows and rows[-1].step == step:
            rows.pop()
        rows.append(Row(step, dict(r[3]), r[4], line))
    return rows


def _outer_rows(outer: list[tuple[int, tuple]]) -> list[Row]:
    """Each distinct postfix once, on the largest count drawn with it, where the bar is redrawn
    around each update (:func:`_redrawn`); else a count that advances is a step of its own, its
    postfix the same or not (a loss stuck at ``nan`` from step 16 on starts at 16, not at the
    last bar that shows it)."""
    redrawn = _redrawn(outer)
    rows: list[Row] = []
    for line, (_, n, _, pairs, text) in outer:
        if rows and rows[-1].metrics == pairs and (redrawn or n == rows[-1].step):
            rows[-1].step = max(rows[-1].step or 0, n)
            continue
        rows.append(Row(n, dict(pairs), text, line))
    return rows


def _redrawn(drawn: list[tuple[int, tuple]]) -> bool:
    """Whether some count is drawn with two postfixes in a row: the bar is redrawn around each
    update (OpenRLHF sets the postfix, then updates; Lightning updates, then sets it), so one
    postfix shows on two counts and only one of them is its step. A loop that sets the postfix
    once a step draws each count once."""
    return any(a[1] == b[1] and a[3] != b[3] for (_, a), (_, b) in pairwise(drawn))


def _by_epoch(render: tuple) -> tuple:
    """``render`` with its count made global when its description names the epoch
    (``Epoch 2`` of 18 a bar: count 4 → 2 × 18 + 4)."""
    desc, n, total, pairs, text = render
    epoch = _EPOCH.match(desc)
    return (desc, int(epoch.group(1)) * total + n if epoch else n, total, pairs, text)


def _inner_rows(drawn: list[tuple[int, tuple]]) -> list[Row]:
    """The last postfix of every completed bar (count = total), numbered from 0, or by the
    epochs their descriptions name (``Epoch 8: 100%|…| 266/266``) where each names a later one."""
    done = [(line, r) for line, r in drawn if r[1] == r[2]]
    last: list[tuple[int, tuple]] = []
    for line, r in done:  # a finished bar redrawn with the same postfix counts once
        if not last or last[-1][1][3] != r[3]:
            last.append((line, r))
    epochs = [int(m.group(1)) if (m := _EPOCH.match(r[0])) else None for _, r in last]
    rising = None not in epochs and all(a < b for a, b in pairwise(epochs))
    steps = epochs if rising else range(len(last))
    return [Row(step, dict(r[3]), r[4], line) for step, (line, r) in zip(steps, last, strict=True)]


def _summaries(rows: list[Row], bars: list[int], lines: list[str]) -> set[int]:
    """Read each ``name : value`` line between a row's bar and the next bar into that row, where
    its postfix lacks the name; the numbers of the lines read. A framework's warning (Megatron's
    ``number of skipped iterations: 2``) is left to :mod:`~moescope.analyze.readers.alerts`."""
    read: set[int] = set()
    for row in rows:
        start = row.line or 0
        after = bisect_right(bars, start)  # the bar after the row's own
        end = bars[after] if after < len(bars) else len(lines) + 1
        for number in range(start + 1, end):
            found = line_field(lines[number - 1])
            if found and found[0] not in row.metrics and not said(lines[number - 1]):
                row.metrics[found[0]] = found[1]
                row.raw += "\n" + lines[number - 1]
                read.add(number)
    return read
