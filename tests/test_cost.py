"""The cost model: parameter counts against published figures and exact counts, devices, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.export.cost.formulas import analytic_params, entry_from_config
from moescope.export.cost.memory import GB, STATES, TrainingMemory, devices_needed, memory_breakdown
from moescope.export.cost.paper import paper_comparison, published_comparison
from moescope.export.cost.profiles import PROFILES, device_profile
from moescope.export.cost.render import PROXY_NOTE, STEP_NOTE
from moescope.export.cost.report import cost_report
from moescope.export.cost.shape import ModelShape, reference_entries, reference_models
from moescope.export.cost.step import RLWorkload, step_time
from moescope.export.cost.table import cost_table, reference_table
from moescope.models.table import ARCHITECTURES
from moescope.models.zoo import TINY_ARCHS, tiny_config

REFERENCE = {shape.name: shape for shape in reference_models()}
PARAM_FIELDS = ("params_total", "params_routed", "params_shared", "params_backbone", "params_router")

# Why a computed total may differ from the published one (all within 3 %):
WHY = {
    "Llama-4-Scout-17B-16E (text)": "the published 109 B includes the vision tower; the entry is text only",
    "Kimi-K2": "published as a rounded '1T'; the formula gives 1.026 T",
    "GLM-4.5": "published as a rounded 355 B",
}


# --- parameter counts ----------------------------------------------------------------------------


def test_the_package_ships_all_twelve_reference_models() -> None:
    assert len(REFERENCE) == 12
    assert all(shape.counted == "analytic" and shape.published_total for shape in REFERENCE.values())


@pytest.mark.parametrize("name", list(REFERENCE))
def test_computed_total_is_within_3_percent_of_the_published_figure(name: str) -> None:
    """DeepSeek-V3's 671 B excludes its multi-token-prediction module, as the formula does."""
    shape = REFERENCE[name]
    error = shape.params_total / shape.published_total - 1
    assert abs(error) < 0.03, (name, f"{error:+.2%}", WHY.get(name, ""))
    assert shape.params_total == shape.params_backbone + shape.params_routed + shape.params_shared


# databricks/dbrx-instruct's config.json as published (expert settings nested in ffn_config)
DBRX = {
    "architectures": ["DbrxForCausalLM"],
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "model_type": "", "rope_theta": 500000},
    "d_model": 6144,
    "ffn_config": {
        "ffn_hidden_size": 10752,
        "model_type": "",
        "moe_jitter_eps": 0.01,
        "moe_num_experts": 16,
        "moe_top_k": 4,
    },
    "max_seq_len": 32768,
    "model_type": "dbrx",
    "n_heads": 48,
    "n_layers": 40,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 100352,
}


