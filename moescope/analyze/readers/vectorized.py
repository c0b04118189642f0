"""A large log of one uniform line shape, read a column at a time: the fast path of ``read_log``.

Why: the line readers cost ~20 µs a line in Python, 60–100x the time it takes to read the
lines; a training log of a few hundred megabytes took minutes. A log that is one line shape
repeated (verl's ``step:N - key:value …``, Megatron's ``iteration N/ M | key: value | …``,
mmengine / XTuner's ``Iter(train) [N/M]  key: value  …``) is read here with pyarrow.compute
kernels over the whole file instead: the lines are cut by a newline scan, split at the
format's separators, and the values cast to numbers a column at a time, with no Python loop
over lines or fields. The rows made are exactly those the line reader makes of that file.

What it takes: a file of at least :data:`MIN_BYTES`, detected (or given) as ``verl-console``,
``megatron`` or ``records`` (mmengine's ``Iter(train)`` lines), whose every line is a step line
of that format with the same keys in the same order, read from plain numbers: ASCII text
without control bytes (no colour codes, no ``\\r``), no blank lines, no rank labels, and steps
that only rise. Everything a line reader would note, merge or fold is left to it: a warning or
overflow line, a wrapped or duplicated record, a validation line, a key that shows or vanishes
(Megatron's NaN loss), a value that is not a plain number (``nan.0``, ``np.float64(…)``,
``True``), a key that sets up the run as :mod:`~moescope.analyze.readers.hints` reads it. On any
of these :func:`read` returns ``None`` and the file is read line by line as before. Every byte
of a line taken is a head the format's pattern reads, a separator, a key (checked once per
distinct key) or a value the cast read, so the setup hints' words can only stand in a key,
where they are looked for. The first :data:`SAMPLE` lines are also read by the line reader,
and any difference from the rows made here declines the file.

Detection reads only the head of the file (the whole-file reader decodes every line first):
its vote ends after :data:`~moescope.analyze.readers.detect.ENOUGH` recognised lines, which a
taken file has in its head, and no line of a taken file can start a notebook table (verl's and
mmengine's lines hold no ``|``, Megatron's end in one), so the head gives the whole file's answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from itertools import islice, repeat
from pathlib import Path
from typing import Any

import numpy as np

from moescope.analyze.readers import megatron, records
from moescope.analyze.readers._text import MAX_LINE, LogFile
from moescope.analyze.readers.detect import ENOUGH, sniff
from moescope.analyze.readers.hints import ratio_level, recompute
from moescope.analyze.readers.keymap import rename
from moescope.errors import MoescopeError
from moescope.schema import RAW, STEP
from moescope.traces import Trace

try:  # pyarrow comes with moescope[analysis]; without it every log takes the line reader
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError:  # pragma: no cover - the test environment has pyarrow
    pa = pc = None

ENABLED = True  # off: every log is read line by line (the tests compare both ways)
MIN_BYTES = 4 << 20  # smaller logs read fast enough line by line, and keep today's path
HEAD_LINES = 1000  # lines detection is given (at least 64 KiB of them): it reads 500 of a taken log
HEAD_BYTES = 70_000  # more than LogFile.head gives the trainer-state test
SAMPLE = 200  # first lines also read by the line reader, whose rows must be the same
CHUNK = 1 << 16  # lines parsed at a time (bounds the memory of the intermediate arrays)
# bytes a taken file may hold: printable ASCII and the newline
_PRINTABLE = bytes(range(32, 127)) + b"\n"
_WORDS = ("gspo", "sequence", "recompute", "overflow", "training epoch", "[repeated")
_INT_TEXT = re.compile(r"[-+]?\d+")
_CLOCK_TEXT = re.compile(r"\d+(?::\d+)+")  # mmengine's "eta: 1:07:12", which its reader drops
_WHOLE = r"^[-+]?[0-9]+\.?$"  # a whole number's text: an int to the line readers, or "5." (records: "5")
Reference = Callable[[LogFile, str], Trace]


@dataclass(frozen=True)
class _Shape:
    """A format's step line: an anchored head (RE2, groups ``head`` and ``step``), then fields
    ``key<kvsep>value`` between ``sep``; ``trim``: keys and values are read stripped (Megatron);
    ``trailing``: every line ends in ``sep`` (Megatron's ``… | key: value |``)."""

    head: str
    sep: str
    kvsep: str
    key: re.Pattern[str]
    names: Callable[[dict[str, int]], tuple[dict[str, int], list[str]]]
    trim: bool = False
    trailing: bool = False
    clock: bool = False  # a column of clock times is dropped (the records reader drops "eta")
    needs_loss: bool = False  # Megatron marks a line without a loss: such files are not taken


def _records_names(metrics: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    return rename("moescope", records.canonical_names("mmengine", metrics))


SHAPES: dict[str, _Shape] = {
    "verl-console": _Shape(
        head=r"^(?P<head>\n?(?:\((?:TaskRunner|main_task) pid=[0-9]+\) )?step:(?P<step>[0-9]{1,15}))",
        sep=" - ",
        kvsep=":",
        key=re.compile(r"[A-Za-z_][^\s:\[|]*"),  # verl's key; no "[repeated …]", no table bar
        names=lambda metrics: rename("verl", metrics),
    ),
    "megatron": _Shape(
        head=(
            r"^(?P<head>\n? *(?:\[[0-9][0-9:. \-]*\] *)?iteration +(?P<step>[0-9]{1,15}) */ *[0-9]{1,15} *\|)"
        ),
        sep="|",
        kvsep=":",
        key=re.compile(r"[^|:\s](?:[^|:]*[^|:\s])?"),
        names=lambda metrics: rename("megatron", metrics),
        trim=True,
        trailing=True,
        needs_loss=True,
    ),
    "records": _Shape(
        head=(
            r"^(?P<head>\n?[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} - mmengine - INFO - "
            r"Iter\(train\) \[ *(?P<step>[0-9]{1,15})/[0-9]{1,15}\])"
        ),
        sep="  ",
        kvsep=": ",
        key=re.compile(r"[A-Za-z_][\w./]*"),
        names=_records_names,
        clock=True,
    ),
}


@dataclass
class _Columns:
    """What the lines of a file (or a chunk of them) hold: steps, the keys of every line in
    order, each key's kind (``int``, ``float`` or ``clock``) and the kept keys' values."""

    steps: np.ndarray
    keys: tuple[str, ...]
    kinds: tuple[str, ...]
    values: list[np.ndarray]  # one per key that is no clock, int64 or float64


class _Lines(LogFile):
    """A log whose lines are given (the head of a file): detection and the line reader read
    them as they read a whole file's."""

    def __init__(self, path: Path, lines: list[str]) -> None:
        super().__init__(path)
        self._given = lines

    @cached_property
    def lines(self) -> list[str]:
        return self._given


def read(path: Path, format: str | None, reference: Reference) -> Trace | None:
    """The trace of ``path`` read column-wise, or ``None`` where the line reader must read it.

    ``reference(log, format)`` is the line reader's trace of a :class:`LogFile`: the first
    :data:`SAMPLE` lines are read by it too, and the file is declined unless the rows agree.
    """
    if not ENABLED or pa is None or (format is not None and format not in SHAPES):
        return None
    try:
        data = _plain_text(path) if path.is_file() and path.stat().st_size >= MIN_BYTES else None
    except OSError:
        return None
    if data is None:
        return None
    offsets = _line_offsets(data)
    if offsets is None:
        return None
    lines = len(offsets) - 1
    taken = min(lines, max(HEAD_LINES, int(np.searchsorted(offsets, HEAD_BYTES)) + 1))
    head = data[: offsets[taken]].decode("ascii").split("\n")
    if format is None:
        try:
            found = sniff(_Lines(path, head))
        except MoescopeError:
            return None
        if taken < lines and found.counts.total() < ENOUGH:  # detection would read past the head
            return None
        format = found.format
    shape = SHAPES.get(format)
    if shape is None:
        return None
    try:
        columns = _parse(data, offsets, shape)
    except pa.ArrowException:  # a kernel that cannot read some line: the line reader can
        return None
    if columns is None:
        return None
    raws = _raw_lines(data, offsets)
    del data  # the lines' text is in raws now: the file's bytes are not held beside the trace
    return _trace(path, format, shape, columns, raws, head[:SAMPLE], reference)


def _plain_text(path: Path) -> bytearray | None:
    """The file's bytes where it is printable ASCII whose every :data:`MAX_LINE` bytes hold a
    newline, read a block at a time: a binary file or one line of a gigabyte is declined
    (``None``) a block in, not read whole (the line reader reads at most ``MAX_LINE`` bytes of a
    line)."""
    data = bytearray()
    with path.open("rb") as f:
        while block := f.read(MAX_LINE):
            if block.translate(None, _PRINTABLE) or (len(block) == MAX_LINE and b"\n" not in block):
                return None
            data += block
    return data


def _line_offsets(data: bytes | bytearray) -> np.ndarray | None:
    """Where each line starts, as Arrow offsets: every line but the first starts at the newline
    before it (so no line ends in one), the last ends where the text does. ``None`` for a file
    with a blank line or a line of ``MAX_LINE`` bytes or more."""
    raw = np.frombuffer(data, dtype=np.uint8)
    blocks = [np.zeros(1, np.int64)]
    for lo in range(0, len(raw), 1 << 20):  # a block at a time: fast and small
        blocks.append(np.flatnonzero(raw[lo : lo + (1 << 20)] == 10).astype(np.int64) + lo)
    offsets = np.concatenate(blocks)
    if offsets[-1] != len(data) - 1 or len(offsets) == 1:  # the last line without a newline
        offsets = np.append(offsets, len(data))
    lengths = np.diff(offsets)
    lengths[1:] -= 1  # without the newline each line starts with
    if len(lengths) == 0 or lengths.min() < 1 or lengths.max() >= MAX_LINE:
        return None
    return offsets


def _parse(data: bytes | bytearray, offsets: np.ndarray, shape: _Shape) -> _Columns | None:
    """The columns of every line, a chunk of lines at a time; ``None`` where a line is not the
    shape's or a chunk's keys differ from the first's."""
    n = len(offsets) - 1
    lines = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
    parts: list[_Columns] = []
    for lo in range(0, n, CHUNK):
        part = _chunk(lines.slice(lo, min(CHUNK, n - lo)), shape)
        if part is None or (parts and (part.keys, part.kinds) != (parts[0].keys, parts[0].kinds)):
            return None
        parts.append(part)
    steps = np.concatenate([p.steps for p in parts])
    if len(steps) > 1 and not (np.diff(steps) > 0).all():  # a repeated or restarted step: merged, noted
        return None
    values = [np.concatenate([p.values[j] for p in parts]) for j in range(len(parts[0].values))]
    return _Columns(steps, parts[0].keys, parts[0].kinds, values)


def _np(array: Any) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _list_offsets(lists: Any) -> np.ndarray:
    """A list array's offsets from 0 (a sliced one starts further on)."""
    offsets = _np(lists.offsets).astype(np.int64)
    return offsets - offsets[0]


def _list_values(lists: Any) -> Any:
    """A list array's values, only those of its own lists."""
    offsets = _list_offsets(lists)
    return lists.values.slice(lists.offsets[0].as_py(), offsets[-1])


def _string_lengths(strings: Any) -> np.ndarray:
    """The byte length of each string, from its offsets buffer (no copy of the text)."""
    kind = np.int64 if pa.types.is_large_string(strings.type) else np.int32
    offsets = np.frombuffer(strings.buffers()[1], dtype=kind)
    return np.diff(offsets[strings.offset : strings.offset + len(strings) + 1]).astype(np.int64)


def _chunk(lines: Any, shape: _Shape) -> _Columns | None:
    """The columns of one chunk of lines, or ``None`` where one line is not the shape's."""
    count = len(lines)
    head = pc.extract_regex(lines, shape.head)
    if head.null_count:
        return None
    head_ends = _string_lengths(pc.struct_field(head, "head"))
    steps = _np(pc.cast(pc.struct_field(head, "step"), pa.int64()))
    pieces = pc.split_pattern(lines, shape.sep)
    bounds = _list_offsets(pieces)
    flat = _list_values(pieces)
    lengths = _string_lengths(flat)
    line_of = np.repeat(np.arange(count), np.diff(bounds))
    width = lengths + len(shape.sep)
    before = np.cumsum(width) - width
    start = before - before[bounds[:-1]][line_of]  # each piece's place in its line
    end = start + lengths
    cut = head_ends[line_of]
    if ((start < cut) & (end > cut)).any():  # the head ends inside a piece
        return None
    body = np.flatnonzero(start >= cut)
    per_line = np.bincount(line_of[body], minlength=count)
    fields = int(per_line[0])
    if (per_line != fields).any():
        return None
    if shape.trailing:  # "… | key: value |": a line that ends otherwise reads as a table header
        if fields < 2 or (lengths[body.reshape(count, fields)[:, -1]] != 0).any():
            return None
        body = body.reshape(count, fields)[:, :-1].ravel()
        fields -= 1
    if fields == 0:
        return None
    pairs = pc.split_pattern(flat.take(pa.array(body)), shape.kvsep, max_splits=1)
    pair_bounds = _list_offsets(pairs)
    if (np.diff(pair_bounds) != 2).any():  # a field without kvsep
        return None
    parts = _list_values(pairs)
    keys = pc.dictionary_encode(parts.take(pa.array(pair_bounds[:-1])))
    texts = parts.take(pa.array(pair_bounds[:-1] + 1))
    if shape.trim:
        texts = pc.ascii_trim_whitespace(texts)
    names = [k.strip() if shape.trim else k for k in keys.dictionary.to_pylist()]
    codes = _np(keys.indices).astype(np.int64).reshape(count, fields)
    order = tuple(names[c] for c in codes[0])
    if len(set(order)) < fields or not all(shape.key.fullmatch(k) and _quiet(k) for k in order):
        return None
    place = {name: j for j, name in enumerate(order)}
    if (np.array([place.get(name, -1) for name in names])[codes] != np.arange(fields)).any():
        return None  # a line with other keys, or in another order
    return _values(steps, order, texts, shape)


def _quiet(key: str) -> bool:
    """A key that says nothing the line reader would act on beyond its value: no setup hint
    (:mod:`~moescope.analyze.readers.hints`), no overflow, no other line's marker."""
    low = key.lower()
    return not any(word in low for word in _WORDS) and ratio_level([key]) is None and recompute([key]) is None


def _values(steps: np.ndarray, keys: tuple[str, ...], texts: Any, shape: _Shape) -> _Columns | None:
    """The values of ``texts`` (line after line, ``len(keys)`` a line) read as the line readers
    read them: a column of whole numbers as ints, any other as floats, a clock column dropped."""
    count, fields = len(steps), len(keys)
    kinds = tuple(_kind(text, shape.clock) for text in texts.slice(0, fields).to_pylist())
    kept = np.array([kind != "clock" for kind in kinds])
    for j in np.flatnonzero(~kept):
        clocks = texts.take(pa.array(np.arange(j, count * fields, fields)))
        if not pc.all(pc.match_substring_regex(clocks, r"^[0-9]+(?::[0-9]+)+$")).as_py():
            return None
    if not kept.any():
        return None
    numbers = texts if kept.all() else texts.filter(pa.array(np.tile(kept, count)))
    width = int(kept.sum())
    try:
        floats = _np(pc.cast(numbers, pa.float64())).reshape(count, width)
    except pa.ArrowInvalid:  # a value that is no plain number
        return None
    kept_kinds = [kind for kind in kinds if kind != "clock"]
    values: list[np.ndarray] = []
    for j, kind in enumerate(kept_kinds):
        column = floats[:, j]
        where = np.arange(j, count * width, width)
        if kind == "int":
            try:  # digits only: the float cast took them, so no hex; "+5" or 19 digits decline
                values.append(_np(pc.cast(numbers.take(pa.array(where)), pa.int64())))
            except pa.ArrowInvalid:
                return None
            continue
        # a whole number among floats would be an int to the line reader ("5." a field's end
        # to the records reader); "nan(…)" is a NaN to the cast only
        whole = where[np.isfinite(column) & (column == np.floor(column))]
        if len(whole) and pc.any(pc.match_substring_regex(numbers.take(pa.array(whole)), _WHOLE)).as_py():
            return None
        nans = np.flatnonzero(np.isnan(column))
        if len(nans) and any("(" in t for t in numbers.take(pa.array(where[nans])).to_pylist()):
            return None
        values.append(column)
    return _Columns(steps, keys, kinds, values)


def _kind(text: str, clock: bool) -> str:
    """A column's kind, from its first value: ``clock`` (dropped), ``int`` or ``float``."""
    if clock and _CLOCK_TEXT.fullmatch(text):
        return "clock"
    return "int" if _INT_TEXT.fullmatch(text) else "float"


def _trace(
    path: Path,
    format: str,
    shape: _Shape,
    columns: _Columns,
    raws: list[str],
    sample: list[str],
    reference: Reference,
) -> Trace | None:
    """The trace of the columns (``raws`` each line's text), checked against the line reader's
    trace of the ``sample``."""
    kept = [key for key, kind in zip(columns.keys, columns.kinds, strict=True) if kind != "clock"]
    named, kept_own = shape.names({key: j for j, key in enumerate(kept)})
    if kept_own or STEP in named or RAW in named:  # a note, or a key moved: the line reader's
        return None
    if shape.needs_loss and not any(megatron._is_loss(key) for key in kept):
        return None
    lists = []
    for j in named.values():
        column = columns.values[j]
        values = column.tolist()
        if column.dtype.kind == "f":
            for i in np.flatnonzero(np.isnan(column)).tolist():
                values[i] = math.nan  # the one NaN object the line readers give
        lists.append(values)
    keys = (STEP, *named, RAW)
    rows = zip(columns.steps.tolist(), *lists, raws, strict=True)
    steps = list(map(dict, map(zip, repeat(keys), islice(rows, len(sample)))))
    try:
        expected = reference(_Lines(path, sample), format)
    except MoescopeError:
        return None
    if expected.notes or not _same_steps(expected.steps, steps):
        return None
    steps += map(dict, map(zip, repeat(keys), rows))  # the trace's dicts: much of the time
    return Trace(header=dict(expected.header), steps=steps, path=path, notes=[])


def _raw_lines(data: bytes | bytearray, offsets: np.ndarray) -> list[str]:
    """Each line's text (a step's ``raw``), decoded a chunk of lines at a time: the whole text is
    never held as one string beside its lines."""
    raws: list[str] = []
    count = len(offsets) - 1
    for lo in range(0, count, CHUNK):
        hi = min(lo + CHUNK, count)
        raws += data[int(offsets[lo]) + (lo > 0) : int(offsets[hi])].decode("ascii").split("\n")
    return raws


def _same_steps(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Steps equal key by key in order, each value of the same type (NaN equal to NaN)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if list(x) != list(y):
            return False
        for key, value in x.items():
            other = y[key]
            if type(value) is not type(other):
                return False
            if value != other and not (isinstance(value, float) and math.isnan(value) and math.isnan(other)):
                return False
    return True


__all__ = ["ENABLED", "MIN_BYTES", "SHAPES", "read"]
