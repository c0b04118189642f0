"""The verdict's tables: one row per finding type, one per compared curve."""

from __future__ import annotations

from dataclasses import fields

from moescope.analyze.verdict import Comparison, CurveAgreement, FindingMatch


def test_comparison_tables_hold_every_match_and_curve() -> None:
    matches = [
        FindingMatch("grad_spike", 6, 7, True, True, 1, 0.05),
        FindingMatch("no_signal", None, 3, False, False, None, None, false_alarm=True),
    ]
    curves = [
        CurveAgreement("actor/loss", 12, 0.9, 0.8, "down", "down"),
        CurveAgreement("actor/kl", 12, None, None, "up", "flat"),
    ]
    comparison = Comparison("partially reproduced", ["a false alarm"], matches, curves)
    found = comparison.findings_frame()
    assert list(found.columns) == [f.name for f in fields(FindingMatch)]
    assert found["type"].tolist() == ["grad_spike", "no_signal"]
    assert found["false_alarm"].tolist() == [False, True] and found.loc[0, "offset_steps"] == 1
    agreement = comparison.curves_frame()
    assert list(agreement.columns) == [*(f.name for f in fields(CurveAgreement)), "trend_agrees"]
    assert agreement["trend_agrees"].tolist() == [True, False]
    assert agreement.loc[0, "spearman"] == 0.9


def test_a_comparison_without_findings_or_curves_gives_empty_tables_with_columns() -> None:
    comparison = Comparison("both healthy", [])
    assert comparison.findings_frame().empty and "reproduced" in comparison.findings_frame().columns
    assert comparison.curves_frame().empty and "trend_agrees" in comparison.curves_frame().columns
