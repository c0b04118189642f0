"""``cost_table``: devices and cost of RL-training a model and its proxies, one row each.

Examples
--------
>>> from moescope.export.cost.shape import reference_models
>>> table = cost_table(reference_models()[5])  # DeepSeek-V3
>>> table["experts"].tolist(), table["devices"].tolist(), table["reduction_pct"].round(1).tolist()
([256, 128, 64, 32], [267, 137, 72, 40], [0.0, 48.7, 73.0, 85.0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError
from moescope.export.cost.memory import GB, TrainingMemory, devices_needed
from moescope.export.cost.shape import ModelShape, reference_models

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PretrainedConfig

DEFAULT_KEEPS = ("1/2", "1/4", "1/8")

COLUMNS = (
    "model",
    "keep",
    "experts",
    "top_k",
    "params_total",
    "params_routed",
    "params_active",
    "state_gb",
    "devices",
    "reduction_pct",
    "step_time_s",
    "device_hours",
    "note",
)
_INTEGER_COLUMNS = ("experts", "top_k", "params_total", "params_routed", "params_active", "devices")


def cost_table(
    model: ModelShape | PretrainedConfig | Mapping[str, Any] | str | Path,
    keeps: Sequence[str | float | int] = DEFAULT_KEEPS,
    *,
    memory: TrainingMemory | None = None,
    step_time_s: float | Mapping[str, float] | None = None,
    rounding: str = "device",
    strict: bool = True,
) -> pd.DataFrame:
    """Devices and cost of RL-training the full model and its proxies, one row each.

    Parameters
    ----------
    model : a :class:`ModelShape`, or anything :meth:`ModelShape.from_config` reads.
    keeps : proxies to cost, in moescope's keep grammar (``"1/4"``, ``0.25``, ``8``).
    step_time_s : seconds per RL step, one for every row (the best case for a proxy), or
        measured per row, keyed by ``"full"`` and the keeps as given (``{"full": 610, "1/2": 480}``).
    strict : raise on a keep the model's routing does not allow; else keep the row, empty
        but for ``note`` (which, on the full row, carries the model's own note).

    Returns
    -------
    One row per configuration (``COLUMNS``): ``reduction_pct`` is ``100·(1 − devices /
    full devices)``, ``device_hours`` is devices × step time / 3600 (NaN without a step time).

    Examples
    --------
    >>> t = cost_table("toy", step_time_s=60.0)
    >>> list(t["keep"]), int(t["devices"].iloc[0]), round(float(t["device_hours"].iloc[0]), 4)
    (['full', '1/2', '1/4', '1/8'], 1, 0.0167)
    """
    import pandas as pd

    shape = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
    memory = memory or TrainingMemory()
    full = devices_needed(shape, memory, rounding)
    rows = [_row(shape, "full", full, full, memory, _step_time(step_time_s, "full"))]
    for keep in keeps:
        label = str(keep)
        try:
            proxy = shape.with_keep(keep)
        except MoescopeError as exc:
            if strict:
                raise
            rows.append({"model": shape.name, "keep": label, "top_k": shape.top_k, "note": str(exc)})
            continue
        devices = devices_needed(proxy, memory, rounding)
        rows.append(_row(proxy, label, devices, full, memory, _step_time(step_time_s, label)))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["note"] = frame["note"].fillna("")
    return frame.astype({column: "Int64" for column in _INTEGER_COLUMNS})


def _step_time(step_time_s: float | Mapping[str, float] | None, label: str) -> float:
    value = step_time_s.get(label) if isinstance(step_time_s, Mapping) else step_time_s
    if value is None:
        return math.nan
    if not value > 0:
        raise MoescopeError(f"step time {value} s is not positive; pass the seconds one RL step takes.")
    return float(value)


def _row(
    shape: ModelShape, label: str, devices: int, full: int, memory: TrainingMemory, step_time: float
) -> dict[str, Any]:
    return {
        "model": shape.name,
        "keep": label,
        "experts": shape.routed_experts,
        "top_k": shape.top_k,
        "params_total": shape.params_total,
        "params_routed": shape.params_routed,
        "params_active": shape.params_active,
        "state_gb": shape.params_total * memory.bytes_per_param / GB,
        "devices": devices,
        "reduction_pct": 100.0 * (1 - devices / full),
        "step_time_s": step_time,
        "device_hours": devices * step_time / 3600,
        "note": shape.note if label == "full" else "",
    }


def reference_table(
    keeps: Sequence[str | float | int] = DEFAULT_KEEPS,
    *,
    memory: TrainingMemory | None = None,
    step_time_s: float | None = None,
    rounding: str = "device",
) -> pd.DataFrame:
    """:func:`cost_table` of every reference model, stacked; a keep a model cannot take is noted.

    Examples
    --------
    >>> t = reference_table()
    >>> reduction = t.pivot(index="model", columns="keep", values="reduction_pct")
    >>> reduction.loc["DeepSeek-V3", ["1/2", "1/4", "1/8"]].round(1).tolist()
    [48.7, 73.0, 85.0]
    """
    import pandas as pd

    tables = [
        cost_table(shape, keeps, memory=memory, step_time_s=step_time_s, rounding=rounding, strict=False)
        for shape in reference_models()
    ]
    return pd.concat(tables, ignore_index=True)