def test_dbrx_counted_from_its_published_config_matches_its_published_figures(tmp_path: Path) -> None:
    """132 B parameters, 36 B active (databricks' model card), counted exactly on the meta device."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DBRX))
    shape = ModelShape.from_config(path)
    assert abs(shape.params_total / 132e9 - 1) < 0.03 and abs(shape.params_active / 36e9 - 1) < 0.03
    assert (shape.routed_experts, shape.top_k, shape.num_moe_layers) == (16, 4, 40)
    half = shape.with_keep("1/2")
    assert half.routed_experts == 8 and half.params_routed * 2 == shape.params_routed


# (architecture, config overrides): default tiny configs plus the switches the formulas read
TINY_CASES = [
    ("mixtral", {}),
    ("qwen2_moe", {}),
    ("qwen2_moe", {"qkv_bias": False, "mlp_only_layers": [0]}),
    ("qwen3_moe", {}),
    ("qwen3_moe", {"attention_bias": True, "decoder_sparse_step": 2, "num_hidden_layers": 4}),
    ("qwen3_moe", {"tie_word_embeddings": True}),
    ("olmoe", {}),
    ("deepseek_v3", {}),
    ("deepseek_v3", {"q_lora_rank": None, "attention_bias": True}),
    ("glm4_moe", {}),
    ("glm4_moe", {"attention_bias": True, "use_qk_norm": True}),
    ("gpt_oss", {}),
    ("llama4_text", {}),
    ("llama4_text", {"moe_layers": [1], "intermediate_size_mlp": 48}),
]


@pytest.mark.parametrize(("arch", "overrides"), TINY_CASES, ids=lambda v: str(v) if v else "default")
def test_analytic_count_equals_the_exact_meta_device_count(
    arch: str, overrides: dict, tmp_path: Path
) -> None:
    tiny_config(arch, **overrides).save_pretrained(tmp_path)
    exact = ModelShape.from_config(tmp_path)
    analytic = ModelShape.from_config(tmp_path, exact=False)
    assert (exact.counted, analytic.counted) == ("exact", "analytic")
    for field in (*PARAM_FIELDS, "params_active", "num_moe_layers", "routed_experts", "shared_experts"):
        assert getattr(analytic, field) == getattr(exact, field), field


def _full_size(model_type: str, **values) -> object:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **values)


def test_full_size_qwen3_counts_like_its_reference_entry() -> None:
    """The formula at full width, checked against transformers' Qwen3-MoE class on the meta device.

    The reference entry does not record Qwen3's per-head q/k norms (2 × 128 per layer);
    given that, the counts are equal."""
    config = _full_size(
        "qwen3_moe",
        hidden_size=2048,
        num_hidden_layers=48,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        vocab_size=151936,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        tie_word_embeddings=False,
    )
    entry = next(e for e in reference_entries() if e["name"] == "Qwen3-30B-A3B")
    assert ModelShape.from_config(config).params_total == analytic_params(entry | {"qk_norm": "head"}).total
    assert REFERENCE["Qwen3-30B-A3B"].params_total == analytic_params(entry).total


def test_full_size_deepseek_v3_counts_like_its_reference_entry() -> None:
    """MLA, dense leading layers, a shared expert and grouped routing at 671 B: exactly equal."""
    config = _full_size(
        "deepseek_v3",
        hidden_size=7168,
        num_hidden_layers=61,
        first_k_dense_replace=3,
        n_routed_experts=256,
        n_shared_experts=1,
        num_experts_per_tok=8,
        moe_intermediate_size=2048,
        intermediate_size=18432,
        vocab_size=129280,
        num_attention_heads=128,
        num_key_value_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        n_group=8,
        topk_group=4,
    )
    exact, reference = ModelShape.from_config(config), REFERENCE["DeepSeek-V3"]
    for field in (*PARAM_FIELDS, "params_active"):
        assert getattr(exact, field) == getattr(reference, field), field


def test_entry_from_config_refuses_an_architecture_without_formula() -> None:
    with pytest.raises(MoescopeError, match="no analytic formula"):
        entry_from_config(tiny_config("jamba"))


def test_a_multimodal_config_is_costed_by_its_text_model() -> None:
    from transformers import AutoConfig

    text = tiny_config("llama4_text")
    full = AutoConfig.for_model("llama4", text_config=text.to_dict())
    shape = ModelShape.from_config(full)
    assert shape.params_total == ModelShape.from_config(text).params_total
    assert "vision tower is not counted" in shape.note


# --- proxies -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "count_key", "experts", "kept"),
    [
        ("qwen2_moe", "num_experts", 8, 4),
        ("gpt_oss", "num_local_experts", 8, 3),
        ("deepseek_v3", "n_routed_experts", 16, 8),
        ("llama4_text", "num_local_experts", 8, 4),
    ],
)
def test_with_keep_removes_exactly_the_cut_experts(
    arch: str, count_key: str, experts: int, kept: int
) -> None:
    """A proxy's shape equals the exact count of the same model built with ``kept`` experts."""
    shape = ModelShape.from_config(tiny_config(arch, **{count_key: experts}))
    proxy = shape.with_keep(kept)
    built = ModelShape.from_config(tiny_config(arch, **{count_key: kept}))
    for field in (*PARAM_FIELDS, "params_active", "routed_experts"):
        assert getattr(proxy, field) == getattr(built, field), field
    per_expert = (shape.params_routed + shape.params_router) // experts
    assert shape.params_total - proxy.params_total == (experts - kept) * per_expert
    assert proxy.top_k == shape.top_k and proxy.params_shared == shape.params_shared
    assert proxy.source_experts == experts


