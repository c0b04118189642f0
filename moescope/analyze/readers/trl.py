"""HF Trainer / TRL logs: ``trainer_state.json`` and the Python-dict lines of the console.

- ``trainer-state``: ``log_history`` is a list of flat records, each with its ``step``;
  Python's ``json`` wrote NaN/±Inf as ``NaN`` / ``Infinity`` tokens, which are read back as
  floats. Evaluation records share the step of a training record and are merged into it.
- ``trl-console``: one ``{'loss': 0.1, 'grad_norm': nan, …}`` line per logging step (a Python
  ``dict`` repr, so ``nan``/``inf`` and ``np.float64(…)`` appear bare), often glued to tqdm's
  progress bar by ``\\r``. The same shape is printed by ms-swift (with ``global_step/max_steps``)
  and by slime (``step 3: {...}`` for training, ``rollout 3: {...}`` / ``eval 3: {...}`` for the
  rollout and evaluation of rollout 3, put on step 3: one training step per rollout, slime's
  default, makes them the same). The step is the record's own step key, else slime's prefix,
  else the count of the progress bar glued in front — HF's bar counts optimizer steps and is
  drawn before the record is printed — when that bar is the training bar (the most common
  total), else, in a paste whose carriage returns became new lines, the bar on its own line
  right before the record or (the bar redrawn) right after it, when every record has one of
  one total counting up; otherwise the record joins the step before it. A line that is a
  record's body whose braces the paste cut off (``'loss': -0.0, 'grad_norm': 0.0, …``) is read
  with them put back, unless a dict opened above it is still open: then it is that record's next
  line. A record the paste cut short before its ``}`` (the last line of a copied terminal) is read
  from its complete pairs, with a note; if its step key was cut away it goes on the step after the
  record before it.
  LLaMA-Factory's rounded echo of a record, printed next to it, is merged into it, and so are the
  copies a multi-node launch prints of one record, one a host (``10.96.202.43: {'loss': …}``).

The dict is read with :func:`ast.parse` and never evaluated.
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

from moescope.analyze.readers._rows import Parsed, Row, flat_row, scan
from moescope.analyze.readers._text import INT, LogFile, gather, parse_number, quoted_number
from moescope.analyze.readers.jsonl import load_json
from moescope.analyze.readers.keymap import guess_framework
from moescope.errors import MoescopeError

# a record's opening brace, not a field's dict value (InternEvo's "grad_norm={'0_default': 2.1}"); a
# record may follow a label and " = " (VATT's "Train Step: 3350/100000  / training metric = {…}")
DICT_START = re.compile(r"(?<!=)(?<![\w\]]= )\{\s*['\"]")
# a record whose braces the paste lost: "'loss': -0.0, 'grad_norm': 0.0, …" (two quoted keys at least)
BARE_DICT = re.compile(r"""^\s*(['"])[^'"\n]+\1:[^,\n]+,\s*(['"])[^'"\n]+\2:""")
_BAR = re.compile(rf"({INT})/({INT})\s*\[")
# the step a prefix names before its record: slime's "rollout 12: {…}", a loop's "Step 100: {'loss': …}",
# "Epoch 3: {…}"
_PREFIX_STEP = re.compile(
    rf"\b(?:step|rollout|eval|iter(?:ation)?|epoch)\s*+(?:[:=]\s*+)?({INT})(?:\s*/\s*{INT})?"
    rf"(?:\s*/?\s*[A-Za-z][A-Za-z ]{{0,40}}=)?:?\s*$",
    re.IGNORECASE,
)
_LOG_HISTORY = re.compile(r'"log_history"\s*:\s*\[')
_HOST_LABEL = re.compile(r"^\s*([\w.\-]+):\s+\{")  # pdsh's "10.96.202.43: " / "worker-1: " before a record
_CUT_TRIES = 8  # last pair boundaries tried when a cut record's tail does not parse
CONSOLE_FRAMEWORKS = ("trl", "ms-swift", "slime", "openrlhf", "nemo-rl", "verl")


def is_trainer_state(text: str) -> bool:
    """A JSON document with a ``log_history`` list (HF Trainer's ``trainer_state.json``)."""
    return text.lstrip().startswith("{") and _LOG_HISTORY.search(text[:65536]) is not None


def read_state(log: LogFile) -> Parsed:
    """``trainer_state.json``: one row per ``log_history`` record, its source text as raw."""
    text = log.text
    start = _LOG_HISTORY.search(text)
    if start is None or not text.lstrip().startswith("{"):
        raise MoescopeError(
            f"{log.path} has no log_history list; pass the trainer_state.json the Trainer wrote."
        )
    rows: list[Row] = []
    decoder, pos = json.JSONDecoder(), start.end()
    line, counted = 1, 0  # line numbers counted as the scan goes, not from the top each time
    while True:
        pos = _skip(text, pos, " \t\n\r,")
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            record, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            raise MoescopeError(
                f"{log.path} has a damaged log_history near character {pos}; "
                "pass an intact trainer_state.json."
            ) from None
        line, counted = line + text.count("\n", counted, pos), pos
        if isinstance(record, dict):
            rows.append(flat_row(record, text[pos:end], line))
        pos = end
    keys = {k for row in rows for k in row.metrics}
    return Parsed(rows, guess_framework(keys, ("trl", "ms-swift")) or "trl", lines=len(rows))


def _skip(text: str, pos: int, chars: str) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def is_record(line: str) -> bool:
    """A console line that holds (the start of) a Python-dict log record, or is one without its
    braces; not a dict that closes on the line without a number among its values (mmengine's
    ``initialize ResNet with init_cfg {'type': 'Pretrained', 'checkpoint': …}``: a config)."""
    start = DICT_START.search(line)
    if start is None:
        return BARE_DICT.match(line) is not None
    return "}" not in line[start.end() :] or _NUMBER_VALUE.search(line, start.start()) is not None


# a value that is a number: "'loss': 0.5", "'loss': '0.5'", "'loss': nan", "'loss': tensor(0.5)"
_NUMBER_VALUE = re.compile(r"""['"]\s*:\s*(?:tensor\(\s*)?['"]?[-+]?(?:\d|\.\d|nan|inf)""", re.IGNORECASE)


def read_console(log: LogFile) -> Parsed:
    """Every dict record of a TRL / HF Trainer / ms-swift / slime console log."""
    bars: list[tuple[Row, int, int]] = []  # a row without a step, and the bar glued in front of it
    beside: list[tuple[Row, int, int]] = []  # ... and the bar on a line of its own next to it
    bar_lines: list[int] = []  # the line of each bar beside a record
    parsed_notes: list[str] = []
    cut: set[int] = set()  # lines of records the paste cut short

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        opened = _gathered(lines, i)
        if opened is None:
            return _bare(lines, i)
        match, text, end = opened
        record = _literal(text, match.start())
        if record is None:
            record = _cut_literal(text, match.start())
            if record is None:
                return None
            parsed_notes.append(
                f"the record at line {i + 1} is cut short; read from its {len(record)} complete pairs"
            )
            cut.add(i + 1)
        prefix = text[: match.start()]
        named = _PREFIX_STEP.search(prefix)
        row = flat_row(record, "\n".join(lines[i:end]), i + 1, int(named.group(1)) if named else None)
        counts = _BAR.findall(prefix)
        if row.step is None and counts:
            bars.append((row, int(counts[-1][0]), int(counts[-1][1])))
        elif row.step is None and (near := _bar_beside(lines, i, end)):
            at, counts = near
            beside.append((row, int(counts[-1][0]), int(counts[-1][1])))
            bar_lines.append(at)
        return [row], end

    parsed = scan(log.lines, parse_at)
    parsed.notes += parsed_notes + _cut_steps(parsed.rows, cut)
    if not bars and _one_bar_beside_each(beside, bar_lines, parsed.rows):
        bars = beside
    if bars:
        total = Counter(t for _, _, t in bars).most_common(1)[0][0]
        for row, count, bar_total in bars:
            row.step = count if bar_total == total else None
        parsed.notes.append(f"steps were taken from the progress bar glued to each record (n/{total})")
        _steps_before_the_first_bar(parsed.rows)
    rows = _echoes_merged(parsed.rows)
    parsed.rows = _node_copies_merged(rows)
    if copies := len(rows) - len(parsed.rows):
        parsed.notes.append(f"{copies} copies of records that several hosts printed were merged into them")
    parsed.framework = guess_framework({k for row in parsed.rows for k in row.metrics}, CONSOLE_FRAMEWORKS)
    return parsed


def _steps_before_the_first_bar(rows: list[Row]) -> None:
    """Records pasted before the first one a bar counts (the paste began after their bar) are
    the logging steps before it, at the interval the next two bars show, where those are steps
    at all: otherwise the first would join the next record's step and lose its values to it."""
    stepped = [(i, row.step) for i, row in enumerate(rows) if row.step is not None][:2]
    if len(stepped) < 2 or stepped[0][0] == 0:
        return
    (first, step), (_, following) = stepped
    interval = following - step
    if interval <= 0 or step - first * interval < 0:
        return
    for i in range(first):
        rows[i].step = step - (first - i) * interval


def _bar_beside(lines: list[str], start: int, end: int) -> tuple[int, list[tuple[str, str]]] | None:
    """The line and counts of a progress bar on a line of its own right before the record, else
    right after it: HF draws the bar before it prints a record and redraws it after, on the same
    step, and a paste whose carriage returns became new lines puts each drawing on a line."""
    for at in (_text_line(lines, start, -1), _text_line(lines, end - 1, 1)):
        if at is not None and DICT_START.search(lines[at]) is None and (found := _BAR.findall(lines[at])):
            return at, found
    return None


def _one_bar_beside_each(beside: list[tuple[Row, int, int]], bar_lines: list[int], rows: list[Row]) -> bool:
    """Whether every record without a step of its own has a bar of one total beside it, counting
    up from record to record (or the same count: an evaluation record on the training record's
    step): a bar next to one record only is as likely a data-loading or evaluation bar (``7/7
    [00:00<…]``), and one bar between two records, read for both, is neither's for sure."""
    stepless = sum(1 for row in rows if row.step is None)
    one_total = len({total for _, _, total in beside}) == 1
    own_bars = len(set(bar_lines)) == len(bar_lines)
    rising = all(
        a < b or (a == b and _evaluation(row.metrics)) for (_, a, _), (row, b, _) in pairwise(beside)
    )
    return bool(beside) and len(beside) == stepless and one_total and own_bars and rising


def _evaluation(metrics: dict[str, Any]) -> bool:
    """An evaluation record (``{'eval_loss': …, 'epoch': …}``): HF prints it on the step of the
    training record before it."""
    return any(k.startswith("eval_") for k in metrics) and all(
        k.startswith("eval_") or k == "epoch" for k in metrics
    )


def _text_line(lines: list[str], i: int, direction: int) -> int | None:
    """The first line from ``i`` on in ``direction`` (not ``i`` itself) that is not blank."""
    j = i + direction
    while 0 <= j < len(lines) and not lines[j].strip():
        j += direction
    return j if 0 <= j < len(lines) else None


def _echoes_merged(rows: list[Row]) -> list[Row]:
    """A record printed twice in a row as one: LLaMA-Factory's callback logs the Trainer's record
    rounded (``{'loss': 0.0000, 'learning_rate': 4.9999e-02, 'epoch': 0.01}``) next to the
    Trainer's own, which has more keys. The echo is the record whose keys are strictly fewer, on
    the same step and epoch, its values the other's to the rounding printed; the fuller record
    stays."""
    out: list[Row] = []
    for row in rows:
        last = out[-1] if out else None
        if last is not None and _echo(last, row):
            fuller = row if len(row.metrics) > len(last.metrics) else last
            out[-1] = Row(
                last.step if last.step is not None else row.step,
                fuller.metrics,
                last.raw + "\n" + row.raw,
                last.line,
            )
        else:
            out.append(row)
    return out


def _node_copies_merged(rows: list[Row]) -> list[Row]:
    """One record as every node of a multi-node launch prints it, as one: pdsh (DeepSpeed's
    multi-node runner) puts the host in front of each line (``10.96.202.43: {'loss': 0.56, …}``),
    so the same record follows itself once a host. A copy is a record equal to the one before it,
    on the same step, from a host not yet seen printing it."""
    out: list[Row] = []
    hosts: set[str] = set()
    for row in rows:
        host = _host(row.raw)
        last = out[-1] if out else None
        if host and last is not None and host not in hosts and _same_record(last, row):
            last.raw += "\n" + row.raw
            hosts.add(host)
            continue
        out.append(row)
        hosts = {host} if host else set()
    return out


def _host(raw: str) -> str | None:
    label = _HOST_LABEL.match(raw)
    return label.group(1) if label else None


def _same_record(a: Row, b: Row) -> bool:
    if a.step != b.step or a.metrics.keys() != b.metrics.keys():
        return False
    return all(_identical(a.metrics[k], b.metrics[k]) for k in a.metrics)


def _identical(a: Any, b: Any) -> bool:
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return both_nan or a == b


def _echo(a: Row, b: Row) -> bool:
    small, big = (a, b) if len(a.metrics) < len(b.metrics) else (b, a)
    if not (small.metrics.keys() < big.metrics.keys()) or "epoch" not in small.metrics:
        return False
    if a.step is not None and b.step is not None and a.step != b.step:
        return False
    return all(_agrees(v, big.metrics[k]) for k, v in small.metrics.items())


def _agrees(rounded: Any, value: Any) -> bool:
    """``value`` printed with ``rounded``'s precision (4 decimals or 5 significant digits)."""
    if not (isinstance(rounded, int | float) and isinstance(value, int | float)):
        return rounded == value
    if math.isnan(rounded) or math.isnan(value):
        return math.isnan(rounded) and math.isnan(value)
    return math.isclose(rounded, value, rel_tol=1e-4, abs_tol=5e-5)


def _gathered(lines: list[str], i: int) -> tuple[re.Match[str], str, int] | None:
    """The dict opening on line ``i``: where it opens, the text of the lines it spans (printed
    over several lines, or wrapped between its pairs) and the index after them."""
    match = DICT_START.search(lines[i])
    if match is None:
        return None
    text, end = gather(lines, i, lambda t: _dict_end(t, match.start()) is not None, _continues)
    return match, text, end


def dict_over_lines(lines: list[str], i: int) -> tuple[dict[str, Any], int] | None:
    """The whole dict record opening on line ``i`` and the index after its last line, or ``None``
    where none opens there or it does not parse (for a reader whose step line announces it)."""
    opened = _gathered(lines, i)
    record = None if opened is None else _literal(opened[1], opened[0].start())
    return None if record is None or opened is None else (record, opened[2])


def _bare(lines: list[str], i: int) -> tuple[list[Row], int] | None:
    """The record of a line that is a dict's body without its braces, braces put back."""
    if BARE_DICT.match(lines[i]) is None:
        return None
    record = _literal("{" + lines[i].strip().rstrip(",") + "}", 0)
    return None if record is None else ([flat_row(record, lines[i], i + 1)], i + 1)


def _continues(joined: str, piece: str) -> bool:
    """Whether ``piece`` goes on the dict still open in ``joined``: any line but one that opens
    a new dict or draws a bar. A line of ``'key': value, …`` pairs is the open dict's next line
    (a record printed over several lines, or wrapped between its pairs), not a record of its own."""
    return DICT_START.search(piece) is None and _BAR.search(piece) is None


def _dict_end(text: str, start: int) -> int | None:
    """Index after the ``}`` that closes the dict opened at ``start`` (quotes respected)."""
    return next(
        (pos + 1 for pos, char, depth in _structure(text, start) if depth == 0 and char in "}])"), None
    )


def _structure(text: str, start: int) -> Iterator[tuple[int, str, int]]:
    """``(position, character, depth after it)`` of every bracket and comma from ``start`` on,
    outside quoted strings; it stops where the bracket opened at ``start`` closes."""
    depth, quote, escaped = 0, "", False
    for pos in range(start, len(text)):
        char = text[pos]
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "{[(,}])":
            depth += 1 if char in "{[(" else -1 if char in "}])" else 0
            yield pos, char, depth
            if depth == 0:
                return


def _literal(text: str, start: int) -> dict[str, Any] | None:
    """The dict at ``text[start:]``; values that are no literal (``nan``, ``np.float64(…)``)
    are read as numbers, anything else is kept as its source text."""
    end = _dict_end(text, start)
    if end is None or end - start > 1_000_000:
        return None
    try:
        with warnings.catch_warnings():  # e.g. a SyntaxWarning for "\d" in a logged string
            warnings.simplefilter("ignore")
            node = ast.parse(text[start:end], mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(node, ast.Dict):
        return None
    return {
        key.value: _value(value)
        for key, value in zip(node.keys, node.values, strict=True)
        if isinstance(key, ast.Constant) and isinstance(key.value, str)
    }


def _cut_steps(rows: list[Row], cut: set[int]) -> list[str]:
    """Give a cut record whose step key was cut away the step after the record before it (by
    the interval between the stepped records before, else 1): it was printed later, so it is not
    the earlier record's step, where a record without a step would be merged."""
    notes = []
    for k, row in enumerate(rows):
        if row.line not in cut or row.step is not None:
            continue
        before = [r.step for r in rows[:k] if r.step is not None]
        if before:
            interval = before[-1] - before[-2] if len(before) > 1 and before[-1] > before[-2] else 1
            row.step = before[-1] + interval
            notes.append(f"the cut record at line {row.line} lost its step key; put on step {row.step}")
    return notes


def _cut_literal(text: str, start: int) -> dict[str, Any] | None:
    """The complete pairs of a dict the paste cut short, before its ``}`` (the last record of a
    copied terminal, or one the page truncated): closed after its last whole ``key: value,``.
    Two pairs at least, so that a stray ``{'`` in prose is not read as a record."""
    for cut in _top_commas(text, start)[-_CUT_TRIES:][::-1]:
        record = _literal(text[start:cut] + "}", 0)
        if record is not None:
            return record if len(record) >= 2 else None
    return None


def _top_commas(text: str, start: int) -> list[int]:
    """Positions of the commas between the pairs of the dict opened at ``start``."""
    return [pos for pos, char, depth in _structure(text, start) if char == "," and depth == 1]


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | None):
        return quoted_number(node.value)
    source = ast.unparse(node)
    try:
        return parse_number(source)
    except ValueError:
        literal = load_json(source)  # a list of numbers and the like
        return source if literal is None else literal
