"""JSON records of results (fidelity, healing): plain values, atomic files, one-sentence errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from moescope._util.io import write_atomic
from moescope.errors import MoescopeError


def jsonable(value: Any) -> Any:
    """Nested dicts and lists with numpy scalars made plain and non-finite floats made ``None``
    (strict JSON, as the manifest is written)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_record(path: str | Path, record: dict[str, Any]) -> Path:
    """Indented strict JSON, written to a temporary sibling and renamed into place."""
    return write_atomic(path, (json.dumps(jsonable(record), indent=2, allow_nan=False) + "\n").encode())


def read_record(path: str | Path, kind: str, fix: str) -> dict[str, Any]:
    """A record of ``kind`` written by :func:`write_record`; ``fix`` ends the error sentence."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise MoescopeError(f"{path} is not a readable JSON file ({err}); {fix}.") from None
    check_kind(data, kind, fix)
    return data


def check_kind(data: Any, kind: str, fix: str) -> None:
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise MoescopeError(f"this is not a {kind} record; {fix}.")