def test_with_keep_speaks_moescope_keep_grammar_and_refuses_impossible_keeps() -> None:
    shape = REFERENCE["DeepSeek-V3"]
    assert shape.with_keep("1/4") == shape.with_keep(0.25) == shape.with_keep(64)
    with pytest.raises(MoescopeError, match="expert groups"):
        shape.with_keep(36)  # not a multiple of DeepSeek-V3's 8 routing groups
    with pytest.raises(MoescopeError, match="top-k"):
        REFERENCE["Mixtral-8x7B"].with_keep("1/8")


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Qwen3-30B-A3B", "Llama-4-Scout-17B-16E (text)"])
@pytest.mark.parametrize("rounding", ["device", "node", "pow2"])
def test_devices_grow_with_the_experts_kept(name: str, rounding: str) -> None:
    shape = REFERENCE[name]
    step = shape.n_group
    counts = range(max(shape.top_k + 1, 2 * step), shape.routed_experts + 1, step)
    devices = [devices_needed(shape.with_keep(k), rounding=rounding) for k in counts]
    assert devices == sorted(devices) and devices[-1] == devices_needed(shape, rounding=rounding)


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Kimi-K2", "Qwen3-235B-A22B"])
def test_reduction_of_a_large_model_is_near_the_expert_fraction_cut(name: str) -> None:
    """Memory is ~97 % routed experts, so cutting 1/2, 3/4, 7/8 of them saves about 50/75/87.5 %."""
    shape = REFERENCE[name]
    table = cost_table(shape).set_index("keep")
    full = table.loc["full", "devices"]
    per_device = 80 * 0.9 * (1 - 0.2 - 0.1) * GB / 20  # parameters one device holds
    assert full == math.ceil(shape.params_total / per_device)
    cut_share = (shape.params_routed + shape.params_router) / shape.params_total
    assert cut_share > 0.96  # memory dominated by routed experts
    for keep, fraction in (("1/2", 1 / 2), ("1/4", 1 / 4), ("1/8", 1 / 8)):
        params = shape.params_total - (1 - fraction) * (shape.params_routed + shape.params_router)
        assert table.loc[keep, "devices"] == math.ceil(params / per_device)
        paper = 100 * (1 - fraction)  # the paper's 50 / 75 / 87.5 %
        continuous = paper * cut_share  # before rounding to whole devices
        assert abs(table.loc[keep, "reduction_pct"] - continuous) <= 100 / full
        assert abs(table.loc[keep, "reduction_pct"] - paper) <= paper * (1 - cut_share) + 100 / full
        assert table.loc[keep, "params_active"] >= 0.99 * table.loc["full", "params_active"]


# --- memory, rounding, step time -----------------------------------------------------------------


def test_memory_breakdown_adds_up_and_every_byte_count_is_a_parameter() -> None:
    shape = REFERENCE["Mixtral-8x7B"]
    breakdown = memory_breakdown(shape)
    assert sum(breakdown[key] for key in STATES) == pytest.approx(breakdown["state_total"])
    assert breakdown["state_total"] == pytest.approx(shape.params_total * 20 / GB)
    assert breakdown["adam_states"] == pytest.approx(shape.params_total * 8 / GB)
    assert breakdown["device_state"] == pytest.approx(80 * 0.9 * 0.7)
    lean = TrainingMemory(adam_states=0, master_weights=0, reference_model=0)
    assert devices_needed(shape, lean) < devices_needed(shape)
    assert devices_needed(shape, TrainingMemory(device_memory_gb=141)) < devices_needed(shape)


def test_rounding_to_nodes_and_powers_of_two() -> None:
    shape = REFERENCE["Mixtral-8x7B"]
    plain = devices_needed(shape)
    assert devices_needed(shape, rounding="node") == math.ceil(plain / 8) * 8
    pow2 = devices_needed(shape, rounding="pow2")
    assert pow2 >= plain and pow2 & (pow2 - 1) == 0 and pow2 < 2 * plain
    with pytest.raises(MoescopeError, match="rounding"):
        devices_needed(shape, rounding="rack")


def test_device_hours_are_devices_times_step_time() -> None:
    shape = REFERENCE["Qwen3-235B-A22B"]
    equal = cost_table(shape, step_time_s=3600.0)
    assert (equal["device_hours"] == equal["devices"]).all()
    measured = cost_table(shape, ["1/2"], step_time_s={"full": 600.0, "1/2": 900.0})
    devices = measured["devices"].tolist()
    assert measured["device_hours"].tolist() == [devices[0] * 600 / 3600, devices[1] * 900 / 3600]
    assert cost_table(shape)["device_hours"].isna().all()
    with pytest.raises(MoescopeError, match="step time"):
        cost_table(shape, step_time_s=0.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"device_memory_gb": 0}, "positive number of GB"),
        ({"device_memory_gb": -80}, "positive number of GB"),
        ({"usable_fraction": 1.5}, "usable fraction"),
        ({"activation_fraction": 0.6, "kv_cache_fraction": 0.5}, "leave room"),
        ({"adam_states": -1}, "negative"),
    ],
)
def test_memory_rejects_impossible_settings(fields: dict, message: str) -> None:
    with pytest.raises(MoescopeError, match=message):
        TrainingMemory(**fields)


