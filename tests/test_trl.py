"""moescope inside TRL: a real ``GRPOTrainer`` run on the toy writes a moescope trace."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from browser import free_port
from transformers import LlamaConfig, LlamaForCausalLM

from moescope import schema as S
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.verdict import compare
from moescope.errors import MoescopeError
from moescope.integrations.fsdp import check_sharding
from moescope.integrations.trl import MoescopeCallback, instrument
from moescope.integrations.trl_tasks import grpo_on_tasks
from moescope.models.embedded import embedded_path
from moescope.traces import read_trace

STEPS = 4
SMALL = {"max_steps": STEPS, "per_device_train_batch_size": 8, "num_generations": 4, "prompts_per_task": 16}


def run(model, tmp_path: Path, name: str, **config) -> tuple[MoescopeCallback, object]:
    callback = MoescopeCallback(tmp_path / f"{name}.jsonl")
    trainer = grpo_on_tasks(model, tmp_path / name, callbacks=[callback], **{**SMALL, **config})
    trainer.train()
    return callback, trainer


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl")
    _, trainer = run("toy", tmp, "toy")
    return read_trace(tmp / "toy.jsonl"), trainer


def test_one_line_per_optimizer_step_with_trls_metrics_and_the_moe_metrics(toy_run) -> None:
    trace, trainer = toy_run
    assert [s[S.STEP] for s in trace.steps] == list(range(STEPS))
    header = trace.header
    assert header["format"] == "moescope.trace" and header["engine"] == "trl" and header["proxy"] is None
    assert header["trainer_config"]["num_generations"] == 4 and header["num_experts"] == 32
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    for step, entry in zip(trace.steps, logged, strict=True):
        assert step[S.REWARD_MEAN] == pytest.approx(entry["reward"]) and S.NO_SIGNAL_FRAC in step
        load = step[S.EXPERT_LOAD]
        assert len(load) == len(header["moe_layers"]) and all(sum(row) == pytest.approx(1) for row in load)
        assert step[S.ROUTER_ENTROPY] > 0 and step[S.ROUTER_LOGIT_MAX] > 0 and step[S.TOPK_MARGIN] >= 0
        assert step[S.NONFINITE] == 0 and S.FIRST_NONFINITE_MODULE not in step
        groups = [v for k, v in step.items() if k.startswith(S.GRAD_NORM_GROUP)]
        # the groups, scaled back from after clipping, add up to the pre-clip norm TRL logged
        assert math.sqrt(sum(g * g for g in groups)) == pytest.approx(step[S.GRAD_NORM], rel=1e-4)
    assert isinstance(diagnose(trace), list)


def test_token_entropy_by_position_adds_up_to_trls_entropy_and_draws(toy_run) -> None:
    from moescope.display.charts import entropy_flow

    trace, _ = toy_run
    for step in trace.steps:
        flow = step[S.TOKEN_ENTROPY]
        counted = [(m, n) for m, n in zip(flow["bucket_mean"], flow["bucket_tokens"], strict=True) if n]
        mean = sum(m * n for m, n in counted) / sum(n for _, n in counted)
        assert mean == pytest.approx(step[S.ENTROPY], rel=1e-5)  # the same tokens TRL averages
        assert sum(flow["hist"]) == sum(flow["bucket_tokens"]) and flow["bucket_tokens"][0] > 0
    assert entropy_flow(trace).to_dict()["vconcat"]


def test_the_hooks_come_off_when_training_ends(toy_run) -> None:
    _, trainer = toy_run
    model = getattr(trainer.model, "module", trainer.model)
    hooks = [h for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks) for h in d.values()]
    assert hooks, "transformers keeps its own hooks"
    assert not [h for h in hooks if getattr(h, "__module__", "").startswith("moescope")], "ours are gone"


def test_a_proxy_run_carries_its_manifest_and_compares_with_the_original(toy_run, tmp_path: Path) -> None:
    from moescope.export.pipeline import export_proxy

    proxy = tmp_path / "proxy"
    export_proxy(
        "toy", proxy, keep="1/4", method="random", min_capability=0.0, fidelity=False, progress=False
    )
    run(proxy, tmp_path, "proxy")
    trace = read_trace(tmp_path / "proxy.jsonl")
    assert trace.header["proxy"]["keep"] == 8 and len(trace.steps[0][S.EXPERT_LOAD][0]) == 8
    assert compare(toy_run[0], trace).verdict  # the same vocabulary: compare reads both


def test_a_dense_or_unsupported_model_is_refused_when_the_trainer_is_built(tmp_path: Path) -> None:
    from transformers import JetMoeConfig, JetMoeForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    jetmoe = JetMoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_key_value_heads=2, kv_channels=16, num_local_experts=4,
                          num_experts_per_tok=2)  # fmt: skip
    for model, why in ((LlamaForCausalLM(config), "dense"), (JetMoeForCausalLM(jetmoe), "not supported")):
        model.config._name_or_path = str(embedded_path("toy"))  # the toy's tokenizer
        callback = MoescopeCallback(tmp_path / "t.jsonl")
        with pytest.raises(MoescopeError, match=why):
            grpo_on_tasks(model, tmp_path / "out", callbacks=[callback], **SMALL)
        assert not (tmp_path / "t.jsonl").exists()


def test_an_unwritable_trace_path_is_refused_before_training(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(MoescopeError, match="cannot write the trace"):
        MoescopeCallback(tmp_path / "file" / "run.jsonl")
    with pytest.raises(MoescopeError, match="is a directory"):
        MoescopeCallback(tmp_path)


def test_a_crash_mid_run_leaves_the_finished_steps_readable(tmp_path: Path, monkeypatch) -> None:
    callback = MoescopeCallback(tmp_path / "crash.jsonl")
    trainer = grpo_on_tasks("toy", tmp_path / "out", callbacks=[callback], **SMALL)
    step = trainer.training_step
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the engine died")
        return step(*args, **kwargs)

    monkeypatch.setattr(trainer, "training_step", failing)
    with pytest.raises(RuntimeError, match="engine died"):
        trainer.train()
    lines = (tmp_path / "crash.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every line whole
    assert [s[S.STEP] for s in read_trace(tmp_path / "crash.jsonl").steps] == [0, 1]
    assert torch.is_grad_enabled()


# ------------------------------------------------------------------------------- faults in TRL


def faulted(tmp_path: Path, name: str, faults: str, **config) -> object:
    trainer = grpo_on_tasks("toy", tmp_path / name, **{**SMALL, **config})
    instrument(trainer, tmp_path / f"{name}.jsonl", faults=faults)
    trainer.train()
    return read_trace(tmp_path / f"{name}.jsonl")


def test_an_lr_spike_collapses_the_reward_as_in_a_replay(tmp_path: Path) -> None:
    full = {"per_device_train_batch_size": 16, "num_generations": 8, "prompts_per_task": 64}  # the defaults
    trace = faulted(tmp_path, "spike", "lr_spike@3", max_steps=8, **full)
    lr = [s[S.LR] for s in trace.steps]
    assert lr[3] > 100 * lr[2] and lr[4] < 2 * lr[2], "one step at 1000x, then the scheduler's rate"
    assert trace.header["faults"] == ["lr_spike@3"]
    found = {f.type: f.step for f in diagnose(trace)}
    assert found["reward_collapse"] >= 4, found


@pytest.mark.slow
def test_an_lr_spike_is_judged_on_its_signature_not_on_where_the_broken_policy_goes(tmp_path: Path) -> None:
    """Three seeds of the toy under the same spike: the reward collapses at the same step on
    each, and then the broken policies may go different ways (toward noise, into a repetition
    loop: which seeds go which way depends on the CPU's arithmetic, and on some CPUs all go the
    same way), so the original need not reproduce itself finding for finding. The verdict judges
    the signature: every pair of seeds reproduces it, whatever follows (the rule itself is tested
    on findings that differ in ``test_verdict``); a tenfold spike, which the policy survives, does
    not reproduce the thousandfold one."""
    config = {
        "max_steps": 12,
        "per_device_train_batch_size": 32,
        "num_generations": 8,
        "prompts_per_task": 64,
    }
    runs = [faulted(tmp_path, f"s{seed}", "lr_spike@4", seed=seed, **config) for seed in (0, 1, 2)]
    pairs = [compare(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :]]
    for pair in pairs:
        assert pair.verdict == "reproduced" and pair.signature == ["reward_collapse"], pair.reasons
        assert pair.every_finding in ("reproduced", "partially reproduced"), pair.reasons
    mild = faulted(tmp_path, "mild", "lr_spike@4:10", **config)
    assert compare(runs[0], mild).verdict == "not reproduced"


def test_update_omission_reward_scale_and_no_grad_clip_leave_their_signatures(tmp_path: Path) -> None:
    trace = faulted(tmp_path, "a", "reward_scale@2:100, no_grad_clip@0")
    rewards = [s[S.REWARD_MEAN] for s in trace.steps]
    assert max(rewards[:2]) <= 1 and max(rewards[2:]) > 1, "rewards x100 from step 2"
    assert all(s[S.CLIP_COEF] == 1 for s in trace.steps)  # clipping off...
    assert max(s[S.GRAD_NORM] for s in trace.steps) > 1  # ...though a norm exceeds the bound of 1
    omitted = faulted(tmp_path, "b", "update_omission@2")
    assert [s[S.UPDATE_APPLIED] for s in omitted.steps] == [1, 1, 0, 0]
    assert all(s[S.GRAD_NORM] > 0 for s in omitted.steps[2:])
    assert any(s[S.CLIP_COEF] < 1 for s in omitted.steps)  # clipping on: a norm above 1 is clipped


def test_a_resume_without_the_optimizer_state_restarts_its_count(tmp_path: Path) -> None:
    trace = faulted(tmp_path, "r", "resume_state@2")
    assert [s[S.OPTIMIZER_STEPS] for s in trace.steps] == [1, 2, 1, 2]
    assert {f.type: f.step for f in diagnose(trace)}["optimizer_reset"] == 2


def test_an_omitted_update_leaves_the_weights_as_they_were(tmp_path: Path) -> None:
    trainer = grpo_on_tasks("toy", tmp_path / "o", **SMALL)
    instrument(trainer, tmp_path / "o.jsonl", faults="update_omission@0")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_nan_op_names_the_module_it_poisoned(tmp_path: Path) -> None:
    trace = faulted(tmp_path, "nan", f"nan_op@{STEPS - 1}")
    last = trace.steps[-1]
    assert last[S.NONFINITE] > 0 and last[S.FIRST_NONFINITE_MODULE] == "model.layers.3.mlp.experts"
    assert all(s[S.NONFINITE] == 0 for s in trace.steps[:-1])
    assert "nonfinite" in {f.type for f in diagnose(trace)}


def test_low_precision_routers_are_measured_against_full_precision(tmp_path: Path) -> None:
    sampling = faulted(tmp_path, "sampling", "routing_mismatch:fp8")
    flips = [step[S.ROUTING_FLIP_FRAC] for step in sampling.steps]
    assert sum(flips) > 0 and max(flips) < 0.5 and len(sampling.steps[0][S.ROUTING_FLIP_LAYERS]) == 4
    # a bf16 router on every pass: measured too (on the toy's few tokens per step, no choice flips)
    everywhere = faulted(tmp_path, "all", "router_precision:bf16")
    assert all(0 <= step[S.ROUTING_FLIP_FRAC] < 0.5 for step in everywhere.steps)
    clean = faulted(tmp_path, "clean", "")
    assert all(S.ROUTING_FLIP_FRAC not in s for s in clean.steps)


def test_faults_a_trainer_cannot_have_are_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(MoescopeError, match="fault fp16_overflow has no equivalent inside a Trainer"):
        MoescopeCallback(tmp_path / "t.jsonl", faults="fp16_overflow@2")
    with pytest.raises(MoescopeError, match="Unknown fault 'volcano'"):
        MoescopeCallback(tmp_path / "t.jsonl", faults="volcano")
    callback = MoescopeCallback(tmp_path / "t.jsonl", faults="reward_scale@1")
    trainer = grpo_on_tasks("toy", tmp_path / "r", callbacks=[callback], **SMALL)
    with pytest.raises(MoescopeError, match="instrument"):
        trainer.train()


# ------------------------------------------------------------------------------- distributed


WORKER = ["-m", "moescope.integrations.trl_tasks", "toy", "--greedy"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
DATA_PARALLEL = ["--multi_gpu", "--mixed_precision", "no"]
FSDP2_CONFIG = Path(__file__).parents[1] / "examples" / "accelerate_fsdp2.yaml"


def launched(trace: Path, launch: list[str], *worker: str):
    """The TRL worker under ``accelerate launch`` (``launch``: its flags) in two processes; its trace."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("accelerate")), "launch", *launch,
         "--num_processes", "2", "--num_machines", "1", "--dynamo_backend", "no",
         "--main_process_port", str(free_port()),  # not a port another run may still hold
         *WORKER, *worker, "--trace", str(trace)],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return read_trace(trace)


