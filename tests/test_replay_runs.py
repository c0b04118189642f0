"""Replay from the command line: kill and resume, torchrun with two processes, bad input, proxies, loops."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from cli_process import moescope_process
from trace_compare import finish, same_trace, torchrun

import moescope
from moescope.errors import MoescopeError
from moescope.models.looping import apply_loop
from moescope.replay import ReplayConfig
from moescope.traces import read_trace

SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--lr", "1e-4"]


@pytest.mark.slow
def test_a_killed_replay_resumes_to_the_uninterrupted_trace(tmp_path):
    args = ["replay", "toy", "--steps", "12", "--checkpoint-every", "2", *SMALL]
    whole = moescope_process(*args, "--out", str(tmp_path / "whole.jsonl"))
    _, err = finish(whole)
    assert whole.returncode == 0, err

    trace = tmp_path / "killed.jsonl"
    run = moescope_process(*args, "--out", str(trace))
    deadline = time.monotonic() + 240
    while run.poll() is None and time.monotonic() < deadline:
        if trace.exists() and len(trace.read_text().splitlines()) >= 6:  # header + 5 steps
            break
        time.sleep(0.01)
    assert run.poll() is None, "the replay ended before it could be killed; nothing was tested"
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=60)
    killed = read_trace(trace)
    assert 5 <= len(killed.steps) < 12
    assert (tmp_path / "killed.jsonl.ckpt" / "state.json").is_file()

    resumed = moescope_process(*args, "--out", str(trace), "--resume")
    _, err = finish(resumed)
    assert resumed.returncode == 0, err
    same_trace(read_trace(trace), read_trace(tmp_path / "whole.jsonl"))


@pytest.mark.slow
def test_two_processes_under_torchrun_give_the_one_process_trace(tmp_path):
    common = ["replay", "toy", "--steps", "3", *SMALL]
    one = moescope_process(*common, "--out", str(tmp_path / "one.jsonl"))
    _, err = finish(one)
    assert one.returncode == 0, err
    two = torchrun(*common, "--out", str(tmp_path / "two.jsonl"))
    assert two.returncode == 0, two.stderr[:3000]  # the workers' errors come before torchrun's report
    assert two.stdout.count("trace:") == 1  # rank 0 reports
    a, b = read_trace(tmp_path / "one.jsonl"), read_trace(tmp_path / "two.jsonl")
    assert b.header["world_size"] == 2 and a.header["world_size"] == 1
    same_trace(a, b, rel=1e-4)


def test_bad_input_is_one_sentence_and_exit_2(tmp_path):
    trace = tmp_path / "t.jsonl"
    ok = moescope_process("replay", "toy", "--out", str(trace), "--steps", "2", *SMALL)
    out, err = finish(ok)
    assert ok.returncode == 0 and "trace:" in out, err
    before = trace.read_bytes()
    bad_prompts = tmp_path / "p.jsonl"
    bad_prompts.write_text('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
    cases = {
        "Unknown fault 'explode'": ["--fault", "explode@1"],
        "p.jsonl:2 is not valid JSON": ["--prompts", str(bad_prompts)],
        "group_size 1": ["--group-size", "1"],
        "different replay config": ["--resume", "--seed", "7"],
        "exists; pass --resume": [],
    }
    for message, extra in cases.items():
        args = ["replay", "toy", "--out", str(trace), "--steps", "2", *SMALL, *extra]
        if message in ("Unknown fault 'explode'", "p.jsonl:2 is not valid JSON", "group_size 1"):
            args.append("--overwrite")
        p = moescope_process(*args)
        _, err = finish(p)
        assert p.returncode == 2, (message, err)
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert trace.read_bytes() == before, message  # the earlier trace is intact


def test_a_raising_reward_stops_with_the_finished_steps_kept(tmp_path):
    calls = {"n": 0}

    def flaky(example, completion):
        calls["n"] += 1
        if calls["n"] > 2 * 4 * 4:  # two steps of 4 prompts x 4 samples
            raise KeyError("missing")
        return 1.0

    config = ReplayConfig(steps=4, prompts_per_step=4, group_size=4)
    with pytest.raises(MoescopeError, match="Reward function flaky raised KeyError"):
        moescope.replay("toy", config, out=tmp_path / "t.jsonl", reward=flaky)
    assert [s["step"] for s in read_trace(tmp_path / "t.jsonl").steps] == [0, 1]


def test_replay_on_an_exported_proxy_records_its_manifest(tmp_path):
    from moescope.export.pipeline import export_proxy

    proxy = export_proxy("toy", tmp_path / "proxy", keep="1/2", method="frequency", n_tokens=2000,
                         progress=False, fidelity=False).path  # fmt: skip
    t = moescope.replay(
        proxy, ReplayConfig(steps=2, prompts_per_step=4, group_size=4), out=tmp_path / "p.jsonl"
    )
    assert t.header["proxy"]["keep"] == 16 and t.header["num_experts"] == 16
    assert all(len(row) == 16 for row in t.steps[0]["moe/expert_load"])


def test_a_looped_model_shares_weights_and_generates_like_without_cache():
    model, tok = moescope.load_model("toy")
    params = sum(p.numel() for p in model.parameters())
    apply_loop(model, 2)
    assert len(model.model.layers) == 8 and model.config.num_hidden_layers == 8
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.model.layers[4].mlp is model.model.layers[0].mlp
    assert model.model.layers[4].self_attn.layer_idx == 4 and model.model.layers[0].self_attn.layer_idx == 0
    ids = tok(["12+34="], return_tensors="pt")
    cached = model.generate(**ids, max_new_tokens=5, do_sample=False)
    plain = model.generate(**ids, max_new_tokens=5, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
    with pytest.raises(MoescopeError, match="already looped"):
        apply_loop(model, 3)


def test_a_proxy_of_a_looped_model_keeps_its_loop_count(tmp_path):
    from moescope.export.pipeline import export_proxy

    looped = tmp_path / "looped"
    model, tok = moescope.load_model("toy")
    model.config.loop_times = 2
    model.save_pretrained(looped)
    tok.save_pretrained(looped)
    proxy = export_proxy(looped, tmp_path / "proxy", keep="1/2", method="frequency", n_tokens=2000,
                         progress=False, fidelity=False)  # fmt: skip
    assert json.loads((proxy.path / "config.json").read_text())["loop_times"] == 2
    assert proxy.manifest["loop_times"] == 2
    t = moescope.replay(
        proxy.path, ReplayConfig(steps=1, prompts_per_step=2, group_size=2), out=tmp_path / "t.jsonl"
    )
    assert t.header["loop_times"] == 2 and t.header["proxy"]["loop_times"] == 2


def test_cli_faults_reach_the_trace(tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    p = moescope_process("replay", "toy", "--out", str(trace), "--steps", "3", *SMALL, "--fault", "nan_op@1",
                         "--fault", "no_grad_clip", "--algo", "gepo", "--entropy-floor", "0.3")  # fmt: skip
    out, err = finish(p)
    assert p.returncode == 0, err
    t = read_trace(trace)
    assert (
        t.header["faults"] == ["nan_op@1", "no_grad_clip@0"] and t.header["replay_config"]["algo"] == "gepo"
    )
    assert t.steps[1]["health/nonfinite"] > 0 and "1 steps with non-finite values" in out
    assert "opefo/entropy_coef" in t.steps[0]