def test_reference_table_notes_keeps_a_model_cannot_take() -> None:
    table = reference_table()
    assert len(table) == 12 * 4
    mixtral = table[table["model"] == "Mixtral-8x7B"].set_index("keep")
    assert mixtral.loc["1/2", "devices"] > 0 and mixtral.loc["1/2", "note"] == ""
    assert "top-k" in mixtral.loc["1/8", "note"] and mixtral["devices"].isna().sum() == 2
    scout = table[table["model"] == "Llama-4-Scout-17B-16E (text)"].set_index("keep")
    assert "vision tower" in scout.loc["full", "note"] and scout.loc["1/2", "note"] == ""


def test_a_cost_report_prints_a_block_per_model_and_what_its_figures_assume() -> None:
    profile = device_profile("h200")
    report = cost_report(REFERENCE["DeepSeek-V3"], ["1/4"], reference=True, rounding="node", profile=profile)
    text = report.text()
    assert text.startswith("DeepSeek-V3: 671B parameters (97% in routed experts)")
    assert text.count("routed experts per MoE layer") == len(REFERENCE)  # DeepSeek-V3 in one block
    assert "Devices rounded up to a node of 8." in text and text.endswith(PROXY_NOTE)
    assert STEP_NOTE in text and profile.text() in text
    data = report.to_dict()
    assert data["rounding"] == "node" and data["device"] == profile.to_dict()
    assert len(data["rows"]) == len(report.to_frame()) == 2 + 2 * len(REFERENCE)
    with pytest.raises(MoescopeError, match="give a model to cost"):
        cost_report(None)


# --- command line --------------------------------------------------------------------------------


