"""What to try next: every finding's causes and the export / validate lines, which moescope's own
command line accepts (fault, fixes and the flags the fault needs)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from moescope.analyze.findings import FINDING_TYPES, Finding
from moescope.analyze.fixes import fix_fields
from moescope.analyze.remedies import REMEDIES, next_steps, next_steps_frame, next_steps_text
from moescope.cli import build_parser, main, replay_config
from moescope.replay.faults import check_faults

LOGS = Path(__file__).parent / "data" / "logs"


def test_every_finding_type_has_causes() -> None:
    assert set(REMEDIES) == set(FINDING_TYPES)
    assert all(r.causes for r in REMEDIES.values())


@pytest.mark.parametrize("kind", FINDING_TYPES)
def test_every_suggested_line_parses_as_moescope_reads_it(kind: str) -> None:
    steps = next_steps(Finding(kind, 3, "warning", "x"), model="toy", proxy="proxy-dir")
    if steps["fault"] is None:
        assert steps["validate"] == [] and steps["export"] is None
        return
    export = build_parser().parse_args(shlex.split(steps["export"])[1:])
    assert (export.model, str(export.out)) == ("toy", "proxy-dir")
    for line in steps["validate"]:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.model == "proxy-dir" and args.validate_fault == steps["fault"]
        config = replay_config(args)  # the replay validate would run
        check_faults([args.validate_fault], precision=config.precision, steps=config.steps)
        assert fix_fields(config, args.fix)  # a fix validate knows, with a valid argument


def test_a_finding_moescope_cannot_reproduce_says_so() -> None:
    lines = next_steps_text(Finding("no_signal", 3, "warning", "x"))
    assert lines[0].startswith("likely causes: prompts too easy") and "no moescope fault" in lines[1]


def test_diagnose_prints_the_next_steps_in_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", str(LOGS / "topk_indices.log")]) == 0
    text = capsys.readouterr().out
    assert "likely causes: the load-balancing loss off" in text
    assert "$ moescope validate PROXY --fault aux_loss_off --fix aux_loss" in text
    assert main(["diagnose", "--json", str(LOGS / "xtuner_iter.log")]) == 0
    (finding,) = json.loads(capsys.readouterr().out)["findings"]
    assert finding["type"] == "nonfinite" and finding["next"]["fault"] == "nan_op"
    assert finding["next"]["validate"][0].startswith("moescope validate PROXY --fault nan_op --fix grad_clip")


def test_the_notebook_table_has_a_row_per_fix_to_test() -> None:
    findings = [Finding("overflow", 2, "info", "settling"), Finding("rollout_mismatch", 4, "warning", "x")]
    frame = next_steps_frame({"original": findings, "proxy": [Finding("zero_grad", 1, "warning", "x")]})
    assert frame["fix"].tolist()[:4] == ["routing_replay", "is_correction", "fp32_router", "gspo"]
    assert frame["model"].tolist()[-1] == "proxy" and frame[["fix", "validate"]].iloc[-1].isna().all()
