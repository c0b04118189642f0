"""Streaming export: the in-memory proxy tensor for tensor, from shards, in bounded memory."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from moescope.errors import MoescopeError, UnsupportedArchitectureError
from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import embed_experts
from moescope.export.gather import needs_streaming
from moescope.export.pipeline import export_proxy
from moescope.export.streaming.export import embed_checkpoint, export_streaming
from moescope.keep import parse_keep
from moescope.models.loading import INDEX_FILE
from moescope.models.support import spec_for
from moescope.models.table import set_config_value
from moescope.models.view import adapt
from moescope.models.zoo import tiny
from moescope.provenance import config_hash

# Mixtral's block_sparse_moe names, Qwen3's gate/up/down, DeepSeek-V3's correction bias, dense
# first layer and grouped routing, GPT-OSS's transposed interleaved experts with biases, ERNIE's
# [1, E] bias, MiniMax-M2's bias on the block, Granite's legacy fused names, Sarvam's fused
# query_key_value (split on loading) and Kimi-Linear's w1/w2/w3 experts and per-projection
# convolutions (joined on loading), Nemotron-H's ungated experts under ``backbone.``, DBRX's
# ``[E·I, H]`` expert tensors under ``transformer.blocks`` and expert settings in ``ffn_config``,
# Laguna's correction bias as a parameter of the router, Kolibri-1's as a buffer, Inkling 2's
# gate and up rows interleaved in its original layout (``w13_weight``), MiniMax-M3's fused original
# layout, dots.note3's per-layer attention sizes.
ARCHS = (
    "mixtral",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
    "ernie4_5_moe",
    "minimax_m2",
    "granitemoe",
    "sarvam_moe",
    "kimi_linear",
    "nemotron_h",
    "dbrx",
    "laguna",
    "kolibri1",
    "inkling2_text",
    "minimax_m3_vl_text",
    "dots3_note_text",
)
LAYOUTS = ("per-expert", "fused")
# Inkling 2 Loop's original layout holds quantized experts (see the refusal test below)
STREAMED = [(arch, layout) for arch in ARCHS for layout in LAYOUTS] + [("inkling2_loop_text", "fused")]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory):
    """``make(arch, layout)``: a tiny checkpoint saved in ~40 KB shards (with an index)."""
    cache: dict[tuple[str, str], Path] = {}

    def make(arch: str, layout: str = "per-expert") -> Path:
        if (arch, layout) not in cache:
            path = tmp_path_factory.mktemp(f"{arch}-{layout}")
            tiny(arch).save_pretrained(
                path, save_original_format=layout == "per-expert", max_shard_size="40KB"
            )
            cache[arch, layout] = path
        return cache[arch, layout]

    return make


def _half(source: Path) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        moe = adapt(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)))
    rule = moe.rule
    return parse_keep(0.5, moe.num_experts, moe.top_k, rule.n_group, topk_group=rule.topk_group)


def _state(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()  # stock transformers, no moescope


def _assert_same_weights(a: Path, b: Path) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key, value in sa.items():
        assert value.dtype == sb[key].dtype and torch.equal(value, sb[key]), key


def _stored(path: Path) -> dict[str, str]:
    """Key → shard file of every tensor in a checkpoint directory."""
    where = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            where.update(dict.fromkeys(handle.keys(), file.name))
    return where


def _assert_index_is_right(path: Path) -> None:
    index = json.loads((path / INDEX_FILE).read_text())
    assert index["weight_map"] == _stored(path)
    tensors = [t for file in set(index["weight_map"].values()) for t in load_file(path / file).values()]
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors)
    assert index["metadata"]["total_parameters"] == sum(t.numel() for t in tensors)


@pytest.mark.parametrize(("arch", "layout"), STREAMED)
def test_streaming_writes_the_in_memory_proxy(arch: str, layout: str, sharded, tmp_path: Path) -> None:
    source = sharded(arch, layout)
    keep = _half(source)
    memory = export_proxy(
        source, tmp_path / "mem", keep=keep, method="random", seed=3, streaming=False, progress=False
    )
    streamed = export_streaming(
        source, tmp_path / "str", keep=keep, method="random", seed=3, progress=False, max_shard_size="30KB"
    )
    assert streamed.selection == memory.selection
    _assert_same_weights(memory.path, streamed.path)
    _assert_index_is_right(streamed.path)

    keys = _stored(streamed.path)
    per_expert = [key for key in keys if re.search(r"\.experts\.\d+\.", key)]
    fused_originals = ("gpt_oss", "granitemoe", "dbrx", "inkling2_text", "minimax_m3_vl_text")  # stored fused
    assert bool(per_expert) == (layout == "per-expert" and arch not in fused_originals)
    assert {int(re.search(r"\.experts\.(\d+)\.", k).group(1)) for k in per_expert} <= set(range(keep))
    for entry in ("source", "proxy"):
        assert streamed.manifest[entry]["config_hash"] == memory.manifest[entry]["config_hash"]
    written, expected = (json.loads((path / "config.json").read_text()) for path in (streamed.path, source))
    set_config_value(expected, _count_key(source), keep)
    assert written == expected
    with safe_open(str(next(streamed.path.glob("*.safetensors"))), "pt") as handle:
        assert handle.metadata() == {"format": "pt"}


def test_quantized_original_experts_are_refused_naming_the_in_memory_export(sharded, tmp_path: Path) -> None:
    """Inkling 2 Loop's original checkpoints store NVFP4 / MXFP8 experts that transformers
    dequantizes while loading; streaming does not read them, and says so before writing."""
    source = sharded("inkling2_loop_text", "per-expert")
    with pytest.raises(UnsupportedArchitectureError, match=r"Dequantize.*export in memory \(--no-streaming"):
        export_streaming(source, tmp_path / "out", keep=_half(source), method="random", progress=False)
    assert list(tmp_path.iterdir()) == []


def _count_key(source: Path) -> str:
    return spec_for(json.loads((source / "config.json").read_text())["model_type"]).count_key


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3", "gpt_oss", "nemotron_h", "dbrx", "inkling2_text"])
def test_weight_embeddings_from_shards_equal_the_loaded_models(
    arch: str, layout: str, sharded, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    source = sharded(arch, layout)
    loaded = embed_experts(AutoModelForCausalLM.from_pretrained(source), "weights", seed=5, progress=False)
    streamed = embed_checkpoint(source, seed=5, progress=False)
    assert streamed.layers == loaded.layers and streamed.config_hash == loaded.config_hash
    np.testing.assert_array_equal(streamed.vectors, loaded.vectors)

    keep = _half(source)
    result = export_streaming(source, tmp_path / "p", keep=keep, seed=5, progress=False)
    np.testing.assert_array_equal(result.embeddings.vectors, loaded.vectors)  # computed in the same pass
    assert result.selection == select_experts(loaded, keep, method="cluster", seed=5)
    assert result.manifest["view"] == "weights" and result.manifest["method"] == "cluster"
    memory = export_proxy(source, tmp_path / "m", selection=result.selection, streaming=False, progress=False)
    _assert_same_weights(memory.path, result.path)


@pytest.mark.parametrize("arch", ["mixtral", "gpt_oss", "dbrx"])  # split, joined, stacked rows
def test_sketching_on_several_threads_gives_the_vectors_of_one(arch: str, sharded, monkeypatch) -> None:
    """Experts sketched on three threads at once (each mapping its tensors, joining its own
    per-expert pieces) give the vectors one thread gives, bit for bit."""
    from moescope.export.streaming import weight_view

    source = sharded(arch, "per-expert")
    monkeypatch.setattr(weight_view, "usable_cores", lambda: 1)
    one = embed_checkpoint(source, progress=False).vectors
    monkeypatch.setattr(weight_view, "usable_cores", lambda: 3)
    np.testing.assert_array_equal(embed_checkpoint(source, progress=False).vectors, one)


def test_a_single_file_source_and_a_selection_file(tiny_checkpoint, tmp_path: Path) -> None:
    source = tiny_checkpoint("qwen3_moe")
    assert not (source / INDEX_FILE).exists()
    selection = select_experts(tiny("qwen3_moe"), 4, method="random", seed=7)
    selection.save(tmp_path / "selection.json")
    result = export_streaming(source, tmp_path / "p", selection=tmp_path / "selection.json", progress=False)
    assert sorted(p.name for p in result.path.glob("*.safetensors")) == ["model.safetensors"]
    assert not (result.path / INDEX_FILE).exists() and result.embeddings is None
    memory = export_proxy(source, tmp_path / "m", selection=selection, streaming=False, progress=False)
    _assert_same_weights(memory.path, result.path)


def test_bfloat16_weight_view_from_shards_equals_the_loaded_models(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    tiny("qwen3_moe").to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="40KB")
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.dtype == torch.bfloat16
    loaded = embed_experts(model, "weights", seed=2, progress=False)
    np.testing.assert_array_equal(embed_checkpoint(tmp_path, seed=2, progress=False).vectors, loaded.vectors)


def test_prefetch_asks_one_readahead_window_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """Linux reads at most one readahead window per WILLNEED; larger requests fetch only their
    start. The advice covers every byte, in pieces no larger than a window."""
    import os

    from moescope.export.streaming.shards import PREFETCH_PIECE, ShardReader, StoredTensor

    file = tmp_path / "blob"
    file.write_bytes(bytes(8))
    tensor = StoredTensor("t", file, "U8", (10 * PREFETCH_PIECE,), offset=8)
    asked = []
    monkeypatch.setattr(
        os, "posix_fadvise", lambda fd, start, length, advice: asked.append((start, length, advice))
    )
    ranges = [(0, 3 * PREFETCH_PIECE + 5), (5 * PREFETCH_PIECE, PREFETCH_PIECE // 2)]
    with ShardReader() as reader:
        reader.prefetch(tensor, ranges)
    willneed = [(start, length) for start, length, advice in asked if advice == os.POSIX_FADV_WILLNEED]
    assert max(length for _, length in willneed) <= PREFETCH_PIECE
    covered = {byte for start, length in willneed for byte in range(start, start + length)}
    assert covered == {8 + byte for start, length in ranges for byte in range(start, start + length)}


def test_without_the_kernel_advice_of_linux_the_pass_still_writes_the_proxy(
    sharded, tmp_path: Path, monkeypatch
) -> None:
    """``posix_fadvise`` is Linux's and ``madvise`` is missing on Windows: both are speed only."""
    import mmap
    import os

    monkeypatch.delattr(os, "posix_fadvise")
    for advice in ("MADV_SEQUENTIAL", "MADV_DONTNEED"):
        monkeypatch.delattr(mmap, advice)
    source = sharded("qwen3_moe")
    result = export_streaming(source, tmp_path / "p", keep=_half(source), seed=1, progress=False)
    memory = export_proxy(source, tmp_path / "m", selection=result.selection, streaming=False, progress=False)
    _assert_same_weights(memory.path, result.path)


