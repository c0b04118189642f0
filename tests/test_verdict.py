"""The verdict: its tables (one row per finding type, one per compared curve), and what decides it."""

from __future__ import annotations

import json
from dataclasses import fields, replace

from moescope.analyze.findings import FINDING_TYPES, Finding
from moescope.analyze.verdict import Comparison, CurveAgreement, FindingMatch, against_healthy, compare
from moescope.replay.faults import KINDS
from moescope.traces import Trace


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


# --- judged on the injected fault's signature ----------------------------------------------------


def faulted(*faults: str, steps: int = 12) -> Trace:
    return Trace(header={"faults": list(faults)}, steps=[{"step": i} for i in range(steps)])


def found(*typed_steps: tuple[str, int]) -> list[Finding]:
    return [Finding(kind, step, "warning", kind) for kind, step in typed_steps]


# what TRL measured on the toy under lr_spike@4, seed 0 (bench/trl_integration.py): the toy's
# broken policy drifts toward noise, the proxy's into a repetition loop
TOY = found(("reward_collapse", 5), ("entropy_surge", 5), ("load_collapse", 5), ("no_signal", 5))
PROXY = found(("reward_collapse", 5), ("entropy_collapse", 5), ("degenerate_output", 5), ("load_collapse", 5))


def test_the_faults_signature_decides_and_the_rest_is_reported() -> None:
    c = compare(faulted("lr_spike@4"), faulted("lr_spike@4"), original_findings=TOY, proxy_findings=PROXY)
    assert (c.verdict, c.every_finding) == ("reproduced", "partially reproduced")
    assert c.faults == ["lr_spike"] and c.signature == ["reward_collapse"]
    assert c.reasons[0].startswith("judged on the signature of lr_spike: reward_collapse (1 of 1 on time)")
    assert "entropy_surge at step 5 not reproduced" in c.reasons  # reported, not hidden
    assert "degenerate_output only on the proxy (step 5)" in c.reasons


def test_a_signature_missing_or_late_on_the_proxy_is_not_reproduced() -> None:
    spike = faulted("lr_spike@4")
    aside = found(("entropy_surge", 5), ("load_collapse", 5), ("no_signal", 5))
    missing = compare(spike, spike, original_findings=TOY, proxy_findings=aside)
    assert missing.verdict == "not reproduced" and missing.every_finding == "partially reproduced"
    late = compare(spike, spike, original_findings=TOY, proxy_findings=found(("reward_collapse", 10)))
    assert late.verdict == "partially reproduced"
    grads = found(("grad_spike", 5), ("reward_collapse", 6))
    half = compare(spike, spike, original_findings=grads, proxy_findings=found(("reward_collapse", 6)))
    assert half.signature == ["grad_spike", "reward_collapse"] and half.verdict == "partially reproduced"


def test_every_finding_is_judged_without_a_shared_fault_with_a_note_saying_why() -> None:
    spike, bare = faulted("lr_spike@4"), Trace(header={}, steps=[{"step": i} for i in range(12)])
    kwargs = {"original_findings": TOY, "proxy_findings": PROXY}
    other = compare(spike, faulted("lr_spike@4", "nan_op@6"), **kwargs)
    assert other.verdict == "partially reproduced" and other.signature == []
    assert other.reasons[0].startswith("the traces name different faults (lr_spike against lr_spike, nan_op)")
    foreign = compare(bare, bare, **kwargs)  # another framework's log says nothing of faults
    assert (
        foreign.verdict == "partially reproduced"
        and foreign.reasons[0] == "entropy_surge at step 5 not reproduced"
    )
    assert compare(spike, spike, faults=(), **kwargs).verdict == "partially reproduced"
    assert compare(bare, bare, faults=["lr_spike@4"], **kwargs).verdict == "reproduced"
    unsigned = compare(faulted("update_omission@3"), faulted("update_omission@3"), **kwargs)
    assert unsigned.verdict == "partially reproduced"
    assert "signature of update_omission (none defined)" in unsigned.reasons[0]
    absent = compare(spike, spike, original_findings=found(("load_collapse", 5)), proxy_findings=[])
    assert absent.verdict == "not reproduced" and "none of the signature of lr_spike" in absent.reasons[0]


def test_every_signature_names_findings_the_diagnosis_raises() -> None:
    for kind in KINDS.values():
        assert set(kind.signature) <= set(FINDING_TYPES), kind.name


# --- the healthy runs as baseline ----------------------------------------------------------------


def test_a_finding_the_proxy_raises_without_a_fault_neither_reproduces_nor_alarms() -> None:
    healthy = compare(
        faulted(), faulted(), original_findings=[], proxy_findings=found(("entropy_collapse", 2))
    )
    assert healthy.verdict == "not reproduced"  # a false alarm on two healthy runs
    off = faulted("entropy_control_off@6")  # its signature: entropy_collapse
    # the original collapses only under the fault; the proxy collapses anyway
    confounded = compare(off, off, original_findings=found(("entropy_collapse", 7)),
                         proxy_findings=found(("entropy_collapse", 7)))  # fmt: skip
    assert confounded.verdict == "reproduced"
    based = against_healthy(confounded, healthy)
    assert based.verdict == based.every_finding == "not reproduced" and based.own == {"entropy_collapse": 2}
    assert "(0 of 1 on time)" in based.reasons[0]
    assert "without a fault (healthy run, step 2): not counted as reproduced" in based.reasons[1]
    # a fault whose original raises nothing: the proxy's collapse was a false alarm, now set apart
    quiet = compare(faulted("update_omission@6"), faulted("update_omission@6"), original_findings=[],
                    proxy_findings=found(("entropy_collapse", 3)))  # fmt: skip
    assert quiet.verdict == "not reproduced"
    omitted = compare(faulted("update_omission@6"), faulted("update_omission@6"), original_findings=[],
                      proxy_findings=found(("entropy_collapse", 3)), healthy=healthy)  # fmt: skip
    assert omitted.verdict == "both healthy"
    # a run that raises nothing the proxy's healthy run raises is judged as before
    spike = compare(faulted("lr_spike@4"), faulted("lr_spike@4"), original_findings=TOY, proxy_findings=PROXY)
    elsewhere = compare(faulted(), faulted(), original_findings=[], proxy_findings=found(("kl_blowup", 2)))
    assert replace(against_healthy(spike, elsewhere), own={}) == spike


def test_a_comparison_read_back_from_its_dict_judges_the_same() -> None:
    spike = compare(faulted("lr_spike@4"), faulted("lr_spike@4"), original_findings=TOY, proxy_findings=PROXY)
    healthy = compare(faulted(), faulted(), original_findings=[], proxy_findings=found(("load_collapse", 1)))
    read = Comparison.from_dict(json.loads(json.dumps(spike.to_dict())))
    assert read == spike
    assert against_healthy(read, healthy) == against_healthy(spike, healthy)
    assert against_healthy(read, healthy).every_finding == "partially reproduced"


def test_the_text_gives_the_verdict_then_each_reason() -> None:
    c = compare(faulted("lr_spike@4"), faulted("lr_spike@4"), original_findings=TOY, proxy_findings=PROXY)
    lines = c.text("against proxy.jsonl").splitlines()
    assert lines[0] == "against proxy.jsonl: reproduced"
    assert lines[1:] == [f"  - {reason}" for reason in c.reasons] and len(lines) > 2
    assert c.text().startswith("verdict: reproduced\n  - judged on the signature of lr_spike")
