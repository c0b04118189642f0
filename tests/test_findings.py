"""Findings as a table: several models' diagnoses side by side."""

from __future__ import annotations

import pytest

from moescope.analyze.findings import FRAME_COLUMNS, Finding, findings_frame


def test_findings_of_several_models_make_one_table_in_order() -> None:
    spike = Finding("grad_spike", 6, "warning", "grad norm 40x its median", evidence={"ratio": 40.0})
    load = Finding("load_collapse", 9, "error", "one expert takes 90%", layer=2)
    frame = findings_frame({"original": [spike, load], "proxy": [spike]})
    assert list(frame.columns) == list(FRAME_COLUMNS), "evidence stays on the Finding"
    assert frame["model"].tolist() == ["original", "original", "proxy"]
    assert frame["type"].tolist() == ["grad_spike", "load_collapse", "grad_spike"]
    assert frame.loc[1, "layer"] == 2 and frame.loc[1, "message"] == "one expert takes 90%"
    assert frame.index.tolist() == [0, 1, 2]


@pytest.mark.parametrize("by_model", [{}, {"original": [], "proxy": []}])
def test_no_findings_is_an_empty_table_with_the_columns(by_model) -> None:
    frame = findings_frame(by_model)
    assert frame.empty and list(frame.columns) == list(FRAME_COLUMNS)
