"""Diagnosis and verdict: faulted toy replays, negative controls, and synthetic traces per finding type."""

from __future__ import annotations

import json
import math

import pytest
from cli_process import moescope_process

import moescope
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.verdict import compare, compare_healthy, proxy_only
from moescope.replay import ReplayConfig
from moescope.traces import Trace

BASE = {"steps": 12, "prompts_per_step": 4, "group_size": 8, "tasks": ("add2", "add3")}


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """Traces of the toy, healthy and faulted, written once for the module."""
    root = tmp_path_factory.mktemp("replays")
    runs = {
        "healthy": {},
        "healthy_fp16": {"precision": "fp16"},
        "healthy_opefo": {"token_entropy_flow_control": True},
        "lr_spike": {"faults": ("lr_spike@6",)},
        "fp16_overflow": {"precision": "fp16", "faults": ("fp16_overflow@6",)},
        "nan_op": {"faults": ("nan_op@6",)},
    }
    return {
        name: moescope.replay("toy", ReplayConfig(**{**BASE, **kw}), out=root / f"{name}.jsonl")
        for name, kw in runs.items()
    }


def by_type(findings):
    return {f.type: f for f in findings}


def serious(findings):
    return [f for f in findings if f.severity != "info"]


@pytest.mark.parametrize("name", ["healthy", "healthy_fp16", "healthy_opefo"])
def test_healthy_runs_raise_no_warning(replays, name):
    assert serious(diagnose(replays[name])) == []


def test_a_healthy_replay_of_toy_v3_raises_no_warning(tmp_path):
    """The second embedded model, which solves more of its prompts (over half of its groups have no
    reward spread): its healthy run is no stall, no collapse, nothing."""
    trace = moescope.replay("toy-v3", ReplayConfig(**BASE), out=tmp_path / "v3.jsonl")
    assert max(s["reward/no_signal_frac"] for s in trace.steps) > 0 and serious(diagnose(trace)) == []


def test_lr_spike_is_a_grad_spike_and_a_kl_blowup_at_the_step(replays):
    found = by_type(diagnose(replays["lr_spike"]))
    assert found["grad_spike"].step == 6 and found["grad_spike"].severity == "warning"
    assert found["kl_blowup"].step in (6, 7) and found["kl_blowup"].severity == "error"


def test_fp16_overflow_episode_is_dated_at_the_fault(replays):
    overflow = by_type(diagnose(replays["fp16_overflow"]))["overflow"]
    assert overflow.step == 6 and overflow.severity == "warning"
    assert overflow.evidence["skipped"] > 3 and overflow.evidence["halvings"]
    healthy = by_type(diagnose(replays["healthy_fp16"])).get("overflow")
    assert healthy is None or healthy.severity == "info"  # the scaler settling at the start


def test_nan_op_is_isolated_and_names_the_module(replays):
    found = by_type(diagnose(replays["nan_op"]))
    nf = found["nonfinite"]
    assert nf.step == 6 and nf.severity == "error" and not nf.evidence["persistent"]
    assert nf.evidence["module"] == "model.layers.3.mlp.experts"
    assert nf.evidence["first_family"] == "log-prob/KL"  # the forward went bad before the gradients
    assert "overflow" not in found  # fp32 skips are not fp16 overflow


def test_compare_a_trace_with_itself_and_with_a_healthy_run(replays):
    spike, healthy = replays["lr_spike"], replays["healthy"]
    same = compare(spike, spike)
    assert same.verdict == "reproduced" and all(m.offset_steps == 0 for m in same.findings)
    assert {"grad_spike", "kl_blowup"} <= set(same.signature) and same.every_finding == "reproduced"
    assert all(c.spearman == pytest.approx(1.0) for c in same.curves if c.spearman is not None)
    missed = compare(spike, healthy)
    assert missed.verdict == "not reproduced"
    assert {m.type for m in missed.findings if not m.reproduced} >= {"grad_spike", "kl_blowup"}
    assert compare(healthy, healthy).verdict == "both healthy"
    alarm = compare(healthy, spike)
    assert alarm.verdict == "not reproduced" and all(m.false_alarm for m in alarm.findings)
    json.dumps(same.to_dict())


def test_a_proxy_reproduces_the_lr_spike(tmp_path, replays):
    from moescope.export.pipeline import export_proxy

    proxy = export_proxy("toy", tmp_path / "p", keep="1/2", method="frequency", n_tokens=2000, progress=False,
                         fidelity=False).path  # fmt: skip
    config = ReplayConfig(**{**BASE, "faults": ("lr_spike@6",)})
    proxy_trace = moescope.replay(proxy, config, out=tmp_path / "proxy.jsonl")
    verdict = compare(replays["lr_spike"], proxy_trace)
    matched = {m.type: m for m in verdict.findings}
    assert matched["grad_spike"].reproduced and matched["grad_spike"].on_time
    assert matched["kl_blowup"].reproduced and matched["kl_blowup"].on_time
    assert verdict.verdict == "reproduced", verdict.reasons  # on the signature: grad_spike, kl_blowup