@pytest.mark.parametrize("method", ["cluster", "random"])
def test_a_failed_write_stops_the_pass_and_leaves_nothing(
    method: str, sharded, tmp_path: Path, monkeypatch
) -> None:
    import moescope.export.streaming.shards as shards

    real, calls = shards._write_all, []

    def full_disk(handle, data):
        calls.append(len(data))
        if len(calls) > 20:
            raise OSError(28, "No space left on device")
        real(handle, data)

    monkeypatch.setattr(shards, "_write_all", full_disk)
    source = sharded("qwen3_moe")
    with pytest.raises(OSError, match="No space left"):
        export_streaming(source, tmp_path / "out", keep=_half(source), method=method, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_experts_interleaved_across_shards_are_clustered_one_layer_at_a_time(sharded, tmp_path: Path) -> None:
    """Even experts of every layer in one shard, odd ones in the next: layers interleave."""
    source = tmp_path / "parity"
    shutil.copytree(sharded("mixtral"), source)
    state = {}
    for file in source.glob("*.safetensors"):
        state.update(load_file(file))
        file.unlink()
    expert = re.compile(r"\.experts\.(\d+)\.")
    shards = {"even": {}, "odd": {}, "rest": {}}
    for key, value in state.items():
        found = expert.search(key)
        shards["rest" if not found else ("odd" if int(found.group(1)) % 2 else "even")][key] = value
    names = {part: f"model-0000{i}-of-00003.safetensors" for i, part in enumerate(shards, 1)}
    for part, tensors in shards.items():
        save_file(tensors, source / names[part], metadata={"format": "pt"})
    weight_map = {key: names[part] for part, tensors in shards.items() for key in tensors}
    (source / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    result = export_streaming(source, tmp_path / "p", keep=4, progress=False)
    memory = export_proxy(source, tmp_path / "m", selection=result.selection, streaming=False, progress=False)
    _assert_same_weights(memory.path, result.path)


# --- bad input -----------------------------------------------------------------------------------


def _copy(source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(source, tmp_path / "src"))


def _truncate(path: Path) -> None:
    shard = sorted(path.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-10])


def _contradict_shape(path: Path) -> None:
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] *= 2
    (path / "config.json").write_text(json.dumps(config))


