"""The faults users report beyond routing (engine drift, a parallel layout, a resume, packing,
replay wired wrong, an aux loss counted twice): each leaves its signature on both embedded
models and on their 1/4 proxies; a fault the run has no setting for is refused before a model
loads; the masks and the routes overlap check at work."""

from __future__ import annotations

import pytest

import moescope
from moescope import schema as S
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.findings import Finding
from moescope.analyze.remedies import next_steps
from moescope.errors import MoescopeError
from moescope.replay import ReplayConfig
from moescope.replay.faults import KINDS

BASE = {"steps": 4, "prompts_per_step": 2, "group_size": 4, "tasks": ("add2", "add3")}
RUNS = {  # the mismatch faults one a run (each raises rollout_mismatch); the rest together
    "engine_drift": {"faults": ("engine_drift:0.01",)},
    "parallel_reduction": {"faults": ("parallel_reduction",)},
    "packing_positions": {"faults": ("packing_positions",), "packing": True},
    "wiring": {
        "faults": ("stale_routes", "resume_state@2", "aux_loss_double@2"),
        "routing_replay": True,
        "aux_loss_coef": 0.01,
    },
}
MODELS = ("toy", "toy-v3", "toy 1/4", "toy-v3 1/4")


@pytest.fixture(scope="module")
def traces(tmp_path_factory, one_thread):
    from moescope.export.pipeline import export_proxy

    root = tmp_path_factory.mktemp("field-faults")
    sources = {"toy": "toy", "toy-v3": "toy-v3"}
    for model in ("toy", "toy-v3"):
        sources[f"{model} 1/4"] = export_proxy(
            model, root / f"{model}-proxy", keep="1/4", method="frequency", n_tokens=1000,
            fidelity=False, min_capability=0, progress=False,
        ).path  # fmt: skip
    return {
        (model, run): moescope.replay(
            source, ReplayConfig(**BASE, **kw), out=root / f"{model.replace(' 1/4', '-quarter')}-{run}.jsonl"
        )
        for model, source in sources.items()
        for run, kw in RUNS.items()
    }


def found(trace) -> dict[str, Finding]:
    return {f.type: f for f in diagnose(trace) if f.severity != "info"}


@pytest.mark.parametrize("model", MODELS)
def test_each_mismatch_fault_opens_a_gap_from_its_step(traces, model: str) -> None:
    for run in ("engine_drift", "parallel_reduction", "packing_positions"):
        trace = traces[model, run]
        gaps = [step[S.LOGPROB_MISMATCH] for step in trace.steps]
        assert all(g > 0 for g in gaps), (run, gaps)
        assert found(trace)["rollout_mismatch"].step == 0, run
        assert set(KINDS[run].signature) <= set(found(trace)), run
    drift = [step[S.LOGPROB_MISMATCH] for step in traces[model, "engine_drift"].steps]
    assert drift[-1] > 2 * drift[0]  # it grows step by step
    packing = traces[model, "packing_positions"].steps[0][S.LOGPROB_MISMATCH]
    assert packing > 10 * traces[model, "parallel_reduction"].steps[0][S.LOGPROB_MISMATCH]


@pytest.mark.parametrize("model", MODELS)
def test_wiring_faults_leave_their_own_findings(traces, model: str) -> None:
    trace = traces[model, "wiring"]
    findings = found(trace)
    for name in ("stale_routes", "resume_state", "aux_loss_double"):
        assert set(KINDS[name].signature) <= set(findings), (name, sorted(findings))
    assert all(step[S.ROUTE_OVERLAP] < 0.8 for step in trace.steps)
    assert findings["route_overlap_low"].step == 0
    assert findings["optimizer_reset"].step == 2 and findings["aux_loss_doubled"].step == 2
    counts = [step[S.OPTIMIZER_STEPS] for step in trace.steps]
    assert counts[2] < counts[1]
    aux = [step[S.AUX_LOSS] for step in trace.steps]
    assert 1.6 < aux[2] / aux[1] < 2.4


