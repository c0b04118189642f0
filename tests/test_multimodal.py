"""Multimodal checkpoints whose language model is a supported MoE (Llama 4: fused experts;
Qwen3.5-MoE: per-expert keys): the language model is read and pruned, everything else (vision
tower, projector) is copied byte for byte, and the proxy loads with the stock multimodal class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from moescope.errors import UnsupportedArchitectureError
from moescope.export.pipeline import export_proxy
from moescope.export.streaming.checkpoint import open_checkpoint
from moescope.export.streaming.export import language_section
from moescope.export.surgery import build_proxy
from moescope.models.loading import load_model
from moescope.models.support import language_config, spec_for
from moescope.models.zoo import TINY_MULTIMODAL, tiny_multimodal

# Calibration and held-out tokens: what is asserted (a cut, a checklist, healing moving the experts)
# holds for any selection and any figures, and the tiny Qwen3.5-MoE forward is slow on CPU.
FEW = {"n_tokens": 256}


@pytest.fixture(scope="module", params=TINY_MULTIMODAL)
def source(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(request.param) / "model"
    tiny_multimodal(request.param).save_pretrained(path)
    return path


def _stored(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as file:
        return {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 (safe_open is no dict)


@pytest.mark.parametrize("streaming", [False, True], ids=["in-memory", "streaming"])
def test_the_proxy_of_a_multimodal_checkpoint_is_that_checkpoint_with_its_language_model_cut(
    source: Path, tmp_path: Path, streaming: bool
) -> None:
    result = export_proxy(
        source, tmp_path / "proxy", keep="1/2", streaming=streaming, fidelity=False, progress=False, **FEW
    )
    # the stock multimodal class loads it whole, with the expert count halved in text_config
    full, info = AutoModelForImageTextToText.from_pretrained(result.path, output_loading_info=True)
    assert not any(info.values()), info
    text = full.config.get_text_config()
    assert getattr(text, spec_for(text).count_key) == 4 == result.selection.keep
    original = json.loads((source / "config.json").read_text())
    written = json.loads((result.path / "config.json").read_text())
    assert written["vision_config"] == original["vision_config"]
    # every stored tensor outside the routed experts is copied byte for byte: vision tower included
    before, after = _stored(source), _stored(result.path)
    untouched = set(before) - set(open_checkpoint(source).experts)
    assert any("vision" in key or "visual" in key for key in untouched)
    assert all(torch.equal(before[key], after[key]) for key in untouched)
    # the language model it holds is the in-memory proxy of the same selection, tensor for tensor
    lm, _ = load_model(source, dtype="auto")
    expected = build_proxy(lm, result.selection).state_dict()
    language_model = AutoModelForCausalLM.from_pretrained(result.path)
    loaded = language_model.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)
    # (Llama4ForConditionalGeneration's text-only forward fails in transformers itself, on the
    # source model too, so generation is run on the language model the checkpoint holds)
    assert language_model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False).shape == (
        1,
        6,
    )


def test_the_in_memory_export_of_a_multimodal_checkpoint_assesses_its_language_model(
    source: Path, tmp_path: Path
) -> None:
    result = export_proxy(
        source, tmp_path / "proxy", keep="1/2", streaming=False, progress=False, fidelity=FEW, **FEW
    )
    checks = {check.name: check.passed for check in result.checklist}
    assert checks["backbone identical"] and checks["routing mechanism identical"]
    manifest = json.loads((result.path / "moescope.json").read_text())
    assert manifest["checklist"] and manifest["fidelity"]


def _assert_healed_whole(source: Path, proxy_dir: Path, unhealed: dict[str, torch.Tensor]) -> None:
    """The multimodal class loads ``proxy_dir`` whole; everything but router rows and kept experts
    is the source's, byte for byte; the language model's experts are not the unhealed ones."""
    _, info = AutoModelForImageTextToText.from_pretrained(proxy_dir, output_loading_info=True)
    assert not any(info.values()), info
    before, after = _stored(source), _stored(proxy_dir)
    untouched = set(before) - set(open_checkpoint(source).experts)
    assert any("vision" in key or "visual" in key for key in untouched)
    assert all(torch.equal(before[key], after[key]) for key in untouched)
    healed = AutoModelForCausalLM.from_pretrained(proxy_dir).state_dict()
    assert healed.keys() == unhealed.keys()
    assert any("experts" in key and not torch.equal(healed[key], unhealed[key]) for key in unhealed)


def test_healing_a_multimodal_proxy_keeps_its_vision_tower(source: Path, tmp_path: Path) -> None:
    from moescope.export.healing import heal_proxy_dir

    options = dict(keep="1/2", fidelity=False, progress=False, **FEW)
    healed = export_proxy(source, tmp_path / "healed", streaming=False, heal_steps=3, **options)
    assert healed.healing is not None
    lm, _ = load_model(source, dtype="auto")
    unhealed = build_proxy(lm, healed.selection).state_dict()
    _assert_healed_whole(source, healed.path, unhealed)
    # a streamed proxy healed afterwards, in its directory
    streamed = export_proxy(
        source, tmp_path / "streamed", streaming=True, selection=healed.selection, **options
    )
    ids = torch.randint(3, 128, (4, 32), generator=torch.Generator().manual_seed(0))  # no tokenizer
    heal_proxy_dir(streamed.path, data=ids, heldout=ids, tasks=(), steps=3, measure=False)
    _assert_healed_whole(source, streamed.path, unhealed)


@pytest.mark.parametrize(
    ("wrapper", "text"), [("llama4", "llama4_text"), ("qwen3_5_moe", "qwen3_5_moe_text")]
)
def test_the_language_model_of_a_multimodal_config_is_the_one_read(wrapper: str, text: str) -> None:
    config = AutoConfig.for_model(wrapper)
    assert language_config(config).model_type == text
    assert language_config(language_config(config)) is language_config(config)
    with pytest.raises(UnsupportedArchitectureError, match="language_config"):
        spec_for(config)  # the table has no row for the wrapper itself


def test_the_expert_count_is_set_in_the_language_models_section_of_config_json() -> None:
    multimodal = {"model_type": "llama4", "text_config": {"model_type": "llama4_text"}}
    assert language_section(multimodal, "llama4_text") is multimodal["text_config"]
    text_only = {"model_type": "qwen3_moe", "num_experts": 8}
    assert language_section(text_only, "qwen3_moe") is text_only


@pytest.mark.parametrize(("wrapper", "text"), [("kimi_k25", "deepseek_v3"), ("aria", "aria_text")])
def test_a_multimodal_checkpoint_transformers_loads_no_language_model_from_is_refused(
    wrapper: str, text: str
) -> None:
    with pytest.raises(UnsupportedArchitectureError, match="AutoModelForCausalLM does not load") as err:
        language_config(AutoConfig.for_model(wrapper))
    assert f"'{text}'" in str(err.value) and "\n" not in str(err.value)


def test_inspect_says_it_describes_the_language_model_of_a_multimodal_checkpoint(source: Path) -> None:
    from moescope.models.summary import summarize

    summary = summarize(source)
    assert summary.model_type == language_config(AutoConfig.from_pretrained(source)).model_type
    assert "language model of a" in summary.notes
