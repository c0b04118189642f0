"""The command line: inspect on every architecture, and bad input as one sentence, exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.models.arch import ARCHITECTURES
from moescope.models.zoo import TINY_ARCHS, tiny_config


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_inspect_every_architecture_as_saved_by_transformers(arch: str, tiny_checkpoint, capsys) -> None:
    assert main(["inspect", str(tiny_checkpoint(arch))]) == 0
    out = capsys.readouterr().out
    experts = ARCHITECTURES[arch].num_experts(tiny_config(arch))
    assert re.search(rf"routed experts\s+{experts} per MoE layer", out) and re.search(r"top-k\s+2 ", out), out


def test_inspect_json(tiny_checkpoint, capsys) -> None:
    assert main(["inspect", str(tiny_checkpoint("qwen2_moe", fused=True)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model_type"] == "qwen2_moe" and data["shared_experts"] == 1
    assert (
        data["params"]["total"]
        == data["params"]["backbone"] + data["params"]["routed_experts"] + data["params"]["shared_experts"]
    )


def _bad_inputs(tmp_path: Path, tiny_checkpoint) -> dict[str, Path]:
    from transformers import AutoConfig

    no_config = tmp_path / "empty"
    no_config.mkdir()
    dense = tmp_path / "dense"
    AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=1).save_pretrained(dense)
    corrupted = tmp_path / "corrupted"
    corrupted.mkdir()
    for file in tiny_checkpoint("mixtral").iterdir():
        (corrupted / file.name).write_bytes(file.read_bytes())
    (corrupted / "model.safetensors").write_bytes(b"\x00" * 64)
    return {
        "no such model directory": tmp_path / "missing",
        "no config.json": no_config,
        "dense model": dense,
        "corrupted or truncated": corrupted,
    }


def test_bad_input_is_one_sentence_with_exit_2(tmp_path: Path, tiny_checkpoint, capsys) -> None:
    for expected, path in _bad_inputs(tmp_path, tiny_checkpoint).items():
        assert main(["inspect", str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0] and "Traceback" not in captured.err, captured.err


def test_console_script_exit_status_and_no_traceback(tmp_path: Path) -> None:
    """The installed entry point, in a fresh process, as a user runs it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    script = Path(sys.executable).with_name("moescope")
    result = subprocess.run(
        [str(script), "inspect", str(tmp_path / "missing")], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert (
        result.stderr.startswith("moescope: error: no such model directory")
        and "Traceback" not in result.stderr
    )
    usage = subprocess.run([str(script), "inspect"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "MODEL" in usage.stderr
