"""The natural-mismatch study's verdicts (bench/natural_mismatch.py): collapses, learns, holds."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "natural_mismatch.py"
_SPEC = importlib.util.spec_from_file_location("natural_mismatch", _PATH)
nm = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(nm)


def test_a_reward_that_falls_to_a_third_of_its_peak_collapses():
    rewards = [0.8] * 20 + [0.9] * 20 + [0.3] * 10
    assert nm.classify(rewards) == "collapses"


def test_a_dip_that_recovers_does_not_collapse_and_a_rise_learns():
    assert nm.classify([0.8] * 20 + [0.1] * 10 + [0.8] * 10) == "holds"
    assert nm.classify([0.5] * 10 + [0.6] * 10 + [0.7] * 10) == "learns"
    assert nm.classify([0.5] * 10 + [0.54] * 10) == "holds"  # below the margin


def test_a_non_finite_reward_at_the_end_collapses_and_a_short_run_is_refused():
    assert nm.classify([0.8] * 25 + [math.nan] * 5) == "collapses"
    with pytest.raises(ValueError, match="too few"):
        nm.classify([0.8] * 19)


def test_a_cell_takes_the_majority_of_its_seeds():
    assert nm.cell_verdict(["collapses", "collapses", "learns"]) == "collapses"
    assert nm.cell_verdict(["collapses", "learns", "learns"]) == "learns"
    assert nm.cell_verdict(["collapses", "learns", "holds"]) == "holds"


def test_the_proxy_agrees_when_its_cells_verdict_is_the_originals():
    def run(role, algo, seed, verdict):
        return {"role": role, "algo": algo, "seed": seed, "verdict": verdict}

    runs = [run("m original", "grpo", s, "collapses") for s in range(3)]
    runs += [run("m proxy", "grpo", 0, "collapses"), run("m proxy", "grpo", 1, "learns")]
    runs += [run("m proxy", "grpo", 2, "collapses"), run("m original", "grpo-fp32", 0, "holds")]
    rows = nm.agreement(runs)
    assert rows == [
        {"model": "m", "algo": "grpo", "original": "collapses", "proxy": "collapses", "agrees": True,
         "agrees_on_collapse": True}
    ]  # fmt: skip


def test_the_trough_is_the_lowest_running_mean_over_the_highest():
    assert nm.trough([0.8] * 10 + [0.2] * 10 + [0.8] * 10) == pytest.approx(0.25)
    assert nm.trough([0.0] * 20) is None
