"""The fidelity study's tables and chart, on a small hand-made result and on the committed one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from moescope.display.charts import study_chart
from moescope.errors import MoescopeError
from moescope.export.study import (
    STUDY_FILE,
    fault_agreement,
    fault_effects,
    healing_effect,
    no_signal_table,
    paper_fault_agreement,
    read_study,
    run_summary,
    study_file,
    study_frame,
    study_paths,
    study_summary,
)

DOCS = Path(__file__).resolve().parents[1] / "docs"


def finding(kind, reproduced, on_time=True, false_alarm=False):
    return {"type": kind, "reproduced": reproduced, "on_time": on_time, "false_alarm": false_alarm}


def curve(rho, agrees):
    return {"spearman": rho, "trend_agrees": agrees}


RESULT = {
    "proxies": [
        {"keep": "1/2", "method": "cluster", "seed": 0, "capability_ratio": 0.5},
        {"keep": "1/2", "method": "random", "seed": 0, "capability_ratio": 0.1},
    ],
    "rows": [
        {"keep": "1/2", "method": "cluster", "seed": 0, "fault": "lr_spike", "verdict": "reproduced",
         "findings": [finding("grad_spike", True), finding("kl_blowup", True, on_time=False)],
         "curves": {"actor/loss": curve(0.8, True), "reward/mean": curve(None, False)}, "step_ratio": 0.9},
        {"keep": "1/2", "method": "cluster", "seed": 0, "fault": "healthy", "verdict": "both healthy",
         "findings": [], "curves": {"actor/loss": curve(0.4, True)}, "step_ratio": 1.1},
        {"keep": "1/2", "method": "random", "seed": 0, "fault": "lr_spike", "verdict": "not reproduced",
         "findings": [finding("grad_spike", False), finding("no_signal", False, False, True)],
         "curves": {}, "step_ratio": 1.0},
    ],
}  # fmt: skip


def test_summary_pools_findings_and_averages_runs():
    frame = study_frame(RESULT)
    assert list(frame["hits"]) == [1, 0, 0] and list(frame["findings"]) == [2, 0, 1]
    assert list(frame["alarms"]) == [0, 0, 1] and frame["capability"].tolist() == [0.5, 0.5, 0.1]
    assert frame.loc[0, "trend"] == 0.5 and frame.loc[0, "rho"] == 0.8 and math.isnan(frame.loc[2, "rho"])
    summary = study_summary(frame).set_index("method")
    assert summary.loc["cluster", "hit"] == 0.5  # 1 of 2 findings, pooled over runs
    assert summary.loc["cluster", "step_ratio"] == pytest.approx(1.0)
    assert summary.loc["random", "hit"] == 0.0 and summary.loc["random", "alarms"] == 1.0


def test_healing_effect_sets_the_same_proxies_side_by_side():
    healed = json.loads(json.dumps(RESULT))
    healed["proxies"][0]["capability_ratio"] = 0.9
    healed["rows"][2]["findings"][0]["reproduced"] = True  # the random proxy now reproduces its spike
    effect = healing_effect(RESULT, healed).set_index("method")
    assert list(effect.columns) == [
        "keep",
        "hit_unhealed",
        "hit_healed",
        "capability_unhealed",
        "capability_healed",
    ]
    assert (
        effect.loc["cluster", "capability_unhealed"] == 0.5
        and effect.loc["cluster", "capability_healed"] == 0.9
    )
    assert effect.loc["random", "hit_unhealed"] == 0.0 and effect.loc["random", "hit_healed"] == 1.0


def test_chart_has_both_measures():
    spec = study_chart(study_summary(study_frame(RESULT))).to_dict()
    titles = [panel["title"] for panel in spec["hconcat"]]
    assert titles == ["findings reproduced on time", "task accuracy, proxy / original"]


def test_bad_study_files(tmp_path):
    with pytest.raises(MoescopeError, match="No study results"):
        read_study(tmp_path)
    (tmp_path / "fidelity-study.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(MoescopeError, match="not a fidelity-study result"):
        read_study(tmp_path)


@pytest.mark.parametrize("model", ["toy", "toy-v3"])
def test_the_committed_studies_match_their_tables(model):
    """docs/ holds each embedded model's study, unhealed and capability-targeted; each .md was
    written from its .json, and the targeted one sets the same proxies side by side."""
    unhealed = read_study(DOCS / study_file(model))
    targeted = read_study(DOCS / study_file(model, targeted=True))
    assert (
        not unhealed["targeted"] and targeted["targeted"] and unhealed["model"] == targeted["model"] == model
    )
    for result, name in ((unhealed, study_file(model)), (targeted, study_file(model, targeted=True))):
        table = (DOCS / name).with_suffix(".md").read_text()
        for row in study_summary(study_frame(result)).itertuples():
            assert f"| {row.keep} | {row.method} | {row.hit:.2f} | {row.findings} |" in table
    table = (DOCS / study_file(model, targeted=True)).with_suffix(".md").read_text()
    for row in healing_effect(unhealed, targeted).itertuples():
        assert f"| {row.keep} | {row.method} | {row.hit_unhealed:.2f} | {row.hit_healed:.2f} |" in table


def test_fault_agreement_counts_reproduced_and_both_healthy_runs():
    agreement = fault_agreement(study_frame(RESULT))
    assert agreement.index.tolist() == ["lr_spike", "healthy"], "faults in the study's order"
    assert agreement.columns.tolist() == ["cluster", "random"]
    assert agreement.loc["lr_spike", "cluster"] == 1.0 and agreement.loc["lr_spike", "random"] == 0.0
    assert agreement.loc["healthy", "cluster"] == 1.0 and math.isnan(agreement.loc["healthy", "random"])


def test_study_paths_find_the_study_and_the_targeted_one_beside_it(tmp_path):
    assert study_paths() == (DOCS / STUDY_FILE, DOCS / study_file(targeted=True)), (
        "auto: this checkout's docs/"
    )
    assert study_paths(model="toy-v3")[0] == DOCS / "fidelity-study-toy-v3.json"
    assert study_paths(tmp_path) == (None, None)
    (tmp_path / STUDY_FILE).write_text("{}")
    assert study_paths(tmp_path) == (tmp_path / STUDY_FILE, None), "no targeted study beside it"
    targeted = tmp_path / study_file(targeted=True)
    targeted.write_text("{}")
    assert study_paths(str(tmp_path / STUDY_FILE)) == (tmp_path / STUDY_FILE, targeted)
    assert study_paths(tmp_path, "") == (tmp_path / STUDY_FILE, None), "'' asks for no targeted study"
    other = tmp_path / "elsewhere.json"
    assert study_paths(tmp_path, other) == (tmp_path / STUDY_FILE, None), "a targeted file that is not there"
    other.write_text("{}")
    assert study_paths(tmp_path, other) == (tmp_path / STUDY_FILE, other)
    assert study_paths(tmp_path / "missing.json", other) == (None, None), "no study, so no targeted one"
    assert study_paths(tmp_path, model="toy-v3") == (None, None), "another model's study is not there"


def summary_of(kl, reward, mismatch=0.0, ppo_kl=0.0, no_signal=0.5):
    steps = [
        {
            "actor/kl": kl,
            "reward/mean": reward,
            "rollout/logprob_mismatch": mismatch,
            "rollout/k3_kl": mismatch / 10,
            "actor/ppo_kl": ppo_kl,
            "reward/no_signal_frac": no_signal,
        }
    ] * 4
    return run_summary(steps)  # fmt: skip


def test_run_summary_takes_the_second_half_and_the_whole_runs_no_signal_share():
    steps = [{"actor/kl": 0.0, "reward/no_signal_frac": 1.0}, {"actor/kl": 0.0, "reward/no_signal_frac": 1.0},
             {"actor/kl": 0.2, "reward/no_signal_frac": 0.0}, {"actor/kl": float("nan")}]  # fmt: skip
    summary = run_summary(steps)
    assert summary["actor/kl"] == pytest.approx(0.2), "second half, NaN left out"
    assert summary["no_signal"] == pytest.approx(2 / 3)
    assert summary["rollout/logprob_mismatch"] == 0.0, "no rollout engine of its own: no mismatch"
    assert math.isnan(summary["reward/mean"]), "a metric the run never logged"


def test_fault_effects_compare_each_fault_with_the_same_models_healthy_run():
    healthy, omitted = summary_of(kl=0.02, reward=0.4), summary_of(kl=0.0, reward=0.3)
    result = {
        "originals": [
            {"fault": "healthy", "seed": 0, "summary": healthy},
            {"fault": "update_omission", "seed": 0, "summary": omitted},
            {"fault": "rollout_logprob_precision", "seed": 0, "summary": summary_of(0.02, 0.4, 0.01, 0.01)},
        ],
        "rows": [
            {"keep": "1/4", "method": m, "seed": 0, "fault": f, "summary": summary}
            for m, runs in {
                "paper": {"healthy": summary_of(0.03, 0.2), "update_omission": summary_of(0.0, 0.1),
                          "rollout_logprob_precision": summary_of(0.03, 0.2, 0.02, 0.0)},
                "random": {"healthy": summary_of(0.0, 0.0, no_signal=1.0),
                           "update_omission": summary_of(0.0, 0.0, no_signal=1.0),
                           "rollout_logprob_precision": summary_of(0.0, 0.0, no_signal=1.0)},
            }.items()
            for f, summary in runs.items()
        ],
    }  # fmt: skip
    effects = fault_effects(result).set_index(["method", "fault"])
    assert effects.loc[("paper", "update_omission"), "agrees"], "KL falls, as on the original"
    assert effects.loc[("paper", "update_omission"), "actor/kl proxy"] == pytest.approx(-0.03)
    assert effects.loc[("paper", "rollout_logprob_precision"), "agrees"], "drift and its KL rise on both"
    assert not effects.loc[("paper", "rollout_logprob_precision"), "also agrees"], "the PPO KL did not rise"
    assert effects.loc[("paper", "update_omission"), "also agrees"], "the reward fell on both"
    assert not effects.loc[("random", "rollout_logprob_precision"), "agrees"], "no drift on the proxy"
    assert not effects.loc[("random", "update_omission"), "agrees"], (
        "a proxy that never learns shows no effect"
    )
    shares = paper_fault_agreement(result)
    assert shares.loc[("update_omission", "1/4"), "paper"] == 1.0
    assert shares.loc[("update_omission", "1/4"), "random"] == 0.0
    assert shares.loc[("rollout_logprob_precision", "1/4"), "random"] == 0.0
    assert paper_fault_agreement({"rows": [], "originals": []}).empty
    table = no_signal_table(result).set_index("method")
    assert table.loc["random", "no_signal"] == 1.0 and table.loc["paper", "no_signal"] == 0.5
    assert (table["original"] == 0.5).all()
