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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError
from moescope.export.cost.memory import GB, TrainingMemory, devices_needed, memory_of
from moescope.export.cost.profiles import DeviceProfile
from moescope.export.cost.shape import ModelShape, reference_models
from moescope.export.cost.step import STEP_TERMS, RLWorkload, StepTime, step_time

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
    "devices_given",
    "reduction_pct",
    "step_time_s",
    "step_source",
    "device_hours",
    *STEP_TERMS,
    "layout",
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
    profile: DeviceProfile | None = None,
    workload: RLWorkload | None = None,
    devices: Mapping[str, int] | None = None,
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
    profile : predict each row's step time on this accelerator
        (:func:`~moescope.export.cost.step.step_time`, its terms in the ``*_s`` columns) where no
        measured one is given; its memory sizes the devices unless ``memory`` is given.
    workload : the RL step predicted (default :class:`~moescope.export.cost.step.RLWorkload`).
    devices : device counts to cost instead of the memory model's, keyed like ``step_time_s``
        (say, how a run was really laid out: ``{"full": 512, "16": 64}``).

    Returns
    -------
    One row per configuration (``COLUMNS``): ``reduction_pct`` is ``100·(1 − devices /
    full devices)``, ``device_hours`` is devices × step time / 3600 (NaN without a step time),
    ``step_source`` says whether the step time was ``"measured"`` (given) or ``"predicted"``.

    Examples
    --------
    >>> t = cost_table("toy", step_time_s=60.0)
    >>> list(t["keep"]), int(t["devices"].iloc[0]), round(float(t["device_hours"].iloc[0]), 4)
    (['full', '1/2', '1/4', '1/8'], 1, 0.0167)
    """
    import pandas as pd

    shape = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
    memory = memory_of(memory, profile)
    costing = _Costing(memory, rounding, step_time_s, profile, workload, devices or {})
    rows = [costing.row(shape, "full")]
    full = rows[0]["devices"]
    for keep in keeps:
        label = str(keep)
        try:
            proxy = shape.with_keep(keep)
        except MoescopeError as exc:
            if strict:
                raise
            rows.append({"model": shape.name, "keep": label, "top_k": shape.top_k, "note": str(exc)})
            continue
        rows.append(costing.row(proxy, label, full))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    text = ["note", "layout", "step_source"]
    frame[text] = frame[text].fillna("")
    frame["devices_given"] = frame["devices_given"].fillna(False).astype(bool)
    return frame.astype({column: "Int64" for column in _INTEGER_COLUMNS})


@dataclass(frozen=True)
class _Costing:
    """What every row of one table is costed with."""

    memory: TrainingMemory
    rounding: str
    step_time_s: float | Mapping[str, float] | None
    profile: DeviceProfile | None
    workload: RLWorkload | None
    given_devices: Mapping[str, int]

    def devices(self, shape: ModelShape, label: str) -> int:
        given = self.given_devices.get(label)
        if given is None:
            return devices_needed(shape, self.memory, self.rounding)
        if not (isinstance(given, int) and given > 0):
            raise MoescopeError(f"{given!r} devices for {label}; give a positive whole number.")
        return given

    def row(self, shape: ModelShape, label: str, full: int | None = None) -> dict[str, Any]:
        devices = self.devices(shape, label)
        measured = _measured(self.step_time_s, label)
        predicted: StepTime | None = None
        if measured is None and self.profile is not None:
            predicted = step_time(shape, devices, self.profile, self.workload)
        seconds = measured if measured is not None else predicted.total_s if predicted else math.nan
        source = "measured" if measured is not None else "predicted" if predicted else ""
        return {
            "model": shape.name,
            "keep": label,
            "experts": shape.routed_experts,
            "top_k": shape.top_k,
            "params_total": shape.params_total,
            "params_routed": shape.params_routed,
            "params_active": shape.params_active,
            "state_gb": shape.params_total * self.memory.bytes_per_param / GB,
            "devices": devices,
            "devices_given": label in self.given_devices,
            "reduction_pct": 100.0 * (1 - devices / (full or devices)),
            "step_time_s": seconds,
            "step_source": source,
            "device_hours": devices * seconds / 3600,
            **(predicted.terms() if predicted else dict.fromkeys(STEP_TERMS, math.nan)),
            "layout": predicted.layout() if predicted else "",
            "note": shape.note if label == "full" else "",
        }


def _measured(step_time_s: float | Mapping[str, float] | None, label: str) -> float | None:
    value = step_time_s.get(label) if isinstance(step_time_s, Mapping) else step_time_s
    if value is None:
        return None
    if not value > 0:
        raise MoescopeError(f"step time {value} s is not positive; pass the seconds one RL step takes.")
    return float(value)


def reference_table(
    keeps: Sequence[str | float | int] = DEFAULT_KEEPS,
    *,
    memory: TrainingMemory | None = None,
    step_time_s: float | None = None,
    rounding: str = "device",
    profile: DeviceProfile | None = None,
    workload: RLWorkload | None = None,
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

    options = {"memory": memory, "step_time_s": step_time_s, "rounding": rounding}
    options |= {"profile": profile, "workload": workload}
    tables = [cost_table(shape, keeps, strict=False, **options) for shape in reference_models()]
    return pd.concat(tables, ignore_index=True)
