"""The paper's cost table against the step-time model, row by row.

The paper measured two proxies on Ascend NPUs: Qwen3-30B-A3B (128 → 48 experts, 16 → 8 NPUs,
128.93 → 114.83 s per step) and DeepSeek-V3.2 (256 → 16 experts, 512 → 64 NPUs, ~50 → ~12 min).
:func:`paper_comparison` predicts both on the same device counts with
:func:`~moescope.export.cost.step.step_time` and sets the figures side by side. DeepSeek-V3.2
is costed as DeepSeek-V3, whose dimensions it keeps (its sparse-attention indexer adds under
1 % of the parameters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moescope.export.cost.memory import devices_needed, memory_of
from moescope.export.cost.profiles import DeviceProfile, device_profile
from moescope.export.cost.shape import reference_models
from moescope.export.cost.step import RLWorkload, step_time

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class PaperRow:
    """One measured row of the paper's cost table."""

    model: str  # the reference model costed
    label: str  # as the paper names it
    experts_kept: int
    devices: tuple[int, int]  # full, proxy
    step_s: tuple[float, float]  # full, proxy


PAPER_ROWS = (
    PaperRow("Qwen3-30B-A3B", "Qwen3-30B-A3B", 48, (16, 8), (128.93, 114.83)),
    PaperRow("DeepSeek-V3", "DeepSeek-V3.2", 16, (512, 64), (50 * 60.0, 12 * 60.0)),
)


def paper_comparison(
    profile: DeviceProfile | str = "ascend-910b", workload: RLWorkload | None = None
) -> pd.DataFrame:
    """The paper's rows and the model's predictions on the paper's device counts.

    Columns: ``devices`` as the paper ran them and ``devices_model`` as the memory model would
    choose them (rounded up to a power of two), step seconds measured and predicted for the full
    model and the proxy, and the device-hour ratios (full ÷ proxy) with ``factor`` = predicted ÷
    measured ratio.

    Examples
    --------
    >>> table = paper_comparison()
    >>> table["label"].tolist(), table["ratio_paper"].round(2).tolist()
    (['Qwen3-30B-A3B', 'DeepSeek-V3.2'], [2.25, 33.33])
    """
    import pandas as pd

    profile = device_profile(profile)
    memory, shapes = memory_of(None, profile), {shape.name: shape for shape in reference_models()}
    rows = []
    for row in PAPER_ROWS:
        full = shapes[row.model]
        proxy = full.with_keep(row.experts_kept)
        (d_full, d_proxy), (s_full, s_proxy) = row.devices, row.step_s
        t_full = step_time(full, d_full, profile, workload).total_s
        t_proxy = step_time(proxy, d_proxy, profile, workload).total_s
        predicted = d_full * t_full / (d_proxy * t_proxy)
        measured = d_full * s_full / (d_proxy * s_proxy)
        rows.append(
            {
                "label": row.label,
                "experts": f"{full.routed_experts} → {row.experts_kept}",
                "devices": f"{d_full} → {d_proxy}",
                "devices_model": " → ".join(str(devices_needed(s, memory, "pow2")) for s in (full, proxy)),
                "step_paper_s": (s_full, s_proxy),
                "step_predicted_s": (t_full, t_proxy),
                "ratio_paper": measured,
                "ratio_predicted": predicted,
                "factor": predicted / measured,
            }
        )
    return pd.DataFrame(rows)
