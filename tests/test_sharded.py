"""Sharded training (FSDP2, two CPU processes over gloo): replay and healing equal one process."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from cli_process import moescope_process
from safetensors.torch import load_file
from trace_compare import close, finish, same_trace, torchrun

from moescope import schema as S
from moescope.errors import MoescopeError
from moescope.export.healing import healing_batches
from moescope.export.teacher import build_teacher_cache, distillation_loss, row_share
from moescope.models.toy import load_toy
from moescope.replay import ReplayConfig
from moescope.traces import read_trace

SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--lr", "1e-4"]


def run_ok(process) -> str:
    out, err = finish(process)
    assert process.returncode == 0, err
    return out


@pytest.mark.slow
def test_a_sharded_replay_gives_the_one_process_trace_and_resumes_from_its_sharded_checkpoint(tmp_path):
    common = ["replay", "toy", "--steps", "3", "--checkpoint-every", "1", *SMALL]
    run_ok(moescope_process(*common, "--out", str(tmp_path / "one.jsonl")))
    two = torchrun(*common, "--shard", "fsdp", "--out", str(tmp_path / "two.jsonl"))
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("trace:") == 1  # rank 0 reports
    one, sharded = read_trace(tmp_path / "one.jsonl"), read_trace(tmp_path / "two.jsonl")
    assert sharded.header["world_size"] == 2 and sharded.header["replay_config"]["shard"] == "fsdp"
    assert sharded.header["parameters"] == one.header["parameters"]  # whole tensors counted, not shards
    for key in (S.REWARD_MEAN, S.EXPERT_LOAD, S.ACTOR_LOSS):  # step 0: the same rollout, loss and load
        close(sharded.steps[0][key], one.steps[0][key], 1e-6, key)
    same_trace(one, sharded, rel=1e-4)  # as the data-parallel test: summation order differs
    assert any(s[S.GRAD_NORM] > 0 for s in sharded.steps)  # a step that trained, so grad norms compared

    ckpt = tmp_path / "two.jsonl.ckpt"
    assert (ckpt / "sharded").is_dir() and json.loads((ckpt / "state.json").read_text())["next_step"] == 2
    # step 2 again, from the shards, by one process: the checkpoint is resharded
    resumed = torchrun(*common, "--shard", "fsdp", "--out", str(tmp_path / "two.jsonl"), "--resume", nproc=1)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = read_trace(tmp_path / "two.jsonl")
    assert again.header["world_size"] == 2  # the trace's header is the run's first
    same_trace(again, sharded, rel=1e-4)


@pytest.mark.slow
def test_a_sharded_replay_of_toy_v3_keeps_its_faults_and_instruments(tmp_path):
    common = ["replay", "toy-v3", "--steps", "2", *SMALL, "--fault", "router_precision@1:bf16"]
    common += ["--fault", "nan_op@1"]
    run_ok(moescope_process(*common, "--out", str(tmp_path / "one.jsonl")))
    two = torchrun(*common, "--shard", "fsdp", "--out", str(tmp_path / "two.jsonl"))
    assert two.returncode == 0, two.stderr[-3000:]
    one, sharded = read_trace(tmp_path / "one.jsonl"), read_trace(tmp_path / "two.jsonl")
    close(sharded.steps[0][S.EXPERT_LOAD], one.steps[0][S.EXPERT_LOAD], 1e-6, "load")
    close(sharded.steps[0][S.GRAD_NORM], one.steps[0][S.GRAD_NORM], 1e-4, "grad norm")
    hit = sharded.steps[1]
    assert hit[S.FIRST_NONFINITE_MODULE] == one.steps[1][S.FIRST_NONFINITE_MODULE] is not None
    assert hit[S.SKIPPED] == one.steps[1][S.SKIPPED] > 0
    assert hit[S.FAULTS_ACTIVE] == one.steps[1][S.FAULTS_ACTIVE]


@pytest.mark.slow
def test_sharded_healing_equals_one_process_healing(tmp_path):
    proxy = tmp_path / "proxy"
    # the fewest RL calibration tokens there are (one pass of the prompts): both heal the same proxy
    export = ["export", "toy", "--keep", "1/4", "--method", "frequency", "--min-capability", "0"]
    export += ["--n-tokens", "2000"]
    run_ok(moescope_process(*export, "--no-fidelity", "--out", str(proxy)))
    shutil.copytree(proxy, tmp_path / "sharded")
    heal = ["--steps", "4", "--batch-size", "8", "--min-capability", "0.95", "--heal-round", "2"]
    out = run_ok(moescope_process("heal", str(proxy), *heal))
    assert "on one process" in out
    two = torchrun("heal", str(tmp_path / "sharded"), *heal, "--shard", "fsdp")
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("healed") == 1 and "2 processes, sharded" in two.stdout
    one_m, two_m = (json.loads((d / "moescope.json").read_text()) for d in (proxy, tmp_path / "sharded"))
    close(two_m["healing"]["loss"], one_m["healing"]["loss"], 1e-5, "loss")
    assert two_m["healing"]["kl_after"] < two_m["healing"]["kl_before"]
    rounds = two_m["healing"]["capability"]["rounds"]  # measured on the sharded proxy by both processes
    assert [r["steps"] for r in rounds] == [0, 2, 4] and "NOT reached" in two.stdout
    close(rounds, one_m["healing"]["capability"]["rounds"], 1e-5, "capability rounds")
    a, b = (load_file(next(d.glob("*.safetensors"))) for d in (proxy, tmp_path / "sharded"))
    assert a.keys() == b.keys()  # a tied head written once, as an unsharded save writes it
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=1e-4, atol=1e-6), name


def test_a_batch_split_over_processes_adds_up_to_the_whole_batch_loss():
    model, tok = load_toy()
    batches = healing_batches("tasks", tok, steps=1, batch_size=6, seed=0)
    cache = build_teacher_cache(model, batches)
    whole = distillation_loss(cache, model, batches[0])
    parts = [distillation_loss(cache, model, batches[0], part=(rank, 3)) for rank in range(3)]
    assert torch.allclose(sum(parts), whole, rtol=1e-5)
    shares = [row_share(batches[0], rank, 3) for rank in range(3)]
    assert [s[0] for s in shares] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert shares[-1][1].stop == len(cache.log_probs)  # every scored position is someone's
    with pytest.raises(Exception, match="does not split evenly over 4 processes"):
        row_share(batches[0], 0, 4)


def test_sharding_without_a_process_group_is_one_sentence_and_exit_2(tmp_path):
    cases = {
        "needs a process group": ["replay", "toy", "--steps", "1", "--shard", "fsdp"],
        "sharded healing needs a process group": ["heal", str(tmp_path), "--shard", "fsdp"],
        "holds no moescope.json": ["heal", str(tmp_path)],
    }
    for message, args in cases.items():
        if args[0] == "replay":
            args = [*args, "--out", str(tmp_path / "t.jsonl")]
        p = moescope_process(*args)
        _, err = finish(p)
        assert p.returncode == 2, (message, err)
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "t.jsonl").exists()


def test_sharded_runs_that_cannot_run_in_step_are_refused_before_any_work(tmp_path):
    uneven = ReplayConfig(prompts_per_step=6, shard="fsdp")
    uneven.check_world(1, group=True)  # one process runs every pass itself
    with pytest.raises(MoescopeError, match="does not split evenly over 2 minibatches x 2 sharded"):
        uneven.check_world(2, group=True)
    with pytest.raises(MoescopeError, match="PivotRL"):
        ReplayConfig(prompts_per_step=4, pivot=True, shard="fsdp").check_world(2, group=True)
    ReplayConfig(prompts_per_step=6).check_world(2, group=True)  # data parallel splits unevenly fine
    (tmp_path / "file").write_text("")
    p = moescope_process("replay", "toy", "--steps", "1", "--out", str(tmp_path / "file" / "t.jsonl"))
    _, err = finish(p)
    assert p.returncode == 2 and "cannot write the trace" in err and len(err.strip().splitlines()) == 1, err