def _contradict_dtype(path: Path) -> None:
    config = json.loads((path / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (path / "config.json").write_text(json.dumps(config))


def _index_names_missing_file(path: Path) -> None:
    index = json.loads((path / INDEX_FILE).read_text())
    index["weight_map"]["lm_head.weight"] = "model-00099-of-00099.safetensors"
    (path / INDEX_FILE).write_text(json.dumps(index))


def _index_names_wrong_file(path: Path) -> None:
    index = json.loads((path / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    key = next(k for k, f in index["weight_map"].items() if f != files[0])
    index["weight_map"][key] = files[0]
    (path / INDEX_FILE).write_text(json.dumps(index))


def _drop_an_expert(path: Path) -> None:
    index = json.loads((path / INDEX_FILE).read_text())
    key = "model.layers.1.block_sparse_moe.experts.5.w3.weight"
    shard = path / index["weight_map"].pop(key)
    tensors = load_file(shard)
    del tensors[key]
    save_file(tensors, shard, metadata={"format": "pt"})
    (path / INDEX_FILE).write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_truncate, "is corrupted or truncated"),
        (_contradict_shape, "but config.json implies"),
        (_contradict_dtype, "but config.json says the weights are torch.bfloat16"),
        (_index_names_missing_file, "which is missing"),
        (_index_names_wrong_file, "which does not hold it"),
        (_drop_an_expert, "experts.5.w3.weight is missing from the checkpoint"),
    ],
)
def test_a_damaged_checkpoint_is_refused_in_one_sentence(damage, says: str, sharded, tmp_path: Path) -> None:
    source = _copy(sharded("mixtral"), tmp_path)
    damage(source)
    with pytest.raises(MoescopeError, match=re.escape(says)) as err:
        export_streaming(source, tmp_path / "out", keep=4, method="random", progress=False)
    _assert_one_sentence(str(err.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "nothing may be left at the output"


def _assert_one_sentence(message: str) -> None:
    assert "\n" not in message and message.endswith(".") and len(message) < 400, message


@pytest.mark.parametrize(
    ("arch", "key"),
    [
        ("sarvam_moe", "model.layers.0.attention.query_key_value.weight"),  # split into q, k, v
        ("kimi_linear", "model.layers.0.self_attn.k_conv1d.weight"),  # joined with q and v
    ],
)
def test_a_tensor_loading_splits_or_joins_is_checked_against_the_config(
    arch: str, key: str, sharded, tmp_path: Path
) -> None:
    source = _copy(sharded(arch), tmp_path)
    index = json.loads((source / INDEX_FILE).read_text())
    shard = source / index["weight_map"][key]
    tensors = load_file(shard)
    tensors[key] = torch.cat([tensors[key], tensors[key]], dim=-1)  # wrong on an axis loading keeps
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(MoescopeError, match=re.escape(f"{key} has shape")) as err:
        export_streaming(source, tmp_path / "out", keep=4, method="random", progress=False)
    _assert_one_sentence(str(err.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_bad_requests_are_refused_before_anything_is_written(sharded, tmp_path: Path) -> None:
    source = sharded("mixtral")
    other = select_experts(tiny("qwen3_moe"), 4, method="random")
    cases = [
        (dict(selection=other), "config hash"),
        (dict(keep=1, method="random"), "top-k"),
        (dict(), "say how many experts to keep"),
    ]
    for kwargs, says in cases:
        with pytest.raises(MoescopeError, match=re.escape(says)) as err:
            export_streaming(source, tmp_path / "out", progress=False, **kwargs)
        _assert_one_sentence(str(err.value))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(MoescopeError, match="--overwrite"):
        export_streaming(source, tmp_path / "out", keep=4, method="random", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"
    result = export_streaming(
        source, tmp_path / "out", keep=4, method="random", overwrite=True, progress=False
    )
    assert not (result.path / "precious.txt").exists() and [p.name for p in tmp_path.iterdir()] == ["out"]


# --- choosing to stream --------------------------------------------------------------------------


def test_export_streams_when_the_model_would_not_fit(sharded, tmp_path: Path, monkeypatch) -> None:
    """Without a budget, the memory available decides: an original that does not fit beside a
    proxy is read a layer at a time, and the proxy cut from its shards."""
    from transformers import AutoConfig

    import moescope.export.gather as gather

    source = sharded("qwen3_moe")
    weights = sum(f.stat().st_size for f in source.glob("*.safetensors"))
    monkeypatch.setattr(gather, "available_memory", lambda: int(weights * 1.6))
    assert not needs_streaming(source, keep="1/2")  # model + half-size proxy: 1.5x the weights
    assert needs_streaming(source, keep=8)  # keep all: 2x
    assert needs_streaming(source)  # keep unknown: assume the proxy could be as large as the model
    monkeypatch.setattr(gather, "available_memory", lambda: 1)
    ids = torch.randint(3, 100, (8, 32), generator=torch.Generator().manual_seed(0))
    options = {"keep": 4, "method": "frequency", "calibration": ids, "n_tokens": 256, "fidelity": False}
    result = export_proxy(source, tmp_path / "p", progress=False, **options)  # streaming=None: automatic
    assert result.manifest["original"]["read"] == "layer-sequential"
    assert "exceed the memory available" in result.manifest["original"]["why"]
    written = AutoConfig.from_pretrained(result.path)
    assert written.num_local_experts == 4
    assert config_hash(written) == result.manifest["proxy"]["config_hash"]


# --- memory --------------------------------------------------------------------------------------

_MEASURE = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import moescope.export.streaming.shards as shards
    from moescope.export.streaming.export import export_streaming, open_checkpoint

    def status(field):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    source, out = sys.argv[1:]
    open_checkpoint(source)  # imports and first-use costs, outside the measurement
    def slow_disk(handle, data, write=shards._write_all):
        time.sleep(0.01)  # the pass sketches on while the writes lag behind
        write(handle, data)

    peaks = {}
    for run in ("random", "cluster", "cluster, slow disk"):
        try:
            Path("/proc/self/clear_refs").write_text("5")  # restart the peak (VmHWM) from here
        except OSError:
            break
        if run == "cluster, slow disk":
            shards._write_all = slow_disk
        before = status("VmRSS:")
        method = run.split(",")[0]
        export_streaming(source, f"{out}-{len(peaks)}", keep=4, method=method, progress=False)
        peaks[run] = status("VmHWM:") - before
    print(json.dumps(peaks))
    """
)


def _random_checkpoint(path: Path, arch: str, **shape) -> None:
    """A checkpoint of random weights, written without the slow initialisation of a real model."""
    from transformers import AutoModelForCausalLM

    from moescope.models.zoo import tiny_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_config(arch, **shape))
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.normal_(0.0, 0.02, generator=generator)
    model.save_pretrained(path, max_shard_size="100MB")


@pytest.mark.slow
def test_peak_memory_is_one_layer_of_experts_not_the_model(tmp_path: Path) -> None:
    """Peak resident memory of real exports in a fresh process, on a checkpoint of 16 layers
    whose experts are 97% of the weights: a copy buffer, plus one layer's experts when clustering,
    even when the writes lag behind the sketching."""
    from moescope.export.streaming.shards import COPY_CHUNK

    source = tmp_path / "src"
    _random_checkpoint(
        source,
        "qwen3_moe",
        hidden_size=256,
        moe_intermediate_size=512,
        num_hidden_layers=16,
        num_local_experts=16,
    )
    model_bytes = sum(f.stat().st_size for f in source.glob("*.safetensors"))
    layer_bytes = 16 * 3 * 256 * 512 * 4
    assert model_bytes > 15 * layer_bytes
    run = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(source), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    peaks = json.loads(run.stdout.strip().splitlines()[-1])
    if not peaks:
        pytest.skip("this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)")
    slack = 32 << 20  # the interpreter's own allocations while it works
    assert peaks["random"] < COPY_CHUNK + slack, peaks
    assert peaks["cluster"] < layer_bytes + COPY_CHUNK + slack, peaks
    assert peaks["cluster, slow disk"] < layer_bytes + COPY_CHUNK + slack, peaks
    assert peaks["cluster"] < model_bytes / 5, peaks