def test_a_healthy_routing_replay_keeps_its_routes(tmp_path) -> None:
    """The overlap check's negative control: replay on, the trainer's router makes the same
    choices (an fp8 rollout leaves a few per cent different), and no finding is raised."""
    masks = {"is_mask": 2.0, "seq_kl_mask": 1e-3}
    config = ReplayConfig(**BASE, routing_replay=True, faults=("routing_mismatch",), **masks)
    trace = moescope.replay("toy", config, out=tmp_path / "t.jsonl")
    assert all(step[S.ROUTE_OVERLAP] > 0.9 for step in trace.steps)
    assert "route_overlap_low" not in found(trace)
    assert all(0 <= step[S.MASKED_FRAC] <= 1 for step in trace.steps)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"faults": ("packing_positions",)}, "needs packed rows; add --packing"),
        ({"faults": ("stale_routes",)}, "needs routing replay; add --routing-replay"),
        ({"faults": ("aux_loss_double@1",)}, "needs a load-balancing loss; add --aux-loss-coef"),
        ({"faults": ("stale_routes:step",), "routing_replay": True}, "step 0 has none"),
        ({"faults": ("parallel_reduction:fp8",)}, "takes bf16 or fp16"),
        ({"is_mask": 0.5}, "is_mask must be above 1"),
    ],
)
def test_a_fault_without_its_setting_is_one_sentence(kw: dict, match: str) -> None:
    with pytest.raises(MoescopeError, match=match):
        ReplayConfig(**BASE, **kw)


def test_diagnose_names_each_new_faults_fixes() -> None:
    mismatch = next_steps(Finding("rollout_mismatch", 3, "warning", "x"))
    others = {a["fault"]: a["fixes"] for a in mismatch["also"]}
    assert {"engine_drift", "parallel_reduction", "packing_positions", "stale_routes"} <= set(others)
    assert all("is_mask" in fixes for fixes in others.values())
    for kind, fault in (
        ("route_overlap_low", "stale_routes"),
        ("optimizer_reset", "resume_state"),
        ("aux_loss_doubled", "aux_loss_double"),
    ):
        assert next_steps(Finding(kind, 3, "warning", "x"))["fault"] == fault


@pytest.mark.parametrize(
    "kind", ["rollout_mismatch", "route_overlap_low", "optimizer_reset", "aux_loss_doubled"]
)
def test_every_suggested_line_runs_as_validate_reads_it(kind: str) -> None:
    """Each line's fault fits the replay its flags make (packing, routing replay, an aux loss)."""
    import shlex
    from dataclasses import replace

    from moescope.analyze.fixes import fix_fields
    from moescope.cli import build_parser, replay_config

    steps = next_steps(Finding(kind, 3, "warning", "x"), proxy="proxy-dir")
    lines = steps["validate"] + [line for other in steps["also"] for line in other["validate"]]
    outs = [shlex.split(line)[-1] for line in lines]
    assert len(set(outs)) == len(outs)  # each its own directory
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[1:])
        config = replace(replay_config(args), faults=(args.validate_fault,))  # refused if it lacks a setting
        replace(config, **fix_fields(config, args.fix))


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["validate", "toy", "--fault", "packing_positions", "--fix", "is_mask"], "needs packed rows"),
        (["validate", "toy", "--fault", "stale_routes", "--fix", "seq_kl_mask"], "needs routing replay"),
        (["validate", "toy", "--fault", "engine_drift", "--fix", "ice_pop"], "unknown fix 'ice_pop'"),
        (
            ["validate", "toy", "--fault", "engine_drifts", "--fix", "is_mask"],
            "Unknown fault 'engine_drifts'",
        ),
        (["replay", "toy", "--fault", "aux_loss_double@1"], "needs a load-balancing loss"),
    ],
)
def test_the_command_line_refuses_in_one_sentence_and_writes_nothing(
    tmp_path, capsys, argv: list[str], said: str
) -> None:
    from moescope.cli import main

    out = tmp_path / "out"
    assert main([*argv, "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