def test_cli_prints_the_table_for_a_bare_config_json(tmp_path: Path, capsys) -> None:
    tiny_config("qwen3_moe", num_local_experts=32).save_pretrained(tmp_path)  # config.json only
    assert main(["cost", str(tmp_path / "config.json"), "--step-time", "60"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"{tmp_path.name}: ") and "32 routed experts per MoE layer, top-2" in lines[0]
    assert lines[1].split() == [
        "keep",
        "experts",
        "params",
        "active",
        "state",
        "GB",
        "devices",
        "reduction",
        "step",
        "s",
        "device-h/step",
    ]
    assert [line.split()[:2] for line in lines[2:6]] == [
        ["full", "32"],
        ["1/2", "16"],
        ["1/4", "8"],
        ["1/8", "4"],
    ]
    assert "20 B/param" in out and PROXY_NOTE in out
    assert lines[2].split()[-2:] == ["60.0", f"{60 / 3600:.3g}"]  # measured: nothing predicted
    assert "seconds: rollout" not in out


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_cli_costs_the_config_json_of_every_architecture(arch: str, tmp_path: Path, capsys) -> None:
    """As save_pretrained writes it: Nemotron-H's ``time_step_limit`` holds an infinity, which
    config.json spells ``{"__float__": "Infinity"}``."""
    config = tiny_config(arch)
    config.save_pretrained(tmp_path)
    assert main(["cost", str(tmp_path / "config.json")]) == 0
    experts = ARCHITECTURES[arch].num_experts(config)
    assert f"{experts} routed experts per MoE layer" in capsys.readouterr().out.splitlines()[0]


def test_cli_json_equals_the_library_table(tiny_checkpoint, capsys) -> None:
    path = tiny_checkpoint("deepseek_v3")
    args = ["cost", str(path), "--keep", "1/2", "--keep", "8", "--device-memory", "64", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    memory = TrainingMemory(device_memory_gb=64)
    expected = cost_table(path, ["1/2", "8"], memory=memory)
    assert data["memory"]["device_memory_gb"] == 64 and data["rounding"] == "device"
    assert [row["keep"] for row in data["rows"]] == ["full", "1/2", "8"]
    assert [row["params_total"] for row in data["rows"]] == expected["params_total"].tolist()
    assert data["device"]["name"] == "h100" and data["workload"]["prompts"] == 1024
    for row in data["rows"]:  # predicted on the default device
        assert row["step_source"] == "predicted" and row["step_time_s"] > 0
        assert row["device_hours"] == pytest.approx(row["devices"] * row["step_time_s"] / 3600)


def test_cli_reference_covers_every_published_model(capsys) -> None:
    assert main(["cost", "--reference", "--json", "--usable-fraction", "0.85", "--round", "node"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {row["model"] for row in data["rows"]} == set(REFERENCE)
    assert all(row["devices"] % 8 == 0 for row in data["rows"] if row["devices"] is not None)


def test_cli_toy_with_reference(capsys) -> None:
    assert main(["cost", "toy", "--reference", "--keep", "1/2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("toy: ") and "DeepSeek-V3: 671B parameters" in out


def _bad_inputs(tmp_path: Path) -> dict[str, list[str]]:
    from transformers import AutoConfig

    dense = tmp_path / "dense"
    AutoConfig.for_model("llama", hidden_size=32, num_hidden_layers=1).save_pretrained(dense)
    not_config = tmp_path / "not_config.json"
    not_config.write_text(json.dumps({"learning_rate": 1e-6}))
    not_json = tmp_path / "broken.json"
    not_json.write_text("{'model_type': ")
    listing = tmp_path / "moe_configs.json"
    listing.write_text(json.dumps({"models": []}))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"model_type": "no_such_arch"}))
    partial = tmp_path / "npu.json"
    partial.write_text(json.dumps({k: v for k, v in PROFILES["h100"].to_dict().items() if k != "hbm_tb_s"}))
    return {
        "dense model": ["cost", str(dense)],
        "dense model ": ["cost", str(dense / "config.json")],
        "not a model config": ["cost", str(not_config)],
        "not valid JSON": ["cost", str(not_json)],
        "lists several models": ["cost", str(listing)],
        "not a transformers architecture": ["cost", str(unknown)],
        "no such file or directory": ["cost", str(tmp_path / "missing.json")],
        "fewer than the top-k=2": ["cost", "toy", "--keep", "1"],
        "is neither a fraction": ["cost", "toy", "--keep", "3/2"],
        "positive number of GB": ["cost", "toy", "--device-memory", "0"],
        "positive number of GB ": ["cost", "toy", "--device-memory", "-16"],
        "usable fraction": ["cost", "toy", "--usable-fraction", "0"],
        "--step-time '-1' is not S or KEEP=S": ["cost", "toy", "--step-time", "-1"],
        "or --reference": ["cost"],
        "unknown device 'tpu9'": ["cost", "toy", "--device", "tpu9"],
        "lacks hbm_tb_s": ["cost", "toy", "--device", str(partial)],
        "no assumption named promts": ["cost", "toy", "--assume", "promts=8"],
        "not KEY=VALUE": ["cost", "toy", "--assume", "prompts"],
        "is not a number": ["cost", "toy", "--assume", "mfu=high"],
        "give a whole number": ["cost", "toy", "--assume", "prompts=1.5"],
        "it is a fraction": ["cost", "toy", "--assume", "mfu=30"],
        "inter_node_gb_s is -1": ["cost", "toy", "--assume", "inter_node_gb_s=-1"],
        "is not KEEP=N": ["cost", "toy", "--devices", "full=many"],
    }


def test_bad_input_is_one_sentence_with_exit_2(tmp_path: Path, capsys) -> None:
    for expected, argv in _bad_inputs(tmp_path).items():
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert captured.out == "" and len(lines) == 1, (argv, captured.err)
        assert expected.strip() in lines[0] and "Traceback" not in captured.err, (argv, lines[0])


# --- step time -----------------------------------------------------------------------------------

DEEPSEEK, QWEN3 = REFERENCE["DeepSeek-V3"], REFERENCE["Qwen3-30B-A3B"]


def test_profiles_read_by_name_from_json_and_with_overrides(tmp_path: Path) -> None:
    assert device_profile("H200") is PROFILES["h200"]
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(PROFILES["ascend-910b"].to_dict() | {"name": "my-npu", "memory_gb": 96}))
    mine = device_profile(path)
    assert (
        mine.name == "my-npu" and mine.memory_gb == 96 and mine.hbm_tb_s == PROFILES["ascend-910b"].hbm_tb_s
    )
    assert device_profile(mine, devices_per_node=16).devices_per_node == 16
    with pytest.raises(MoescopeError, match="unknown field"):
        device_profile({**PROFILES["h100"].to_dict(), "hbm": 3})
    with pytest.raises(MoescopeError, match="memory_gb is '80'"):
        device_profile({**PROFILES["h100"].to_dict(), "memory_gb": "80"})


def test_training_term_is_six_times_active_parameters_times_tokens_over_compute() -> None:
    profile, workload = PROFILES["h100"], RLWorkload(forward_passes=3.0, mfu=0.5)
    step = step_time(QWEN3, 16, profile, workload)
    flops = 6 * QWEN3.params_active * workload.tokens
    assert step.training_s == pytest.approx(flops / (16 * profile.bf16_tflops * 1e12 * 0.5))
    assert step_time(QWEN3, 32, profile, workload).training_s == pytest.approx(step.training_s / 2)


def test_rollout_instance_is_the_smallest_power_of_two_holding_the_weights() -> None:
    workload = RLWorkload()
    for shape in (QWEN3, DEEPSEEK, DEEPSEEK.with_keep(16)):
        step = step_time(shape, 1024, PROFILES["h100"], workload)
        holds = 80e9 * workload.rollout_memory_fraction * workload.weight_share * step.rollout_instance
        assert 2 * shape.params_total <= holds < 2 * (2 * shape.params_total) or step.rollout_instance == 1
        assert step.rollout_instance & (step.rollout_instance - 1) == 0
    with pytest.raises(MoescopeError, match="rollout engine needs 64 devices of h100"):
        step_time(DEEPSEEK, 16, PROFILES["h100"])


def test_communication_crosses_the_network_only_when_a_group_spans_nodes() -> None:
    fast = device_profile("ascend-910b", inter_node_gb_s=250)
    one_node = (QWEN3.with_keep(48), 8)
    for shape, devices in (one_node, (DEEPSEEK, 512)):
        slow_step, fast_step = (
            step_time(shape, devices, PROFILES["ascend-910b"]),
            step_time(shape, devices, fast),
        )
        spans = devices > 8
        assert (fast_step.all_to_all_s < slow_step.all_to_all_s) is spans
        assert (fast_step.weight_sync_s < slow_step.weight_sync_s) is spans
        assert (slow_step.bubble_s > 0) is spans and slow_step.pipeline_stages == (15 if spans else 1)
    assert step_time(REFERENCE["OLMoE-1B-7B"], 1, PROFILES["h200"]).all_to_all_s == 0


def test_weight_sync_and_optimizer_shrink_with_the_parameters() -> None:
    proxy = DEEPSEEK.with_keep(16)
    bytes_only = RLWorkload(sync_ms_per_tensor=0)
    full, small = (step_time(shape, 512, PROFILES["h100"], bytes_only) for shape in (DEEPSEEK, proxy))
    share = proxy.params_total / DEEPSEEK.params_total
    assert small.weight_sync_s == pytest.approx(full.weight_sync_s * share)
    assert small.optimizer_s == pytest.approx(full.optimizer_s * share)
    shard_only = RLWorkload(sync_full_model=False, sync_ms_per_tensor=0)
    shard = step_time(DEEPSEEK, 512, PROFILES["h100"], shard_only)
    assert shard.weight_sync_s == pytest.approx(full.weight_sync_s / full.rollout_instance)
    tensor_by_tensor = step_time(DEEPSEEK, 512, PROFILES["h100"])  # 1.5 ms a tensor by default
    per_tensor = DEEPSEEK.weight_tensors * 1.5e-3
    assert tensor_by_tensor.weight_sync_s == pytest.approx(full.weight_sync_s + per_tensor)
    assert proxy.weight_tensors < DEEPSEEK.weight_tensors / 10  # 16 of 256 experts: mostly expert tensors
    assert step_time(proxy, 512, PROFILES["h100"]).total_s < tensor_by_tensor.total_s  # same devices: faster


def test_weight_tensors_count_one_tensor_per_expert_projection() -> None:
    qwen = QWEN3  # 48 MoE layers of 128 experts, no shared expert
    assert qwen.weight_tensors == 48 * (3 * 128 + 1) + 8 * 48 + 3
    # a shared expert per MoE layer, 3 dense layers
    assert DEEPSEEK.weight_tensors == 58 * (3 * 257 + 1) + 3 * 3 + 8 * 61 + 3


def test_a_kv_cache_too_small_for_the_batch_decodes_longer() -> None:
    short, long = RLWorkload(prompts=64), RLWorkload(prompts=64, response_tokens=32768)
    a, b = step_time(QWEN3, 16, PROFILES["h100"], short), step_time(QWEN3, 16, PROFILES["h100"], long)
    assert a.decode_steps == 1024 and b.concurrent_sequences < a.concurrent_sequences
    assert b.decode_steps > 32768  # more sequences than the cache holds: they decode in turn
    assert b.rollout_s > 32 * a.rollout_s


def test_tensor_parallel_ranks_keep_copies_of_the_kv_heads_they_cannot_split() -> None:
    """MLA keeps one latent per token, whole on every rank, so a tensor-parallel instance holds no
    more sequences than one device; GQA splits until the ranks outnumber its key-value heads."""
    assert (DEEPSEEK.kv_heads, QWEN3.kv_heads) == (1, 4)
    workload, profile = RLWorkload(prompts=4096, response_tokens=4096), PROFILES["h200"]
    one, many = (replace_kv(DEEPSEEK, heads) for heads in (1, 128))
    held_mla = step_time(one, 64, profile, workload).concurrent_sequences
    held_split = step_time(many, 64, profile, workload).concurrent_sequences
    instance = step_time(one, 64, profile, workload).rollout_instance
    assert instance > 8 and held_split >= instance * held_mla > 0
    small = device_profile("h200", memory_gb=32)  # Qwen3-30B-A3B needs 8 ranks: two copies of each KV head
    qwen = [step_time(replace_kv(QWEN3, heads), 64, small, workload) for heads in (4, 8)]
    assert [step.rollout_instance for step in qwen] == [8, 8]
    assert abs(2 * qwen[0].concurrent_sequences - qwen[1].concurrent_sequences) <= 1


def replace_kv(shape: ModelShape, heads: int) -> ModelShape:
    from dataclasses import replace

    return replace(shape, kv_heads=heads)


def test_expert_parallel_rollout_replicates_the_backbone_and_splits_the_kv_cache() -> None:
    workload = RLWorkload(rollout_parallel="ep")
    qwen = step_time(QWEN3, 16, PROFILES["h100"], workload)
    tensor = step_time(QWEN3, 16, PROFILES["h100"])
    assert qwen.rollout_instance <= tensor.rollout_instance and qwen.rollout_s > 0
    with pytest.raises(MoescopeError, match=r"non-expert weights .* use rollout_parallel=tp"):
        step_time(DEEPSEEK, 512, PROFILES["ascend-910b"], workload)
    with pytest.raises(MoescopeError, match="rollout_parallel is 'dp'"):
        RLWorkload(rollout_parallel="dp")
    assert RLWorkload(sync_ms_per_tensor=0).sync_ms_per_tensor == 0  # bucketed weight sync
    with pytest.raises(MoescopeError, match="sync_ms_per_tensor is -1"):
        RLWorkload(sync_ms_per_tensor=-1)
    with pytest.raises(MoescopeError, match=r"mean_response_share is 1\.5; it is a fraction"):
        RLWorkload(mean_response_share=1.5)


def test_training_pays_for_the_mean_response_and_rollout_for_the_longest() -> None:
    budget, short_mean = RLWorkload(), RLWorkload(mean_response_share=0.25)
    a, b = step_time(QWEN3, 16, PROFILES["h100"], budget), step_time(QWEN3, 16, PROFILES["h100"], short_mean)
    assert b.training_s == pytest.approx(a.training_s * (512 + 256) / (512 + 1024))
    assert b.decode_steps == 1024 < a.decode_steps  # the cache holds every short sequence at once
    assert b.concurrent_sequences > a.concurrent_sequences and b.rollout_s < a.rollout_s


def test_cost_table_predicts_unless_a_step_time_is_measured() -> None:
    profile = PROFILES["ascend-910b"]
    table = cost_table(QWEN3, ["48"], profile=profile, rounding="pow2", step_time_s={"48": 100.0}).set_index(
        "keep"
    )
    assert table["devices"].tolist() == [16, 8]  # 64 GB devices: as the paper ran it
    assert table.loc["full", "step_source"] == "predicted" and table.loc["48", "step_source"] == "measured"
    predicted = step_time(QWEN3, 16, profile)
    assert table.loc["full", "step_time_s"] == pytest.approx(predicted.total_s)
    assert table.loc["full", "all_to_all_s"] == pytest.approx(predicted.all_to_all_s)
    assert table.loc["48", "device_hours"] == pytest.approx(8 * 100 / 3600) and math.isnan(
        table.loc["48", "rollout_s"]
    )
    given = cost_table(DEEPSEEK, ["16"], profile=profile, devices={"full": 512, "16": 64}).set_index("keep")
    assert given["devices"].tolist() == [512, 64] and given["devices_given"].all()
    assert given.loc["16", "reduction_pct"] == pytest.approx(87.5)
    assert "64 devices on 8 node(s)" in given.loc["16", "layout"]


def test_cli_prints_every_assumption_of_a_predicted_step(capsys) -> None:
    argv = ["cost", "toy", "--keep", "1/4", "--device", "ascend-910b", "--assume", "prompts=8"]
    assert main([*argv, "--assume", "inter_node_gb_s=12.5", "--devices", "full=2"]) == 0
    out = capsys.readouterr().out
    assert "full: 2 devices on 1 node(s); rollout instances of 1" in out and "seconds: rollout" in out
    assert "  full       32" in out and "2 (given)" in out
    assert PROFILES["ascend-910b"].text().replace("25 GB/s across", "12.5 GB/s across") in out
    assert RLWorkload(prompts=8).text() in out and STEP_NOTE in out
    assert "64 GB devices" in out  # the device's memory sizes the devices


def test_cli_step_time_measured_per_row_or_for_every_row(capsys) -> None:
    assert main(["cost", "toy", "--keep", "1/4", "--step-time", "full=3000", "--json"]) == 0
    rows = {row["keep"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["full"]["step_source"] == "measured" and rows["full"]["step_time_s"] == 3000
    assert rows["1/4"]["step_source"] == "predicted" and rows["1/4"]["rollout_s"] > 0
    assert (
        main(["cost", "toy", "--keep", "1/4", "--step-time", "1/4=720", "--step-time", "60", "--json"]) == 0
    )
    rows = {row["keep"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert [rows[k]["step_time_s"] for k in ("full", "1/4")] == [60, 720]


def test_paper_comparison_predicts_both_rows_on_the_papers_devices() -> None:
    table = paper_comparison().set_index("label")
    qwen, deepseek = table.loc["Qwen3-30B-A3B"], table.loc["DeepSeek-V3.2"]
    assert qwen["devices_model"] == "16 → 8" and deepseek["devices_model"] == "512 → 32"
    profile = PROFILES["ascend-910b"]
    expected = (
        step_time(DEEPSEEK, 512, profile).total_s / step_time(DEEPSEEK.with_keep(16), 64, profile).total_s
    )
    assert deepseek["ratio_predicted"] == pytest.approx(8 * expected)
    assert deepseek["ratio_paper"] == pytest.approx(426.7 / 12.8, rel=1e-3)
    assert qwen["ratio_paper"] == pytest.approx(0.573 / 0.255, rel=1e-2)
    assert (table["factor"] == table["ratio_predicted"] / table["ratio_paper"]).all()


def test_readme_quotes_the_paper_comparison_as_computed() -> None:
    """The README's results quote the predicted device-hour ratios (the docs' table is generated)."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("| Device-hours per step"))
    for _, row in paper_comparison().iterrows():
        assert f"{row['label']} {row['ratio_predicted']:.2f}×" in line, (row["label"], line)


def test_published_full_size_step_is_compared_as_the_docs_show() -> None:
    """verl's DeepSeek-V3 benchmark (96 H20): the model costs its layout and workload, and the
    cost explanation page quotes the prediction as computed."""
    row = published_comparison().iloc[0]
    assert row["devices"] == "96 × h20" and (row["step_s"], row["rollout_s"]) == (1700.0, 1050.0)
    assert "rollout instances of 32" in row["layout"] and "(mean 1960)" in row["workload"]
    assert row["factor"] == pytest.approx(row["step_predicted_s"] / 1700.0)
    page = Path(__file__).parents[1] / "docs" / "explanation" / "cost.md"
    readme = " ".join(page.read_text().split())
    quoted = (
        f"predicts {row['step_predicted_s']:,.0f} s for the measured 1,700 s, and "
        f"{row['rollout_predicted_s']:,.0f} s of rollout for the measured 1,050 s"
    )
    assert quoted in readme


def test_cli_takes_the_rollout_engine_layout_as_a_word(capsys) -> None:
    argv = ["cost", "Qwen3-30B-A3B", "--keep", "48", "--device", "h100"]
    assert main([*argv, "--assume", "rollout_parallel=ep", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["rollout_parallel"] == "ep"
    assert main([*argv, "--assume", "rollout_parallel=pp"]) == 2
    assert "rollout_parallel is 'pp'" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3", "sarvam_mla", "glm4_moe_lite"])
def test_every_mla_model_caches_one_latent_head(arch: str) -> None:
    """With or without an analytic formula for its type, an MLA model's cache is its latent and
    shared rotary key per layer, one head a tensor-parallel rank cannot split."""
    config = tiny_config(arch)
    shape = ModelShape.from_config(config)
    latent = config.kv_lora_rank + config.qk_rope_head_dim
    assert shape.kv_heads == 1 and shape.kv_per_token == config.num_hidden_layers * latent