def test_a_proxys_own_findings_are_set_apart_with_the_healthy_runs_as_baseline(tmp_path, replays):
    """Four of the 32 experts at random leave the toy unable to add: every group's rewards are
    equal from the first step, without any fault. With the healthy runs as baseline that is the
    proxy's own finding, not a false alarm of the fault's."""
    from moescope.export.pipeline import export_proxy

    proxy = export_proxy("toy", tmp_path / "p", keep="1/8", method="random", n_tokens=2000, progress=False,
                         fidelity=False).path  # fmt: skip
    runs = {
        name: moescope.replay(proxy, ReplayConfig(**{**BASE, **kw}), out=tmp_path / f"{name}.jsonl")
        for name, kw in (("healthy", {}), ("lr_spike", {"faults": ("lr_spike@6",)}))
    }
    healthy = compare_healthy(replays["healthy"], runs["healthy"])
    assert "no_signal" in proxy_only(healthy) and healthy.verdict == "not reproduced"
    plain = compare(replays["lr_spike"], runs["lr_spike"])
    based = compare(replays["lr_spike"], runs["lr_spike"], healthy=healthy)
    before, after = ({m.type: m for m in c.findings} for c in (plain, based))
    # judged against the fault without the baseline: a false alarm, or (where the toy's reward
    # collapse leaves it stalled too) the toy's no_signal "reproduced" steps too early
    counted = before["no_signal"]
    assert not counted.own and (counted.false_alarm or (counted.original_step > 0 and not counted.on_time))
    assert after["no_signal"].own and based.own == proxy_only(healthy)
    set_apart = (
        "the proxy's own, set apart",
        "the proxy raises it without a fault",
    )  # alone, or beside the toy's
    assert any("no_signal" in r and any(s in r for s in set_apart) for r in based.reasons), based.reasons
    assert not any("no_signal only on the proxy (step" in r and "set apart" not in r for r in based.reasons)
    assert [m.type for m in based.findings if not m.own] == [
        m.type for m in plain.findings if m.type not in based.own
    ]

    args = [str(replays["lr_spike"].path), "--against", str(runs["lr_spike"].path), "--healthy"]
    p = moescope_process("diagnose", *args, str(replays["healthy"].path), str(runs["healthy"].path))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    assert "the proxy raises no_signal (step" in out and any(s in out for s in set_apart)
    p = moescope_process("diagnose", *args, str(replays["healthy"].path), str(runs["lr_spike"].path))
    _, err = p.communicate(timeout=300)  # a faulted run given as the baseline
    assert p.returncode == 2 and "injected lr_spike@6" in err and len(err.strip().splitlines()) == 1, err
    p = moescope_process(
        "diagnose", *args[:1], "--healthy", str(replays["healthy"].path), str(runs["healthy"].path)
    )
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "--against" in err and len(err.strip().splitlines()) == 1, err


# --- synthetic traces: one rule each, with its negative control ---------------------------------


def trace(rows, header=None):
    return Trace(header=header or {}, steps=[{"step": i, **row} for i, row in enumerate(rows)])


def test_null_counts_as_non_finite_only_for_numeric_keys():
    t = trace([{"actor/kl": 0.1, "note": None}] * 4 + [{"actor/kl": None}])
    nf = by_type(diagnose(t))["nonfinite"]
    assert nf.step == 4 and nf.evidence["null_only"]
    assert "nonfinite" not in by_type(diagnose(trace([{"actor/kl": 0.1, "note": None}] * 5)))


def test_persistent_non_finite_and_family_order():
    rows = [{"actor/pg_loss": 0.0, "actor/grad_norm": 1.0}] * 3
    rows += [{"actor/pg_loss": math.nan, "actor/grad_norm": math.inf}] * 4
    nf = by_type(diagnose(trace(rows)))["nonfinite"]
    assert (
        nf.step == 3 and nf.evidence["persistent"] and nf.evidence["families"] == ["policy loss", "gradients"]
    )


def test_a_vanished_loss_field_is_a_suspected_non_finite_loss():
    rows = (
        [{"actor/loss": 2.0, "actor/grad_norm": 1.0}] * 6
        + [{"actor/grad_norm": 1.0}]
        + [{"actor/loss": 2.0, "actor/grad_norm": 1.0}] * 3
    )
    nf = by_type(diagnose(trace(rows)))["nonfinite"]
    assert nf.step == 6 and nf.severity == "warning" and nf.evidence["suspected"]


