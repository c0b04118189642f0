"""The command line: inspect on every architecture, and bad input as one sentence, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moescope._util.flags import flagged_fields
from moescope.cli import build_parser, export_config, main, replay_config
from moescope.errors import MoescopeError
from moescope.export.config import ExportConfig
from moescope.models.accuracy import check_task_spec
from moescope.models.table import ARCHITECTURES
from moescope.models.zoo import TINY_ARCHS, tiny_config
from moescope.replay.config import ReplayConfig
from moescope.replay.data import prompt_schedule


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


CONFIGS = {"export": ExportConfig, "replay": ReplayConfig}
REQUIRED = {"export": ["toy", "--out", "proxy"], "replay": ["toy", "--out", "trace.jsonl"]}
# fmt: off
FLAGS = {  # the flags of DESIGN's command line and of earlier releases
    "export": {"--keep", "--out", "--method", "--selection", "--seed", "--calibration", "--n-tokens",
               "--allow-top-k", "--streaming", "--no-streaming", "--heal-steps", "--heal-lr", "--prompts",
               "--no-fidelity", "--overwrite", "--min-capability", "--heal-budget", "--heal-round"},
    "replay": {"--out", "--steps", "--algo", "--pivot", "--entropy-floor", "--precision",
               "--rollout-precision", "--fault", "--prompts", "--reward", "--group-size",
               "--prompts-per-step", "--lr", "--kl-beta", "--loop-times", "--config", "--seed",
               "--checkpoint-every", "--resume", "--overwrite"},
}
# fmt: on


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices


def _command_parser(command: str) -> argparse.ArgumentParser:
    return _command_parsers()[command]


def _default_words(field) -> str:
    """What the help must say of a field's default: its words for a value that says little, on/off
    for a switch, else the value itself."""
    if "shown" in field.metadata:
        return field.metadata["shown"]
    if isinstance(field.default, bool):
        return "on" if field.default else "off"
    return str(field.default)


@pytest.mark.parametrize("command", ["export", "replay"])
def test_every_config_flag_shows_the_config_default_and_parses_back_to_it(command: str) -> None:
    """One place for each default: the flags of a config's fields are generated from the fields."""
    config, parser = CONFIGS[command], _command_parser(command)
    actions = {action.dest: action for action in parser._actions}
    text = "".join(parser.format_help().split())  # argparse wraps lines, also at hyphens
    flagged = flagged_fields(config)
    assert len(flagged) >= 12
    for field in flagged:
        action, shown = actions[field.name], f"(default: {_default_words(field)})"
        assert action.default is argparse.SUPPRESS, field.name  # an absent flag overrides nothing
        assert action.help.replace("%%", "%").endswith(shown) and "".join(shown.split()) in text, field.name
        plain = field.default is not None and not isinstance(field.default, bool)
        if plain and "shown" not in field.metadata:
            given = parser.parse_args([*REQUIRED[command], action.option_strings[0], str(field.default)])
            assert getattr(given, field.name) == field.default, field.name
    assert FLAGS[command] <= parser._option_string_actions.keys()  # every flag users know is still there


def test_no_flags_give_the_config_defaults(tmp_path: Path) -> None:
    parser = build_parser()
    assert export_config(parser.parse_args(["export", *REQUIRED["export"]])) == ExportConfig()
    assert replay_config(parser.parse_args(["replay", *REQUIRED["replay"]])) == ReplayConfig()
    file = tmp_path / "replay.json"
    file.write_text(json.dumps({"steps": 3, "lr": 0.1, "group_size": 4}))
    args = parser.parse_args(["replay", *REQUIRED["replay"], "--config", str(file), "--lr", "0.2"])
    assert replay_config(args) == ReplayConfig(steps=3, lr=0.2, group_size=4)  # flags given override the file


def test_flags_that_are_no_field_name_set_their_fields() -> None:
    parser = build_parser()
    export = ["export", *REQUIRED["export"], "--prompts", "sums.jsonl", "--no-fidelity", "--streaming"]
    config = export_config(parser.parse_args([*export, "--keep", "1/4", "--allow-top-k"]))
    assert (config.tasks, config.fidelity, config.streaming) == ("sums.jsonl", False, True)
    assert (config.keep, config.allow_top_k, config.heal_lr) == ("1/4", True, ExportConfig().heal_lr)
    replay = ["replay", *REQUIRED["replay"], "--entropy-floor", "0.4", "--fault", "nan_op@1", "--pivot"]
    config = replay_config(parser.parse_args([*replay, "--fault", "no_grad_clip"]))
    assert config.token_entropy_flow_control and config.min_entropy_floor == 0.4 and config.pivot
    assert config.faults == ("nan_op@1", "no_grad_clip") and config.steps == ReplayConfig().steps


def test_prompts_may_name_task_families_for_the_export_and_the_replay() -> None:
    """``--prompts add2,add3`` on both commands: the replay trains on those families and the export
    calibrates and measures on the same ones, as the fidelity study does."""
    parser = build_parser()
    export = export_config(parser.parse_args(["export", *REQUIRED["export"], "--prompts", "add2,add3"]))
    replay = replay_config(parser.parse_args(["replay", *REQUIRED["replay"], "--prompts", "add2,add3"]))
    assert export.tasks == ("add2", "add3") == replay.tasks and replay.prompts == "toy"
    assert replay == ReplayConfig(tasks=("add2", "add3"))  # one config, however the families are given
    assert {ex.task for step in prompt_schedule(replay) for ex in step} == {"add2", "add3"}
    unknown = export_config(parser.parse_args(["export", *REQUIRED["export"], "--prompts", "add2,add9"]))
    assert unknown.tasks == "add2,add9"  # not every name is a family, so a file, refused as missing
    with pytest.raises(MoescopeError, match=r"add2,add9 does not exist; .* or task families of the suite"):
        check_task_spec(unknown.tasks)
    with pytest.raises(MoescopeError, match="give the families once"):
        ReplayConfig(prompts="add2", tasks=("copy",))


def test_every_cli_module_is_short_so_a_parser_sits_beside_its_handler() -> None:
    """The command line stays thin: each command's module declares its flags and prints what the
    library's result gives it; rendering and logic live in the library."""
    import moescope.cli

    modules = sorted(Path(moescope.cli.__file__).parent.glob("*.py"))
    assert len(modules) > 5
    lengths = {m.name: len(m.read_text().splitlines()) for m in modules}
    assert all(n <= 200 for n in lengths.values()), lengths


def test_the_parser_has_every_command_in_the_order_of_the_help() -> None:
    expected = [
        "toy",
        "inspect",
        "cost",
        "export",
        "replay",
        "heal",
        "diagnose",
        "validate",
        "report",
        "demo",
    ]
    assert list(_command_parsers()) == expected
