"""The cost table with the assumptions it was computed under: a value that prints itself.

:func:`cost_report` costs a model, the published models, or both, and :class:`CostReport` keeps
the table with its memory model, rounding, device and workload, so its text (what ``moescope
cost`` prints) and its JSON say what the figures assume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError
from moescope.export.cost.memory import TrainingMemory
from moescope.export.cost.profiles import DeviceProfile
from moescope.export.cost.render import cost_json, cost_text
from moescope.export.cost.shape import ModelShape
from moescope.export.cost.step import RLWorkload
from moescope.export.cost.table import DEFAULT_KEEPS, cost_table, reference_table

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, eq=False)
class CostReport:
    """A cost table (:func:`cost_table`'s rows) and the assumptions behind its figures."""

    table: pd.DataFrame
    memory: TrainingMemory | None = None
    rounding: str = "device"
    profile: DeviceProfile | None = None
    workload: RLWorkload | None = None

    def to_frame(self) -> pd.DataFrame:
        """The table, one row per model and keep."""
        return self.table

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the assumptions, then one record per row (:func:`cost_json`)."""
        return cost_json(self.table, self.memory, self.rounding, self.profile, self.workload)

    def text(self) -> str:
        """A block per model, then every assumption (:func:`cost_text`).

        >>> from moescope.export.cost.shape import reference_models
        >>> print(cost_report(reference_models()[5], ["1/4"]).text().splitlines()[0])
        DeepSeek-V3: 671B parameters (97% in routed experts), 256 routed experts per MoE layer, top-8
        """
        return cost_text(self.table, self.memory, self.rounding, self.profile, self.workload)


def cost_report(
    model: ModelShape | Mapping[str, Any] | str | Path | None,
    keeps: Sequence[str | float | int] = DEFAULT_KEEPS,
    *,
    reference: bool = False,
    strict: bool = True,
    devices: Mapping[str, int] | None = None,
    memory: TrainingMemory | None = None,
    step_time_s: float | Mapping[str, float | None] | None = None,
    rounding: str = "device",
    profile: DeviceProfile | None = None,
    workload: RLWorkload | None = None,
) -> CostReport:
    """:func:`cost_table` of ``model``, followed with ``reference`` by :func:`reference_table`
    (the published models, costed under the same assumptions); ``strict`` and ``devices`` apply
    to ``model``'s rows only."""
    import pandas as pd

    if model is None and not reference:
        raise MoescopeError("give a model to cost, or reference=True for the published models.")
    options = {"memory": memory, "step_time_s": step_time_s, "rounding": rounding}
    options |= {"profile": profile, "workload": workload}
    tables = [] if model is None else [cost_table(model, keeps, strict=strict, devices=devices, **options)]
    if reference:
        tables.append(reference_table(keeps, **options))
    table = pd.concat(tables, ignore_index=True)
    return CostReport(table, memory, rounding, profile, workload)