def test_zero_grad_only_while_rewards_vary():
    rows = [{"actor/grad_norm": 1.0, "reward/std": 0.4}] * 3 + [{"actor/grad_norm": 0.0, "reward/std": 0.4}]
    assert by_type(diagnose(trace(rows)))["zero_grad"].step == 3
    quiet = [{"actor/grad_norm": 0.0, "reward/std": 0.0}] * 4
    assert "zero_grad" not in by_type(diagnose(trace(quiet)))


def test_divergence_is_judged_on_level_losses_never_on_the_policy_loss():
    rising = [{"critic/vf_loss": 1.0 + (30.0 if i > 8 else 0.0)} for i in range(14)]
    assert by_type(diagnose(trace(rising)))["loss_divergence"].step == 9
    grpo = [{"actor/pg_loss": 1e-4 * (100 if i > 8 else 1)} for i in range(14)]  # near 0 by construction
    assert "loss_divergence" not in by_type(diagnose(trace(grpo)))
    pretraining = [{"actor/loss": 2.0 if i < 9 else 40.0} for i in range(14)]  # Megatron's lm loss maps here
    assert by_type(diagnose(trace(pretraining)))["loss_divergence"].step == 9
    rl = [{**row, "reward/mean": 0.5} for row in pretraining]  # in an RL run actor/loss has no level
    assert "loss_divergence" not in by_type(diagnose(trace(rl)))


def test_entropy_collapse_respects_the_opefo_floor():
    rows = [{"actor/entropy": 1.0 if i < 6 else 0.2} for i in range(12)]
    assert by_type(diagnose(trace(rows)))["entropy_collapse"].step == 6
    floor = {"replay_config": {"token_entropy_flow_control": True, "min_entropy_floor": 0.1}}
    assert "entropy_collapse" not in by_type(diagnose(trace(rows, floor)))  # still above the floor
    surge = [{"actor/entropy": 0.3 if i < 6 else 2.0} for i in range(12)]
    assert by_type(diagnose(trace(surge)))["entropy_surge"].step == 6


def test_reward_collapse_no_signal_and_degenerate_output():
    rows = [
        {"reward/mean": 0.6 if i < 5 else 0.0, "reward/no_signal_frac": 0.2 if i < 5 else 1.0}
        for i in range(12)
    ]
    found = by_type(diagnose(trace(rows)))
    assert found["reward_collapse"].step == 5 and found["no_signal"].step == 5
    lucky = [{**r, "reward/no_signal_frac": 1.0} if i == 1 else r for i, r in enumerate(rows)]
    assert by_type(diagnose(trace(lucky)))["no_signal"].step == 5  # one early dead step does not date it
    scattered = [{"reward/no_signal_frac": float(i % 2)} for i in range(12)]
    assert by_type(diagnose(trace(scattered)))["no_signal"].step == 1  # never held: its first dead step

    # a signal gone at the end of a long log counts however long the run went well before
    def stalled(dead: range, steps: int = 20) -> dict:
        return by_type(diagnose(trace([{"reward/no_signal_frac": float(i in dead)} for i in range(steps)])))

    assert stalled(range(15, 20))["no_signal"].step == 15
    assert "since step 15 (5 steps, to the end of the log)" in stalled(range(15, 20))["no_signal"].message
    assert "no_signal" not in stalled(range(18, 20))  # two steps: not yet held
    assert "no_signal" not in stalled(range(5, 9))  # a stretch the run recovered from, under half the run
    cut = [{"response/truncated_frac": 0.1 if i < 4 else 1.0} for i in range(10)]
    assert by_type(diagnose(trace(cut)))["degenerate_output"].step == 4
    same = [{"response_length/min": 7, "response_length/max": 7 if i > 3 else 9} for i in range(9)]
    assert by_type(diagnose(trace(same)))["degenerate_output"].step == 4


def test_a_reward_that_rose_and_lost_it_all_collapses_against_its_peak():
    """ml-agents#101's shape: from 4 up to 70, then down to 0.3 on a few last steps; the early
    level (4) would need five steps under 0.8, the peak sees the fall from 70."""
    reward = [4.0] * 5 + [70.0] * 20 + [9.0] * 3 + [0.3] * 2
    found = by_type(diagnose(trace([{"reward/mean": v} for v in reward])))
    assert found["reward_collapse"].step == 25 and found["reward_collapse"].evidence["baseline"] == 70.0
    assert "against a peak of 70" in found["reward_collapse"].message
    # a sparse reward's one lucky step (0.05 around, 0.9 once) sets no peak to fall from
    sparse = [0.9 if i == 12 else (0.02, 0.05, 0.08)[i % 3] for i in range(40)]
    assert "reward_collapse" not in by_type(diagnose(trace([{"reward/mean": v} for v in sparse])))
    kept = [4.0] * 5 + [70.0] * 20 + [20.0] * 10  # a fall to under a third of the peak, held: a harder stage
    assert "reward_collapse" not in by_type(diagnose(trace([{"reward/mean": v} for v in kept])))


