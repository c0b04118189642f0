"""The cost table as ``moescope cost`` prints it (a block per model) and as JSON."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from moescope.export.cost.memory import TrainingMemory

if TYPE_CHECKING:
    import pandas as pd

PROXY_NOTE = (
    "A proxy keeps top-k, so per-token compute (active parameters) stays: device-hours per step "
    "fall by the device ratio only if the step time stays equal."
)


def cost_json(
    table: pd.DataFrame, memory: TrainingMemory | None = None, rounding: str = "device"
) -> dict[str, Any]:
    """The table as JSON-ready data: the memory assumptions, the rounding and one record per row."""
    records = table.astype(object).where(table.notna(), None).to_dict("records")
    return {"memory": (memory or TrainingMemory()).to_dict(), "rounding": rounding, "rows": records}


def cost_text(table: pd.DataFrame, memory: TrainingMemory | None = None, rounding: str = "device") -> str:
    """The table as ``moescope cost`` prints it: a block per model, then the assumptions."""
    blocks = [_model_text(group) for _, group in table.groupby("model", sort=False)]
    assumptions = (memory or TrainingMemory()).text()
    if rounding != "device":
        assumptions += f" Devices rounded up to a {'node of 8' if rounding == 'node' else 'power of two'}."
    return "\n\n".join([*blocks, assumptions, PROXY_NOTE])


def _model_text(group: pd.DataFrame) -> str:
    full = group.iloc[0]
    share = full["params_routed"] / full["params_total"]
    header = (
        f"{full['model']}: {_short(full['params_total'])} parameters ({share:.0%} in routed experts), "
        f"{full['experts']} routed experts per MoE layer, top-{full['top_k']}"
    )
    head = ["keep", "experts", "params", "active", "state GB", "devices", "reduction", "device-h/step"]
    rows = [head] + [_cells(row) for _, row in group.iterrows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  " + "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    notes = [f"  {row['keep']}: {row['note']}" for _, row in group.iterrows() if row["note"]]
    return "\n".join([header, *lines, *notes])


def _cells(row: pd.Series) -> list[str]:
    if row.isna()["devices"]:  # a keep the model's routing does not allow
        return [row["keep"], *["-"] * 7]
    reduction = "-" if row["keep"] == "full" else f"{row['reduction_pct']:.1f}%"
    hours = "-" if math.isnan(row["device_hours"]) else _num(row["device_hours"])
    return [
        row["keep"],
        str(row["experts"]),
        _short(row["params_total"]),
        _short(row["params_active"]),
        _num(row["state_gb"]),
        str(row["devices"]),
        reduction,
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
