"""Targeted validation: a fault replayed with and without a fix, the verdict per finding."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from moescope.analyze.findings import Finding
from moescope.analyze.fixes import FIXES, fix_fields
from moescope.analyze.validation import Validation, outcomes, read_validation, validate
from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.replay import ReplayConfig

BASE = ReplayConfig(steps=4, prompts_per_step=4, group_size=8, tasks=("add2", "add3"))


def test_fixes_set_replay_fields_and_bad_ones_are_one_sentence() -> None:
    fields = fix_fields(BASE, ["routing_replay", "is_correction:sequence", "lower_lr:0.5"])
    assert fields == {"routing_replay": True, "is_correction": "sequence", "lr": BASE.lr * 0.5}
    assert fix_fields(BASE, ["bf16", "grad_clip"]) == {"precision": "bf16", "max_grad_norm": 0.5}
    for bad, match in (
        (["flux"], "unknown fix 'flux'"),
        (["gspo:2"], "takes no argument"),
        (["lower_lr:-1"], "bad argument"),
        (["is_correction:tis"], "bad argument"),
        ([], "name at least one fix"),
    ):
        with pytest.raises(MoescopeError, match=match):
            fix_fields(BASE, bad)
    assert {"routing_replay", "is_correction", "gspo", "fp32_router"} <= set(FIXES)


def test_verdicts_per_finding_type() -> None:
    spike = Finding("grad_spike", 5, "warning", "", {"value": 1e4, "steps": [5, 6]})
    nan = Finding("nonfinite", 5, "error", "", {"steps": [5, 6, 7]})
    load = Finding("load_collapse", 3, "warning", "", {})
    before = [spike, nan, load, Finding("overflow", 1, "info", "", {})]
    after = [
        Finding("nonfinite", 5, "warning", "", {"steps": [5]}),  # milder
        Finding("load_collapse", 3, "warning", "", {}),  # the same
        Finding("kl_blowup", 8, "error", "", {}),  # new
    ]
    verdicts = {o.type: o.verdict for o in outcomes(before, after, last_step=9)}
    assert verdicts == {
        "grad_spike": "removed",
        "nonfinite": "reduced",
        "load_collapse": "unchanged",
        "kl_blowup": "introduced",
    }  # an info finding has no verdict
    halved = [Finding("grad_spike", 5, "warning", "", {"value": 4e3, "steps": [5, 6]})]
    assert outcomes([spike], halved, last_step=9)[0].verdict == "reduced"
    # failing from step 8 instead of 3 (run of steps 0-9): 2 steps of 7, under half: reduced; from 6 (4): not
    assert outcomes([load], [replace(load, step=8)], last_step=9)[0].verdict == "reduced"
    assert outcomes([load], [replace(load, step=6)], last_step=9)[0].verdict == "unchanged"
    # a held level judged by its median, on at most half the steps it named: reduced
    level = Finding("rollout_mismatch", 0, "warning", "", {"mean": 0.05, "median": 1e-4})
    assert (
        outcomes([level], [replace(level, evidence={"mean": 0.01, "median": 1e-4})], last_step=9)[0].verdict
        == "unchanged"
    )  # one outlier step moved the mean, not the level
    assert outcomes([nan], [replace(nan, evidence={"steps": [5]})], last_step=9)[0].verdict == "reduced"


def test_a_finding_the_model_raises_without_the_fault_is_its_own_and_not_judged() -> None:
    collapse = Finding("entropy_collapse", 2, "warning", "", {})
    mismatch = Finding("rollout_mismatch", 0, "warning", "", {"median": 0.05})
    fixed = [replace(collapse, step=3)]  # the fix removes the mismatch; the collapse stays
    plain = validation(outcomes([collapse, mismatch], fixed, last_step=11))
    assert plain.verdicts == {"entropy_collapse": "unchanged", "rollout_mismatch": "removed"}
    assert plain.summary == "reduced"
    based = validation(outcomes([collapse, mismatch], fixed, last_step=11, own=[collapse]))
    assert based.verdicts == {"entropy_collapse": "own", "rollout_mismatch": "removed"}
    assert based.summary == "removed"
    only_own = outcomes([], fixed, last_step=11, own=[collapse])  # introduced by the fix? no: its own
    assert [o.verdict for o in only_own] == ["own"] and validation(only_own).summary == "no finding"
    # against an original that raises no collapse: the proxy's own type is not compared either way
    proxy = validation(outcomes([collapse, mismatch], fixed, last_step=11, own=[collapse]))
    proxy.original = validation(outcomes([mismatch], [], last_step=11))
    assert proxy.agreement() == {"entropy_collapse": None, "rollout_mismatch": True} and proxy.agrees()
    proxy.original = validation(outcomes([collapse, mismatch], [collapse], last_step=11))  # not its own
    assert proxy.agreement() == {"entropy_collapse": None, "rollout_mismatch": True}
    proxy.outcomes = outcomes([collapse, mismatch], fixed, last_step=11)  # the proxy's own no longer known
    assert proxy.agreement() == {"entropy_collapse": True, "rollout_mismatch": True}


def test_the_text_gives_each_verdict_beside_the_originals_the_cost_and_one_word() -> None:
    collapse = Finding("entropy_collapse", 2, "warning", "", {})
    mismatch = Finding("rollout_mismatch", 0, "warning", "", {"median": 0.05})
    cost = {"step_time_ratio": 1.25, "reward_fault": 0.1, "reward_fixed": 0.4}
    proxy = replace(validation(outcomes([collapse, mismatch], [], last_step=11, own=[collapse])), cost=cost)
    proxy.original = replace(validation(outcomes([mismatch, collapse], [collapse], last_step=11)), cost=cost)
    assert proxy.text().splitlines() == [
        "toy under routing_mismatch@0, fixed with fp32_router:",
        "  entropy_collapse: own (raised without the fault too: the model's own, not judged)"
        "  (the original: unchanged; not compared, a model's own finding)",
        "  rollout_mismatch: removed  (the original: the same)",
        "  cost: step time x1.25, mean reward 0.100 -> 0.400",
        "  in one word: removed (the original: reduced)",
    ]
    alone = replace(validation([]), cost=cost, notes=["the fix cannot happen"])
    assert alone.text().splitlines()[1:3] == [
        "  note: the fix cannot happen",
        "  the fault raises no warning or error, with or without the fix",
    ]


def validation(found: list) -> Validation:
    return Validation("toy", "routing_mismatch@0", ("fp32_router",), found, {})


def test_routing_replay_reduces_and_an_fp32_router_removes_a_routing_mismatch(tmp_path: Path) -> None:
    fault = "routing_mismatch@1"
    replayed = validate("toy", fault, ["routing_replay"], config=BASE, out=tmp_path / "r3")
    assert [(o.type, o.verdict) for o in replayed.outcomes] == [("rollout_mismatch", "reduced")]
    both = validate("toy", fault, ["routing_replay", "fp32_router"], config=BASE, out=tmp_path / "both")
    assert [(o.type, o.verdict) for o in both.outcomes] == [("rollout_mismatch", "removed")]
    saved = json.loads((tmp_path / "both" / "validation.json").read_text())
    assert saved["fixes"] == ["routing_replay", "fp32_router"] and saved["agreement"] is None
    assert {p.name for p in (tmp_path / "both").iterdir()} == {
        "fault.jsonl",
        "fault+fix.jsonl",
        "healthy.jsonl",  # the run without the fault: the toy raises nothing there
        "validation.json",
    }
    bare = validate("toy", fault, ["fp32_router"], config=BASE, out=tmp_path / "bare", healthy=False)
    assert bare.verdicts == both.verdicts and not (tmp_path / "bare" / "healthy.jsonl").exists()
    assert 0 < both.cost["step_time_ratio"] < 10 and both.cost["reward_fault"] >= 0


def test_a_fix_that_removes_the_faults_precondition_says_so(tmp_path: Path) -> None:
    config = ReplayConfig(**{**BASE.to_dict(), "precision": "fp16"})
    result = validate("toy", "fp16_overflow@1", ["bf16"], config=config, out=tmp_path / "v")
    assert result.notes and "cannot happen" in result.notes[0]
    assert ("overflow", "removed") in [(o.type, o.verdict) for o in result.outcomes]


def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "v"
    for argv, match in (
        (["toy", "--fault", "lr_spike@1", "--fix", "flux"], "unknown fix"),
        (["toy", "--fault", "lr_spike@1", "--fix", "gspo", "--original", "toy"], "not a proxy directory"),
        (["toy", "--fault", "volcano", "--fix", "gspo"], "Unknown fault 'volcano'"),
    ):
        capsys.readouterr()
        assert main(["validate", *argv, "--out", str(out), "--steps", "2"]) == 2
        assert match in capsys.readouterr().err and not out.exists()


def test_an_original_that_is_not_the_proxys_source_is_refused(tmp_path: Path, capsys) -> None:
    from moescope.export.pipeline import export_proxy

    proxy = tmp_path / "proxy"
    export_proxy(
        "toy", proxy, keep="1/2", method="random", min_capability=0.0, fidelity=False, progress=False
    )
    with pytest.raises(MoescopeError, match=r"is not the model .* was cut from"):
        validate(proxy, "lr_spike@1", ["grad_clip"], config=BASE, original="toy-v3", out=tmp_path / "v")
    assert not (tmp_path / "v").exists()
    (tmp_path / "base.json").write_text(json.dumps(BASE.to_dict()))
    fault = ["--fault", "routing_mismatch@1", "--fix", "fp32_router", "--original", "toy"]
    capsys.readouterr()
    out = ["--out", str(tmp_path / "v"), "--config", str(tmp_path / "base.json")]
    assert main(["validate", str(proxy), *fault, *out]) == 0
    assert "rollout_mismatch: removed  (the original: the same)" in capsys.readouterr().out
    both = read_validation(tmp_path / "v")
    assert both.original is not None and both.original.model == "toy"
    assert both.agreement() == {"rollout_mismatch": True}  # removed on the proxy and on the original
    assert (tmp_path / "v" / "original-fault+fix.jsonl").is_file()


def test_the_cli_says_it_in_one_word_and_draws_both_runs(tmp_path: Path, capsys) -> None:
    import vl_convert

    from moescope.analyze.validation import rejudge
    from moescope.display.charts.validation import RUN_LABELS, validation_boards
    from moescope.schema import MISMATCH_KL, REWARD_MEAN

    out = tmp_path / "v"
    argv = ["validate", "toy", "--fault", "routing_mismatch@1", "--fix", "fp32_router", "--out", str(out)]
    assert main([*argv, "--steps", "4", "--prompts-per-step", "4", "--group-size", "8"]) == 0
    printed = capsys.readouterr().out
    assert "rollout_mismatch: removed" in printed and "in one word: removed" in printed
    assert f"charts: {out / 'validation.svg'}" in printed
    svg = (out / "validation.svg").read_text()
    assert svg.count('aria-roledescription="line mark"') == 12  # six panels, two runs each
    board = validation_boards(out)["model"].to_dict()
    subtitles = [p["title"]["subtitle"].split(" · ")[0] for p in board["concat"]]
    assert subtitles[:2] == [MISMATCH_KL, REWARD_MEAN], "the fault's metric first, then the reward"
    assert board["title"]["subtitle"][0] == "rollout_mismatch: removed"
    assert set(RUN_LABELS) <= set(json.dumps(board).split('"')), "the two runs are named in the legend"
    vl_convert.vegalite_to_svg(board)
    # rejudging the kept traces gives the same verdicts, and rewrites validation.json
    before = read_validation(out)
    (out / "validation.json").write_text(json.dumps({**before.to_dict(), "outcomes": []}))
    assert rejudge(out).verdicts == before.verdicts == read_validation(out).verdicts