def test_a_long_run_whose_per_step_rewards_are_as_noisy_as_their_mean_dips_by_chance_not_collapse():
    """20,000 steps of a reward drawn afresh each step (uniform on 0..1, a batch of one) and an
    entropy as noisy: a three-step running mean dips under a fifth of the early level by chance
    somewhere in such a run, the noise the window is widened against; a fall to near 0 that holds
    is found all the same, dated at the fall."""
    import random

    r = random.Random(7)
    noisy = [{"reward/mean": r.random(), "actor/entropy": r.uniform(0.2, 0.8)} for _ in range(20_000)]
    assert not {"reward_collapse", "entropy_collapse"} & set(by_type(diagnose(trace(noisy))))
    fallen = noisy[:15_000] + [{**row, "reward/mean": 0.05 * row["reward/mean"]} for row in noisy[15_000:]]
    collapse = by_type(diagnose(trace(fallen)))["reward_collapse"]
    assert 15_000 <= collapse.step < 15_050


def test_load_collapse_per_layer_and_not_for_experts_never_used():
    uniform = [1 / 8] * 8
    hot = [0.93] + [0.01] * 7  # so hot that a window of mostly hot steps already counts
    rows = [{"moe/expert_load": [uniform, uniform if i < 8 else hot]} for i in range(16)]
    lc = by_type(diagnose(trace(rows)))["load_collapse"]
    assert lc.layer == 1 and lc.step == 8  # the first step that shows it, not its window's first
    cv = [{"moe/load_cv": 0.4 if i < 8 else 2.5} for i in range(16)]  # a log with only the scalar
    assert by_type(diagnose(trace(cv)))["load_collapse"].step == 8
    aux = [{"moe/aux_loss": 1.0 if i < 8 else 3.0} for i in range(16)]
    assert by_type(diagnose(trace(aux)))["load_collapse"].step == 8
    domain = [0.25, 0.25, 0.25, 0.25, 0, 0, 0, 0]  # half the experts never routed to: not a collapse
    assert "load_collapse" not in by_type(diagnose(trace([{"moe/expert_load": [domain]}] * 16)))


def test_cli_diagnose_json_and_against(replays):
    spike, healthy = replays["lr_spike"].path, replays["healthy"].path
    p = moescope_process("diagnose", str(spike), "--against", str(healthy), "--json")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    result = json.loads(out)
    assert result["format"] == "moescope" and result["steps"] == 12
    assert {"grad_spike", "kl_blowup"} <= {f["type"] for f in result["findings"]}
    assert result["comparison"]["verdict"] == "not reproduced"
    assert result["comparison"]["reasons"][0].startswith(
        "the traces name different faults (lr_spike against none)"
    )
    p = moescope_process("diagnose", str(spike), "--against", str(spike), "--every-finding", "--json")
    out, err = p.communicate(timeout=300)
    itself = json.loads(out)["comparison"]
    assert p.returncode == 0 and itself["verdict"] == itself["every_finding"] == "reproduced", err
    assert itself["faults"] == itself["signature"] == []  # no signature looked for: every finding judged
    p = moescope_process("diagnose", str(spike), "--against", str(spike), "--fault", "nan_op", "--json")
    out, err = p.communicate(timeout=300)
    named = json.loads(out)["comparison"]  # as for a log whose header does not name its fault
    assert p.returncode == 0 and named["faults"] == ["nan_op"] and named["signature"] == [], err
    assert named["reasons"][0].startswith("the original shows none of the signature of nan_op (nonfinite)")
    p = moescope_process("diagnose", str(healthy))
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0 and "no findings" in out


def test_cli_diagnose_bad_input_exits_2(tmp_path):
    empty, garbage = tmp_path / "empty.log", tmp_path / "garbage.bin"
    empty.write_text("")
    garbage.write_bytes(bytes(range(256)) * 8)
    for args in (
        [empty],
        [garbage],
        [tmp_path / "missing.log"],
        [empty, "--against", empty, "--fault", "bogus"],
    ):
        p = moescope_process("diagnose", *map(str, args))
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "Unknown fault 'bogus'" in err  # named before any log is read


def test_findings_on_one_step_come_causes_first():
    """A NaN update on the step whose every response hit the length limit and scored 0: the NaN
    is listed first, then the dead rewards, then the clipped responses (not by name)."""
    row = {
        "actor/grad_norm": math.nan,
        "response/truncated_frac": 1.0,
        "reward/mean": 0.0,
        "reward/std": 0.0,
    }
    found = [f.type for f in diagnose(trace([row]))]
    assert found[:3] == ["nonfinite", "no_signal", "degenerate_output"], found
