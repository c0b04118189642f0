"""Bad model paths fail before any weight is read, with one sentence naming the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from moescope.errors import ModelLoadError, UnsupportedArchitectureError
from moescope.models.loading import load_config, load_model, resolve_model


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such model directory"):
        resolve_model(tmp_path / "nope")


def test_file_instead_of_directory(tmp_path: Path) -> None:
    (tmp_path / "weights.safetensors").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve_model(tmp_path / "weights.safetensors")


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        resolve_model(tmp_path)


def test_config_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        resolve_model(tmp_path)


def test_dense_model_is_refused(tmp_path: Path) -> None:
    from transformers import AutoConfig

    AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=1).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="dense model"):
        load_config(tmp_path)


def test_custom_code_model_is_refused(tmp_path: Path) -> None:
    config = {"model_type": "acme_moe", "auto_map": {"AutoConfig": "configuration_acme.AcmeConfig"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="never runs remote code"):
        load_config(tmp_path)


def test_truncated_safetensors(tmp_path: Path, tiny_checkpoint) -> None:
    path = _copy(tiny_checkpoint("mixtral"), tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match="corrupted or truncated"):
        load_model(path)


def test_index_naming_a_missing_shard(tmp_path: Path, tiny_checkpoint) -> None:
    path = _copy(tiny_checkpoint("mixtral"), tmp_path / "m")
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002\.safetensors, which is missing"):
        load_model(path)


def test_pickled_weights_only(tmp_path: Path, tiny_checkpoint) -> None:
    path = _copy(tiny_checkpoint("mixtral"), tmp_path / "m")
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load_model(path)


def test_weights_that_contradict_the_config(tmp_path: Path, tiny_checkpoint) -> None:
    path = _copy(tiny_checkpoint("mixtral"), tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["num_local_experts"] = 4
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"do not match its config\.json"):
        load_model(path)


@pytest.mark.parametrize("fused", [False, True])
def test_loads_both_checkpoint_layouts(fused: bool, tiny_checkpoint) -> None:
    import torch

    from moescope.models.zoo import tiny

    model, tokenizer = load_model(tiny_checkpoint("olmoe", fused=fused))
    assert tokenizer is None and not model.training
    reference = tiny("olmoe")
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
