"""The trace: one replay as JSON Lines, written a step at a time so a crash loses one step at most.

Line 1 is the header ``{"kind": "header", ...}``: schema version, model, the proxy manifest if
the model is a proxy, the full replay config, seed, faults and library versions. Every other
line is ``{"kind": "step", "step": N, ...}`` with the canonical metric keys of
:mod:`moescope.schema` plus arrays (per-layer expert load, token-entropy summary, per-group
gradient norms).

Non-finite floats are written as ``NaN``, ``Infinity`` and ``-Infinity`` — the tokens Python's
``json``, pandas and JSON5 readers parse — so a NaN or an overflow round-trips exactly; every
finite float is written with Python's shortest round-tripping repr. A line cut short by a
crash (the step in flight) is dropped on reading, with a note.

Examples
--------
>>> import math, tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "trace.jsonl"
>>> with TraceWriter(path, {"model": "toy"}) as w:
...     w.write_step(0, {"actor/loss": float("nan"), "optim/lr": 1e-5})
>>> trace = read_trace(path)
>>> math.isnan(trace.steps[0]["actor/loss"]), trace.header["model"]
(True, 'toy')
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from moescope.errors import MoescopeError
from moescope.schema import SCHEMA_VERSION, STEP

if TYPE_CHECKING:
    import pandas as pd

TRACE_KIND = "moescope.trace"


def dumps(record: dict[str, Any]) -> str:
    """One JSON line; NaN / ±Inf as ``NaN`` / ``Infinity`` tokens (exact round trip)."""
    return json.dumps(record, allow_nan=True, separators=(",", ":"), default=json_value)


def json_value(value: Any) -> Any:
    """numpy / torch scalars and arrays, written as plain JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class TraceWriter:
    """Appends a trace: the header once, then one flushed line per step.

    ``resume=True`` reopens an existing trace after a crash: it keeps the header and the steps
    before ``resume_from`` (dropping a line cut short and any step at or after it) so the
    resumed run continues the same file.
    """

    def __init__(
        self, path: str | Path, header: dict[str, Any], *, resume: bool = False, resume_from: int = 0
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.exists():
            _truncate_to(self.path, resume_from)
            self._file: IO[str] = self.path.open("a", encoding="utf-8")
        else:
            full = {"kind": "header", "format": TRACE_KIND, "schema_version": SCHEMA_VERSION, **header}
            tmp = self.path.with_name(f".{self.path.name}.new")
            tmp.write_text(dumps(full) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)  # an old trace at the path is replaced whole
            self._file = self.path.open("a", encoding="utf-8")

    def write_step(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one step and flush it to the operating system."""
        self._file.write(dumps({"kind": "step", STEP: int(step), **metrics}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _truncate_to(path: Path, resume_from: int) -> None:
    """Keep the header and whole step lines with ``step < resume_from``."""
    kept = []
    with path.open(encoding="utf-8") as handle:
        for i, line in enumerate(handle):
            record = _parse(line)
            if record is None:  # a line cut short by the crash
                break
            if i == 0 or record.get(STEP, -1) < resume_from:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path.with_name(f".{path.name}.resume")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


@dataclass(frozen=True)
class Trace:
    """A trace read back: the header and the step records in order."""

    header: dict[str, Any]
    steps: list[dict[str, Any]]
    path: Path | None = None
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)

    def metric(self, key: str) -> list[float]:
        """One scalar metric over steps (``nan`` where a step lacks it)."""
        return [float(s[key]) if isinstance(s.get(key), int | float) else math.nan for s in self.steps]

    def to_frame(self) -> pd.DataFrame:
        """Scalar metrics as one row per step (arrays left out; see ``steps`` for them)."""
        import pandas as pd

        rows = [
            {k: v for k, v in s.items() if k != "kind" and not isinstance(v, list | dict)} for s in self.steps
        ]
        return pd.DataFrame(rows).set_index(STEP) if rows else pd.DataFrame()


def read_trace(path: str | Path) -> Trace:
    """Read a moescope trace (JSON Lines); a line cut short at the end is dropped with a note."""
    path = Path(path)
    if not path.is_file():
        raise MoescopeError(f"no trace at {path}; pass the file that `moescope replay --out` wrote.")
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        raise MoescopeError(f"{path} is empty; a trace starts with its header line.")
    header = _parse(lines[0])
    if header is None or header.get("format") != TRACE_KIND:
        raise MoescopeError(
            f"{path} is not a moescope trace (no header line); read it with moescope.analyze.readers."
        )
    steps, notes = [], []
    for number, line in enumerate(lines[1:], start=2):
        record = _parse(line)
        if record is None:
            if number == len(lines):
                notes.append(f"line {number} was cut short (a crash mid-step) and is skipped")
                break
            raise MoescopeError(f"{path}:{number} is not valid JSON; the trace is damaged.")
        steps.append(record)
    return Trace(header=header, steps=steps, path=path, notes=notes)
