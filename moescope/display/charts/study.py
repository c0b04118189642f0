"""The fidelity study's chart: per keep ratio and method, the findings a proxy reproduces and the
task capability it keeps (the table of :func:`moescope.export.study.study_summary`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moescope.display.charts._common import alt

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["study_chart"]


def study_chart(summary: pd.DataFrame) -> alt.HConcatChart:
    """The fidelity study per keep ratio and method: the share of the original's findings each
    proxy reproduces on time, next to how much task capability it kept (see
    :func:`moescope.export.study.study_summary`)."""
    data = summary[["keep", "method", "hit", "capability"]].melt(
        id_vars=["keep", "method"], var_name="measure", value_name="share"
    )
    labels = {"hit": "findings reproduced on time", "capability": "task accuracy, proxy / original"}
    panels = []
    for measure, title in labels.items():
        part = data[data["measure"] == measure]
        panels.append(
            alt.Chart(part, title=title)
            .mark_bar()
            .encode(
                x=alt.X("method:N", title=None, sort=list(dict.fromkeys(summary["method"]))),
                xOffset=alt.XOffset("keep:N", sort=list(dict.fromkeys(summary["keep"]))),
                y=alt.Y("share:Q", title="share", scale=alt.Scale(domain=[0, 1])),
                color=alt.Color("keep:N", title="kept", sort=list(dict.fromkeys(summary["keep"]))),
                tooltip=["keep:N", "method:N", alt.Tooltip("share:Q", format=".2f")],
            )
            .properties(width=260, height=200)
        )
    return alt.hconcat(*panels)
