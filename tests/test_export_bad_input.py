"""An export's bad input is one sentence, exit 2, nothing written, and, where the input alone
tells, no weight read: every case here fails before the original is placed."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from moescope.cli import main
from moescope.errors import ModelLoadError
from moescope.models.loading import load_model, probe_forward, resolve_model

QUICK = ["--keep", "1/4", "--method", "frequency", "--calibration", "tasks", "--n-tokens", "500"]
QUICK += ["--no-fidelity", "--min-capability", "0"]


@pytest.fixture
def unread(monkeypatch: pytest.MonkeyPatch):
    """The export may not place (load or read) the original: each refusal here comes first."""

    def placed(*_, **__):
        raise AssertionError("the original was placed before the input was refused")

    monkeypatch.setattr("moescope.export.pipeline.gather", placed)


def refused(argv: list[str], tmp_path: Path, capsys) -> str:
    """Run ``moescope export ARGV --out`` and return its one-line refusal, after checking that
    it exited 2 and wrote nothing."""
    assert main(["export", *argv, "--out", str(tmp_path / "proxy")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moescope: error: ") and err.count("\n") == 0, err
    assert not (tmp_path / "proxy").exists()
    return err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--device", "tpu9"], "unknown device 'tpu9'; give cpu, cuda"),
        (["--device", "cuda"], "--device cuda asks for a GPU, and torch sees none"),
        (["--dtype", "int8"], "--dtype int8 is no compute dtype"),
    ],
)
def test_a_device_or_dtype_this_machine_cannot_run(
    flags: list[str], says: str, tmp_path: Path, capsys, unread, monkeypatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, GPU or not
    assert says in refused(["toy", *QUICK, *flags], tmp_path, capsys)


def test_a_rollouts_file_with_a_line_without_completion(tmp_path: Path, capsys, unread) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    lines = [{"prompt": "1+2=", "completion": "3"}, {"prompt": "2+2=", "completion": None}]
    rollouts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["toy", *QUICK[:4], "--calibration", str(rollouts), *QUICK[6:]]
    assert "rollouts.jsonl:2 has no 'prompt' and 'completion' strings" in refused(argv, tmp_path, capsys)


def test_a_prompts_only_file_given_as_calibration(tmp_path: Path, capsys, unread) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+2="}) + "\n")
    argv = ["toy", *QUICK[:4], "--calibration", str(prompts), *QUICK[6:]]
    assert "prompts.jsonl:1 has no 'text' string (nor 'prompt' with" in refused(argv, tmp_path, capsys)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("1.5", "'1.5': 1.5 is outside 0 to 1"),
        ("add2=0.9,add9=0.5", "names add9, not among the measured tasks"),
        ("add2=0.9", "--original-accuracy 'add2=0.9' gives no share for add3"),
    ],
)
def test_an_original_accuracy_out_of_range_or_for_other_tasks(
    given: str, says: str, tmp_path: Path, capsys, unread
) -> None:
    argv = ["toy", *QUICK, "--prompts", "add2,add3", "--original-accuracy", given]
    assert says in refused(argv, tmp_path, capsys)


def test_an_original_accuracy_for_an_export_without_tasks(
    tmp_path: Path, capsys, unread, tiny_checkpoint
) -> None:
    argv = [str(tiny_checkpoint("mixtral")), *QUICK, "--original-accuracy", "0.8"]
    assert "and this export measures no task; name the tasks with --prompts" in refused(
        argv, tmp_path, capsys
    )


@pytest.fixture
def broken(tmp_path: Path):
    """``broken(model, **config)``: a copy of an embedded model whose config.json says otherwise."""

    def copy(model: str, **changes: object) -> str:
        path = tmp_path / "broken"
        shutil.copytree(resolve_model(model), path)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, **changes}))
        return str(path)

    return copy


@pytest.mark.parametrize(
    ("model", "changes", "says"),
    [
        ("toy", {"num_experts_per_tok": 40}, "routes num_experts_per_tok=40 with 32 experts"),
        ("toy-v3", {"n_group": 3}, "routes n_group=3 groups of 64 experts"),
        ("toy-v3", {"topk_group": 9}, "routes topk_group=9 of n_group=4"),
        ("toy", {"hidden_act": "bogus"}, "transformers cannot build the model"),
        ("toy", {"decoder_sparse_step": 0}, "(ZeroDivisionError: integer modulo by zero)"),
    ],
)
def test_a_config_whose_forward_cannot_run(
    model: str, changes: dict, says: str, broken, tmp_path: Path, capsys, unread
) -> None:
    err = refused([broken(model, **changes), *QUICK], tmp_path, capsys)
    assert says in err and "use the config.json that was saved with these weights" in err


@pytest.mark.parametrize("budget", [[], ["--max-memory", "4MB"]])
def test_a_config_that_contradicts_its_weights(budget: list[str], broken, tmp_path: Path, capsys) -> None:
    """Both gatherers refuse the hidden size the weights do not have, as they read them."""
    err = refused([broken("toy", hidden_size=96), *QUICK, *budget], tmp_path, capsys)
    assert "config.json" in err and ("do not match" in err or "has shape [44, 128]" in err)


def test_a_model_whose_own_forward_raises_is_one_sentence() -> None:
    """What no config check foresees still fails before any pass, by name: here a router asked
    for more experts than it has once the model is built."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model("toy", with_tokenizer=False)
    probe_forward(model, resolve_model("toy"))  # the model as it is runs
    model.model.layers[0].mlp.gate.top_k = 99
    with pytest.raises(ModelLoadError, match=r"fails its own forward pass on cpu \(RuntimeError: "):
        probe_forward(model, resolve_model("toy"))


def test_a_budget_given_in_bytes_is_bytes_and_one_below_a_layer_is_refused(tmp_path: Path, capsys) -> None:
    """``--max-memory 4000000`` is 4 MB, as the flag's help says (bytes or a size); a budget
    below one decoder layer is refused before the pass (the batch beside it is checked against
    the memory free where the pass runs, since --max-memory bounds weights, as accelerate's)."""
    from moescope.export.gather import parse_size

    assert parse_size("4000000") == parse_size("4MB") == 4_000_000
    argv = ["toy", *QUICK, "--max-memory", "10000"]
    assert "one decoder layer of the original" in refused(argv, tmp_path, capsys)
