"""``diagnose_log``: a log's findings and next steps, and its comparison with a proxy's, as text
and as the JSON ``moescope diagnose --json`` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.analyze.log_diagnosis import diagnose_log
from moescope.errors import MoescopeError

LOGS = Path(__file__).parent / "data" / "logs"


def test_the_text_names_the_run_each_finding_and_what_to_try_next() -> None:
    result = diagnose_log(LOGS / "xtuner_iter.log")
    lines = result.text().splitlines()
    assert lines[0] == f"{LOGS / 'xtuner_iter.log'}: records, 4 steps"
    assert lines[1].startswith("  note: 4 record(s): too few for the rules that judge a trend")
    assert lines[2].startswith("  [error] step 510 nonfinite: First non-finite value at step 510")
    assert "        $ moescope validate PROXY --fault nan_op --fix grad_clip" in lines[-3]
    assert result.comparison is None and "comparison" not in result.to_dict()
    (finding,) = result.to_dict()["findings"]
    assert finding["next"]["fault"] == "nan_op"


def test_a_run_too_short_for_a_trend_says_so_and_a_longer_one_does_not(tmp_path: Path) -> None:
    for steps, short in ((9, True), (10, False)):
        log = tmp_path / f"{steps}.log"
        log.write_text("".join(f"step:{i} - actor/entropy:0.5 - actor/lr:1e-06\n" for i in range(steps)))
        notes = diagnose_log(log).to_dict()["notes"]
        assert any(note.startswith(f"{steps} record(s): too few") for note in notes) is short


def test_against_a_proxys_run_the_verdict_and_its_reasons_come_last() -> None:
    log = LOGS / "topk_indices.log"
    result = diagnose_log(log, against=log)
    assert result.text().splitlines()[-2:] == [
        f"against {log}: reproduced",
        "  - load_collapse reproduced (onset 0 vs 0)",
    ]
    assert result.to_dict()["comparison"]["verdict"] == "reproduced"
    assert all(line.startswith("  note: ") for line in result.text().splitlines()[1:3])


def test_a_fault_it_does_not_know_or_healthy_runs_without_a_proxy_are_refused() -> None:
    with pytest.raises(MoescopeError, match="volcano"):
        diagnose_log(LOGS / "no_such.log", faults=["volcano"])  # before any reading
    with pytest.raises(MoescopeError, match="healthy runs judge a comparison"):
        diagnose_log(LOGS / "xtuner_iter.log", healthy=[LOGS / "xtuner_iter.log"] * 2)