def test_two_processes_under_accelerate_write_one_trace_equal_to_one_process(tmp_path: Path) -> None:
    """Greedy decoding makes both layouts see the same completions; the first step's statistics,
    reduced over the two processes, are the one-process run's. Later steps part a little: each
    process's router load-balancing loss is taken over its half of the batch."""
    one = subprocess.run(
        [sys.executable, *WORKER, "--steps", "2", "--batch", "16", "--trace", str(tmp_path / "one.jsonl")],
        capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    a = read_trace(tmp_path / "one.jsonl")
    b = launched(tmp_path / "two.jsonl", DATA_PARALLEL, "--steps", "2", "--batch", "8")
    assert (a.header["world_size"], b.header["world_size"]) == (1, 2)
    assert [s[S.STEP] for s in b.steps] == [0, 1], "one writer: each step once"
    first_a, first_b = a.steps[0], b.steps[0]
    for row_a, row_b in zip(first_a[S.EXPERT_LOAD], first_b[S.EXPERT_LOAD], strict=True):
        assert row_b == pytest.approx(row_a, abs=1e-6)
    for key in (
        S.LOAD_CV,
        S.ROUTER_ENTROPY,
        S.MAX_LOAD_SHARE,
        S.TOPK_MARGIN,
        S.ROUTER_LOGIT_MAX,
        S.REWARD_MEAN,
    ):
        assert first_b[key] == pytest.approx(first_a[key], rel=1e-5), key
    assert first_b[S.GRAD_NORM] == pytest.approx(first_a[S.GRAD_NORM], rel=1e-2)


def test_fsdp2_under_the_shipped_accelerate_config_measures_what_data_parallel_does(tmp_path: Path) -> None:
    """The same two processes and batches (greedy, float32, fp8 routers in generation, NaN in the
    last MoE layer's experts at step 1), once data parallel and once sharded with FSDP2 by
    examples/accelerate_fsdp2.yaml. At step 0 the routing statistics reduced over the ranks, the
    loss, and the gradient norms by group (each rank's shard, squares summed over ranks) are the
    data-parallel run's to float rounding; at step 1 both name the poisoned module and count the
    same non-finite gradients."""
    faults = ["--fault", "routing_mismatch:fp8", "--fault", "nan_op@1"]
    step = ["--steps", "2", "--batch", "8", "--fp32", *faults]
    dp = launched(tmp_path / "dp.jsonl", DATA_PARALLEL, *step)
    fsdp = launched(tmp_path / "fsdp.jsonl", ["--config_file", str(FSDP2_CONFIG)], *step)
    assert (dp.header["sharded"], fsdp.header["sharded"]) == (False, True)
    assert fsdp.header["world_size"] == 2 and [s[S.STEP] for s in fsdp.steps] == [0, 1]
    a, b = dp.steps[0], fsdp.steps[0]
    for row_a, row_b in zip(a[S.EXPERT_LOAD], b[S.EXPERT_LOAD], strict=True):
        assert row_b == pytest.approx(row_a, abs=1e-6)
    for key in (S.LOAD_CV, S.ROUTER_ENTROPY, S.TOPK_MARGIN, S.ROUTER_LOGIT_MAX, S.REWARD_MEAN, S.ACTOR_LOSS):
        assert b[key] == pytest.approx(a[key], rel=1e-6), key
    # measured on both; not equal: a sharded process that finished sampling runs the others' last
    # forwards with them (synced generation), and the routers of those passes count too
    assert 0 < a[S.ROUTING_FLIP_FRAC] < 0.5 and 0 < b[S.ROUTING_FLIP_FRAC] < 0.5
    groups = sorted(k for k in a if k.startswith(S.GRAD_NORM_GROUP))
    assert len(groups) >= 4 and groups == sorted(k for k in b if k.startswith(S.GRAD_NORM_GROUP))
    for key in [*groups, S.GRAD_NORM]:
        assert b[key] == pytest.approx(a[key], rel=1e-4), key
    assert b[S.NONFINITE] == 0 and S.FIRST_NONFINITE_MODULE not in b
    poisoned = (dp.steps[1], fsdp.steps[1])
    assert [s[S.FIRST_NONFINITE_MODULE] for s in poisoned] == ["model.layers.3.mlp.experts"] * 2
    assert poisoned[1][S.NONFINITE] == poisoned[0][S.NONFINITE] > 0


def test_a_sharding_the_instruments_cannot_read_is_refused(tmp_path: Path, monkeypatch) -> None:
    """FSDP2 over every process is read; a two-dimensional mesh (hybrid sharding), whose replicas
    a sum over ranks would count twice, FSDP1's flat parameters, and an FSDP2 launch that left
    the model whole (accelerate on CPU, without shard_on_cpu) are refused before training. One
    process of gloo is enough to build the meshes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
    from transformers import AutoModelForCausalLM

    def toy():
        return AutoModelForCausalLM.from_pretrained(embedded_path("toy"))

    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        check_sharding(fully_shard(toy()))
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
        hybrid = fully_shard(toy(), mesh=mesh)
        callback = MoescopeCallback(tmp_path / "t.jsonl")
        with pytest.raises(MoescopeError, match=r"2-dimensional mesh .* plain FSDP2"):
            callback.on_train_begin(None, None, None, model=hybrid)
        assert not (tmp_path / "t.jsonl").exists() and callback.probe is None
        flat = FullyShardedDataParallel.__new__(FullyShardedDataParallel)  # FSDP1 needs a GPU to build
        torch.nn.Module.__init__(flat)
        with pytest.raises(MoescopeError, match=r"FSDP1 .* fsdp_version: 2"):
            check_sharding(torch.nn.Sequential(flat))
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # as accelerate launch with the config sets
        monkeypatch.setenv("FSDP_VERSION", "2")
        monkeypatch.setattr("moescope.integrations.fsdp._world_size", lambda: 2)
        with pytest.raises(MoescopeError, match=r"whole model on every process .*shard_on_cpu\(trainer\)"):
            MoescopeCallback(tmp_path / "t.jsonl").on_train_begin(None, None, None, model=toy())
        assert not (tmp_path / "t.jsonl").exists()
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_the_recipe_runs_as_a_new_user_would(tmp_path: Path) -> None:
    """examples/trl_recipe.sh: export a 1/4 proxy, train both under one fault, the verdict."""
    recipe = Path(__file__).parents[1] / "examples" / "trl_recipe.sh"
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHON": sys.executable,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        # the export's healing is tested elsewhere; an unhealed proxy on the fewest calibration
        # tokens (one pass of the RL prompts) keeps this run short
        "EXPORT_FLAGS": "--min-capability 0 --no-fidelity --n-tokens 2000",
    }
    done = subprocess.run(
        ["bash", str(recipe), "toy", "lr_spike@2", "4", str(tmp_path / "r")],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = ("reproduced", "partially reproduced", "not reproduced", "both healthy")
    assert any(f": {v}\n" in done.stdout for v in verdicts), done.stdout[-2000:]
    original, proxy = (read_trace(tmp_path / "r" / f"{n}.jsonl") for n in ("original", "proxy"))
    assert original.header["faults"] == proxy.header["faults"] == ["lr_spike@2"]
    assert proxy.header["proxy"]["keep"] == 8 and len(original.steps) == len(proxy.steps) == 4
