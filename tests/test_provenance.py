"""Config hashes identify a model's architecture, not the file that stored it."""

from __future__ import annotations

from pathlib import Path

from moescope.models.zoo import tiny, tiny_config
from moescope.provenance import config_hash, library_versions


def test_hash_survives_save_and_reload(tmp_path: Path) -> None:
    from transformers import AutoConfig

    model = tiny("qwen3_moe")
    model.save_pretrained(tmp_path)
    assert config_hash(AutoConfig.from_pretrained(tmp_path)) == config_hash(model.config)


def test_hash_changes_with_the_architecture() -> None:
    assert config_hash(tiny_config("mixtral")) != config_hash(tiny_config("mixtral", num_local_experts=4))
    assert config_hash(tiny_config("mixtral")) != config_hash(tiny_config("qwen3_moe"))


def test_library_versions() -> None:
    versions = library_versions()
    assert versions["moescope"] and versions["torch"].startswith("2.")
