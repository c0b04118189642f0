"""The fidelity study judged with each proxy's healthy run as baseline, from its stored rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moescope.analyze.baseline import baseline_frame, baseline_summary, row_comparison
from moescope.analyze.findings import Finding
from moescope.analyze.verdict import Comparison, against_healthy, compare
from moescope.export.study import read_study, study_file
from moescope.traces import Trace

DOCS = Path(__file__).resolve().parents[1] / "docs"


def run(*faults: str) -> Trace:
    return Trace(header={"faults": list(faults)}, steps=[{"step": i} for i in range(12)])


def row(method: str, fault: str, original: list[tuple[str, int]], proxy: list[tuple[str, int]]) -> dict:
    """A study row as bench/fidelity_study.py writes one, from a real comparison."""
    spec = [f"{fault}@6"] if fault != "healthy" else []
    c = compare(run(*spec), run(*spec), original_findings=[Finding(t, s, "warning", t) for t, s in original],
                proxy_findings=[Finding(t, s, "warning", t) for t, s in proxy])  # fmt: skip
    stored = {k: v for k, v in json.loads(json.dumps(c.to_dict())).items() if k != "curves"}
    return {"keep": "1/4", "method": method, "seed": 0, "fault": fault, **stored, "curves": {}}


# one proxy collapses its entropy without a fault, the other does not
RESULT = {
    "rows": [
        row("collapsing", "healthy", [], [("entropy_collapse", 2)]),
        row("collapsing", "entropy_control_off", [("entropy_collapse", 7)], [("entropy_collapse", 7)]),
        row("collapsing", "update_omission", [], [("entropy_collapse", 3)]),
        row("sound", "healthy", [], []),
        row("sound", "entropy_control_off", [("entropy_collapse", 7)], [("entropy_collapse", 8)]),
        row("sound", "update_omission", [], []),
    ]
}


def test_a_proxys_own_finding_is_set_apart_in_its_faulted_runs() -> None:
    frame = baseline_frame(RESULT)
    assert len(frame) == 4 and set(frame["fault"]) == {"entropy_control_off", "update_omission"}
    collapsing = frame[frame["method"] == "collapsing"].set_index("fault")
    assert collapsing["own"].tolist() == [["entropy_collapse"]] * 2
    # the collapse the original shows under the fault is no longer credited to the proxy ...
    assert collapsing.loc["entropy_control_off", ["agrees", "hits"]].tolist() == [True, 1]
    assert collapsing.loc["entropy_control_off", ["agrees_based", "hits_based"]].tolist() == [False, 0]
    # ... and a fault the original shows nothing of is not a false alarm of the proxy's any more
    assert collapsing.loc["update_omission", ["agrees", "agrees_based"]].tolist() == [False, True]
    sound = frame[frame["method"] == "sound"]
    assert (sound["agrees"] == sound["agrees_based"]).all() and (sound["hits"] == sound["hits_based"]).all()
    summary = baseline_summary(frame).set_index("method")
    assert summary.loc["collapsing", "own"] == {0: ["entropy_collapse"]} and summary.loc["sound", "own"] == {}
    assert summary.loc["collapsing", ["verdicts", "verdicts_based", "hit", "hit_based"]].tolist() == [
        0.5,
        0.5,
        1.0,
        0.0,
    ]


@pytest.mark.parametrize("targeted", [False, True])
@pytest.mark.parametrize("model", ["toy", "toy-v3"])
def test_the_committed_studies_rows_judge_back_to_their_verdicts_and_tables(model, targeted) -> None:
    """Read back, each stored row judges to the verdict the study wrote (an empty baseline sets
    nothing apart), and the study's .md holds the baseline table computed from its .json."""
    result = read_study(DOCS / study_file(model, targeted))
    for stored in result["rows"]:
        again = against_healthy(row_comparison(stored), Comparison("both healthy", []))
        assert (again.verdict, again.every_finding) == (stored["verdict"], stored["every_finding"]), stored
    table = (DOCS / study_file(model, targeted)).with_suffix(".md").read_text()
    assert "## With each proxy's healthy run as baseline" in table
    for r in baseline_summary(baseline_frame(result)).itertuples():
        assert f"| {r.keep} | {r.method} |" in table
        assert f"| {r.verdicts:.2f} | {r.verdicts_based:.2f} | {r.hit:.2f} | {r.hit_based:.2f} |" in table
