"""The cost table as ``moescope cost`` prints it (a block per model) and as JSON."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from moescope.export.cost.memory import TrainingMemory, memory_of
from moescope.export.cost.profiles import DeviceProfile
from moescope.export.cost.step import RLWorkload

if TYPE_CHECKING:
    import pandas as pd

PROXY_NOTE = (
    "A proxy keeps top-k, so per-token compute (active parameters) stays: device-hours per step "
    "fall by the device ratio only if the step time stays equal."
)
STEP_NOTE = (
    "Predicted step times are first-order bounds added up (moescope.export.cost.step): a proxy on fewer "
    "devices trains each token as slowly per device, and gains where terms shrink with the model or "
    "stop crossing nodes (rollout instances, expert all-to-all, weight sync, pipeline bubble)."
)
_TERMS = {
    "rollout_s": "rollout",
    "training_s": "training",
    "all_to_all_s": "all-to-all",
    "bubble_s": "bubble",
    "optimizer_s": "optimizer",
    "weight_sync_s": "weight sync",
}


def cost_json(
    table: pd.DataFrame,
    memory: TrainingMemory | None = None,
    rounding: str = "device",
    profile: DeviceProfile | None = None,
    workload: RLWorkload | None = None,
) -> dict[str, Any]:
    """The table as JSON-ready data: the assumptions (memory, rounding, and the device and
    workload of predicted step times) and one record per row."""
    records = table.astype(object).where(table.notna(), None).to_dict("records")
    memory = memory_of(memory, profile)
    data = {"memory": memory.to_dict(), "rounding": rounding}
    if profile is not None:
        data |= {"device": profile.to_dict(), "workload": (workload or RLWorkload()).to_dict()}
    return data | {"rows": records}


def cost_text(
    table: pd.DataFrame,
    memory: TrainingMemory | None = None,
    rounding: str = "device",
    profile: DeviceProfile | None = None,
    workload: RLWorkload | None = None,
) -> str:
    """The table as ``moescope cost`` prints it: a block per model, then every assumption."""
    blocks = [_model_text(group) for _, group in table.groupby("model", sort=False)]
    memory = memory_of(memory, profile)
    assumptions = memory.text()
    if rounding != "device":
        assumptions += f" Devices rounded up to a {'node of 8' if rounding == 'node' else 'power of two'}."
    step = [] if profile is None else [profile.text(), (workload or RLWorkload()).text(), STEP_NOTE]
    return "\n\n".join([*blocks, assumptions, *step, PROXY_NOTE])


def _model_text(group: pd.DataFrame) -> str:
    full = group.iloc[0]
    share = full["params_routed"] / full["params_total"]
    header = (
        f"{full['model']}: {_short(full['params_total'])} parameters ({share:.0%} in routed experts), "
        f"{full['experts']} routed experts per MoE layer, top-{full['top_k']}"
    )
    head = [
        "keep",
        "experts",
        "params",
        "active",
        "state GB",
        "devices",
        "reduction",
        "step s",
        "device-h/step",
    ]
    rows = [head] + [_cells(row) for _, row in group.iterrows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  " + "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    steps = [_step_line(row) for _, row in group.iterrows() if row["step_source"] == "predicted"]
    notes = [f"  {row['keep']}: {row['note']}" for _, row in group.iterrows() if row["note"]]
    return "\n".join([header, *lines, *steps, *notes])


def _step_line(row: pd.Series) -> str:
    """A predicted row's layout and its step time by term."""
    terms = ", ".join(f"{label} {_num(row[key])}" for key, label in _TERMS.items())
    return f"  {row['keep']}: {row['layout']}; seconds: {terms}"


def _cells(row: pd.Series) -> list[str]:
    if row.isna()["devices"]:  # a keep the model's routing does not allow
        return [row["keep"], *["-"] * 8]
    reduction = "-" if row["keep"] == "full" else f"{row['reduction_pct']:.1f}%"
    hours = "-" if math.isnan(row["device_hours"]) else _num(row["device_hours"])
    step = "-" if math.isnan(row["step_time_s"]) else _num(row["step_time_s"])
    return [
        row["keep"],
        str(row["experts"]),
        _short(row["params_total"]),
        _short(row["params_active"]),
        _num(row["state_gb"]),
        f"{row['devices']}{' (given)' if row['devices_given'] else ''}",
        reduction,
        step,
        hours,
    ]


def _num(x: float) -> str:
    """``13,420.5`` for large numbers, three significant digits for small ones."""
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def _short(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
