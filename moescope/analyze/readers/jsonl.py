"""Logs written as one JSON object per line.

- ``moescope``: moescope's own replay traces, read by :func:`moescope.traces.read_trace`;
- ``verl-jsonl``: verl's ``file`` logger, ``{"step": N, "data": {...}}``; it writes with orjson,
  which turns NaN and ±Inf into ``null``, so a ``null`` is kept as ``None`` — "the metric was
  logged but is not a finite number" — distinct from NaN and from a key that is absent;
- ``roll``: ROLL's ``StdoutTracker`` lines, ``metrics_tag: {"step": N, "metrics": {...}}``;
- ``jsonl``: flat objects, one per logging step — ms-swift's ``logging.jsonl`` (TRL's key
  names, the step in ``global_step/max_steps`` as ``"5/100"``), LLaMA-Factory's
  ``trainer_log.jsonl`` (``current_steps``), NeMo Automodel's and any logger like them; the
  framework is guessed from the keys, and names its table lacks are read through the generic one.
  An object printed over several lines (``json.dumps(metrics, indent=2)``, a pasted W&B or
  AllenAct metrics dump) is read as one record: from a line that opens it (``{`` first) to the
  line where its braces balance.

Python's ``json`` reads the ``NaN`` / ``Infinity`` tokens these writers use for non-finite floats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from moescope.analyze.readers._rows import Parsed, Row, epochs_as_steps, flat_row, scan
from moescope.analyze.readers._text import MAX_PIECES, LogFile, as_step
from moescope.analyze.readers.keymap import guess_beyond_generic, guess_framework
from moescope.analyze.readers.records import canonical_names
from moescope.errors import MoescopeError
from moescope.traces import TRACE_KIND, read_trace

_ROLL = re.compile(r"metrics_tag:\s*(\{.*)$")
FLAT_FRAMEWORKS = ("ms-swift", "trl", "verl", "roll", "openrlhf", "nemo-rl", "slime", "prime-rl")
LISTED_ELSEWHERE = ("llamafactory", "nemo-automodel", "tinker", "areal", "nemo")
"""Frameworks named only by their own keys or markers, never by the common names they share."""


def load_json(text: str) -> Any:
    """``json.loads``, or ``None`` for text that is not JSON (however mangled); a value a logger
    wrote as Python prints it (``"loss": nan``, ``inf``: an f-string's JSON) is read as ``NaN`` /
    ``Infinity``, as ``json.dumps`` writes them."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    written = _PYTHON_FLOAT.sub(_as_json_float, text) if "nan" in text or "inf" in text else text
    if written == text:  # no Python float to write as JSON: not JSON, and no second parse
        return None
    try:
        return json.loads(written)
    except (ValueError, RecursionError):
        return None


# a bare nan / inf / -inf where a JSON value stands (after ":", "[" or ","), not inside a string
_PYTHON_FLOAT = re.compile(r"(?<=[:\[,])(\s*)(-?)(nan|inf)(?=\s*[,}\]])")


def _as_json_float(match: re.Match[str]) -> str:
    return match.group(1) + ("NaN" if match.group(3) == "nan" else match.group(2) + "Infinity")


def is_trace_header(line: str) -> bool:
    """The first line of a moescope trace."""
    obj = load_json(line) if line.lstrip().startswith("{") else None
    return isinstance(obj, dict) and obj.get("format") == TRACE_KIND


def classify(line: str) -> tuple[str, dict[str, Any]] | None:
    """The JSON-lines format of ``line`` and its record (ROLL's inner object), if it is one."""
    roll = _ROLL.search(line)
    if roll:
        obj = load_json(roll.group(1))
        return ("roll", obj) if isinstance(obj, dict) else None
    obj = load_json(line) if line.lstrip().startswith("{") else None
    if not isinstance(obj, dict):
        return None
    if obj.get("format") == TRACE_KIND or obj.get("kind") in ("header", "step"):
        return "moescope", obj
    if "step" in obj and isinstance(obj.get("data"), dict):
        return "verl-jsonl", obj
    return "jsonl", obj


def kind(line: str) -> str | None:
    """Which JSON-lines format ``line`` belongs to, if any."""
    found = classify(line)
    return found[0] if found else None


def spread_object(lines: list[str], i: int) -> tuple[dict[str, Any], int] | None:
    """The JSON object printed over the lines from ``lines[i]`` (which opens it) and the index
    after it, or ``None``. Braces are counted to find where it may end, so a dump of
    ``MAX_PIECES`` lines costs one parse, not one per line; a brace inside a string only delays
    the parse to a later balanced line. An element of a list (``trainer_state.json``'s
    ``log_history`` pasted without its head) is read without the comma after it."""
    if not lines[i].lstrip().startswith("{"):
        return None
    depth = 0
    for end in range(i, min(len(lines), i + MAX_PIECES)):
        depth += lines[end].count("{") - lines[end].count("}")
        if depth <= 0 and end > i:  # an element of a pasted JSON list ends "}," (log_history's)
            obj = load_json("\n".join([*lines[i:end], lines[end].rstrip().removesuffix(",")]))
            if isinstance(obj, dict):
                return obj, end + 1
            if depth < 0:
                return None
    return None


def spread_objects(lines: list[str]) -> int:
    """How many JSON objects in ``lines`` are printed over several lines each."""
    count, i = 0, 0
    while i < len(lines):
        found = spread_object(lines, i) if "{" in lines[i] else None
        count, i = (count + 1, found[1]) if found else (count, i + 1)
    return count


def _reader(fmt: str) -> Callable[[list[str], int], tuple[list[Row], int] | None]:
    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        found = classify(lines[i])
        if found is None and fmt == "jsonl" and (spread := spread_object(lines, i)):
            obj, end = spread
            return [flat_row(obj, "\n".join(lines[i:end]), i + 1)], end
        if found is None or found[0] != fmt:
            return None
        obj = found[1]
        if fmt == "roll":
            metrics = obj.get("metrics")
            row = Row(as_step(obj.get("step")), metrics if isinstance(metrics, dict) else {}, lines[i], i + 1)
        elif fmt == "verl-jsonl":
            row = Row(as_step(obj["step"]), obj["data"], lines[i], i + 1)
        else:
            row = flat_row(obj, lines[i], i + 1)
        return [row], i + 1

    return parse_at


def read_verl(log: LogFile) -> Parsed:
    """verl's JSONL file logger."""
    parsed = scan(log.lines, _reader("verl-jsonl"))
    parsed.framework = "verl"
    return parsed


def read_roll(log: LogFile) -> Parsed:
    """ROLL's ``metrics_tag: {...}`` stdout lines."""
    parsed = scan(log.lines, _reader("roll"))
    parsed.framework = "roll"
    return parsed


def read_flat(log: LogFile) -> Parsed:
    """Flat JSON lines (ms-swift ``logging.jsonl`` and the like); the framework is guessed."""
    parsed = scan(log.lines, _reader("jsonl"))
    epochs_as_steps(parsed)
    keys = {k for row in parsed.rows for k in row.metrics}
    parsed.framework = guess_beyond_generic(keys, LISTED_ELSEWHERE) or guess_framework(keys, FLAT_FRAMEWORKS)
    for row in parsed.rows:  # names the framework's table lacks: the generic ones (LLaMA-Factory's lr)
        row.metrics = canonical_names(parsed.framework, row.metrics)
    parsed.keymap = "moescope"
    return parsed


def read_moescope(log: LogFile) -> Parsed:
    """A moescope trace, through :func:`moescope.traces.read_trace`; each step keeps its line as raw."""
    first = next((line for line in log.lines if line.strip()), "")  # empty or binary: explained there
    if not is_trace_header(first):
        raise MoescopeError(
            f"{log.path} is not a moescope trace (its first line is no trace header); "
            "leave format unset to detect what it is."
        )
    try:
        trace = read_trace(log.path)
    except (UnicodeDecodeError, RecursionError) as err:
        raise MoescopeError(
            f"{log.path} is a damaged moescope trace ({err.__class__.__name__}); rerun the replay."
        ) from None
    lines = [line for line in log.lines if line.strip()][1:]
    rows = [flat_row(step, lines[i], i + 2) for i, step in enumerate(trace.steps)]
    header = {k: v for k, v in trace.header.items() if k not in ("kind", "format")}
    return Parsed(rows, "moescope", notes=list(trace.notes), lines=len(lines) + 1, header=header)
