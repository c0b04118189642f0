"""Layer-sequential calibration: the same statistics and expert embeddings as the in-memory pass,
one layer in memory, and the calibrated selections it gives a streaming export."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore import embeddings
from moescope.explore.calibration import calibration_data
from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import embed_experts
from moescope.explore.routing import collect_routing
from moescope.explore.sequential import (
    check_memory,
    collect_routing_sequential,
    forward_row_bytes,
    largest_layer_bytes,
    layer_device_map,
    layer_sequential,
    pass_batch_size,
    router_rows,
)
from moescope.export.streaming.export import export_streaming
from moescope.models.layer_weights import LayerWeights
from moescope.models.loading import load_model
from moescope.models.row_chunks import chunk_decoder_layers
from moescope.models.view import adapt, decoder_layers
from moescope.models.zoo import TINY_ARCHS, tiny

# one torch thread, as each worker of `make test` runs: a looped model's sums over two threads' partial
# reductions drift past the tolerance (tiny inkling2_loop: 2.2e-5 against 1e-5, run alone)
pytestmark = pytest.mark.usefixtures("one_thread")

OPTIONS = {"n_tokens": 192, "batch_size": 3, "seq_len": 32, "progress": False}
ARRAYS = ("counts", "prob_mass", "coactivation", "saliency_sum", "entropy_sum", "max_logit", "context_sum")


def _ids(model: torch.nn.Module) -> torch.Tensor:
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(3, vocab, (6, 32), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_statistics_and_embeddings_equal_the_in_memory_pass(arch: str, tiny_checkpoint) -> None:
    """Routing statistics, and expert embeddings in every view (the outputs probes included)."""
    path = tiny_checkpoint(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model(path, with_tokenizer=False)
        ids = _ids(model)
        expected = collect_routing(model, ids, **OPTIONS)
        got = collect_routing_sequential(path, ids, **OPTIONS)
        views = embed_experts(model, "multiview", stats=expected, dim=8, progress=False)
        with layer_sequential(path) as loaded:
            views_got = embed_experts(loaded, "multiview", stats=expected, dim=8, progress=False)
            chunk_decoder_layers(loaded, lambda *_: 2)  # each batch of 3 rows in chunks of 2 and 1
            chunked = collect_routing(loaded, ids, **OPTIONS)
    assert (
        got.n_tokens == expected.n_tokens == chunked.n_tokens == 192
        and got.config_hash == expected.config_hash
    )
    for name in ARRAYS:
        # summed a chunk at a time (the first row runs alone, measured; then chunks of 2): the
        # float error of another order of sums
        np.testing.assert_allclose(
            getattr(got, name), getattr(expected, name), rtol=1e-5, atol=1e-5, err_msg=name
        )
        np.testing.assert_allclose(
            getattr(chunked, name), getattr(expected, name), rtol=1e-5, atol=1e-5, err_msg=name
        )
    assert views_got.components == views.components == ("weights", "outputs", "router", "coactivation")
    np.testing.assert_allclose(views_got.vectors, views.vectors, rtol=1e-4, atol=1e-5)


def test_one_decoder_layer_is_in_memory_at_a_time() -> None:
    resident: list[tuple[str, int]] = []
    with layer_sequential("toy") as model:
        layers = decoder_layers(model)
        assert all(p.device.type == "meta" for p in layers.parameters())  # nothing loaded yet
        assert model.get_input_embeddings().weight.device.type == "cpu"

        def count(moment: str) -> Callable[..., None]:
            def hook(*_: object) -> None:
                loaded = sum(any(p.device.type != "meta" for p in layer.parameters()) for layer in layers)
                resident.append((moment, loaded))

            return hook

        handles = [layer.register_forward_pre_hook(count("before")) for layer in layers]
        hooks = [layer.experts.register_forward_hook(count("inside")) for layer in adapt(model).layers]
        collect_routing(model, _ids(model), **OPTIONS)
        for handle in handles + hooks:
            handle.remove()
        assert all(p.device.type == "meta" for p in layers.parameters())  # and released after
    for moment, loaded in (("before", 0), ("inside", 1)):  # before a layer / inside one (each chunk)
        assert {n for m, n in resident if m == moment} == {loaded}, moment


def test_the_heap_is_trimmed_once_the_layers_read_add_up(monkeypatch) -> None:
    """Freed layers go back to the system every ``TRIM_AFTER`` bytes read, not at every read (a
    trim per read of a small layer cost more in page faults than the pass's own system time)."""
    from moescope.models import layer_weights

    trims: list[int] = []
    monkeypatch.setattr(layer_weights, "release_freed_memory", lambda: trims.append(1))
    with layer_sequential("toy") as model:
        weights, layer = model._layer_weights, model._layer_weights.layers[0]
        size = sum(t.numel() * t.element_size() for t in weights.read(layer).values())
        monkeypatch.setattr(layer_weights, "TRIM_AFTER", 3 * size)
        for _ in range(8):
            weights.read(layer)
    assert len(trims) == 2  # at the 3rd and the 6th of the 8 reads: three layers read each time


def test_untied_embeddings_and_head_are_read_only_when_used(tiny_checkpoint) -> None:
    """Vocabulary-sized matrices stay out of memory while the layers run: the embeddings are in
    memory from the start of a forward to the end of their lookup (the head, inside its forward)."""
    seen: list[tuple[str, str, str]] = []
    with layer_sequential(tiny_checkpoint("qwen3_moe")) as model:
        embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
        assert embeddings.weight is not head.weight

        def where(moment: str) -> None:
            seen.append((moment, embeddings.weight.device.type, head.weight.device.type))

        hooks = [
            embeddings.register_forward_pre_hook(lambda *_: where("lookup")),
            decoder_layers(model)[0].register_forward_pre_hook(lambda *_: where("layer")),
        ]
        where("before")
        collect_routing(model, _ids(model), **OPTIONS)
        where("after")
        for hook in hooks:
            hook.remove()
    assert seen[0] == ("before", "meta", "meta") and seen[-1] == ("after", "meta", "meta")
    assert {s for s in seen[1:-1] if s[0] == "lookup"} == {("lookup", "cpu", "meta")}
    assert {s for s in seen[1:-1] if s[0] == "layer"} == {("layer", "meta", "meta")}
    assert sum(s[0] == "lookup" for s in seen) == 2  # one forward per batch of OPTIONS


def test_one_decoder_layer_is_in_memory_while_its_experts_are_embedded(monkeypatch) -> None:
    seen: list[int] = []
    embed_layer = embeddings._embed_layer

    with layer_sequential("toy") as model:
        layers = decoder_layers(model)

        def counted(part, layer, *args):
            seen.append(sum(any(p.device.type != "meta" for p in each.parameters()) for each in layers))
            assert all(p.device.type != "meta" for p in layer.layer.parameters()), "its own weights"
            return embed_layer(part, layer, *args)

        monkeypatch.setattr(embeddings, "_embed_layer", counted)
        embed_experts(model, "multiview", progress=False)
        assert all(p.device.type == "meta" for p in layers.parameters())  # released after
    assert seen and set(seen) == {1}


def test_no_shard_is_mapped_while_the_layers_run(tiny_checkpoint) -> None:
    """The pages a mapping of a shard touched would count in resident memory for as long as it is
    open (from_pretrained's loading mapped every shard): the layers' weights are read, not mapped."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps")
    path = tiny_checkpoint("qwen3_moe")
    mapped: list[bool] = []
    with layer_sequential(path) as model:
        hooks = [
            layer.experts.register_forward_hook(lambda *_: mapped.append(str(path) in maps.read_text()))
            for layer in adapt(model).layers
        ]
        collect_routing(model, _ids(model), **OPTIONS)
        for hook in hooks:
            hook.remove()
    assert mapped and not any(mapped)


def test_router_rows_are_read_while_their_layer_runs() -> None:
    model = tiny("qwen3_moe")
    expected = {layer.index: layer.router_weight.detach().float().numpy() for layer in adapt(model).layers}
    with layer_sequential_model(model) as loaded, router_rows(loaded) as rows:
        loaded(_ids(loaded))
    assert rows.keys() == expected.keys()
    for index, weight in expected.items():
        np.testing.assert_array_equal(rows[index], weight)


def layer_sequential_model(model: torch.nn.Module):
    """A tiny model saved and loaded back a layer at a time."""
    import contextlib
    import tempfile

    @contextlib.contextmanager
    def loaded():
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            with layer_sequential(folder) as sequential:
                yield sequential

    return loaded()


def test_device_map_places_layers_on_disk_and_the_rest_in_memory() -> None:
    placement = layer_device_map(tiny("dbrx"))
    layers = [key for key, where in placement.items() if where == "disk"]
    assert layers == [f"transformer.blocks.{i}" for i in range(len(layers))] and layers
    assert {"transformer.wte", "transformer.norm_f", "lm_head"} <= {
        k for k, v in placement.items() if v == "cpu"
    }


def test_a_model_with_weights_outside_its_modules_is_refused() -> None:
    model = tiny("mixtral")
    model.model.stray = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(MoescopeError, match=r"keeps weights directly on 'model'.*one at a time"):
        layer_device_map(model)


def test_a_quantized_checkpoint_is_refused(tiny_checkpoint, tmp_path: Path) -> None:
    import json
    import shutil

    source = shutil.copytree(tiny_checkpoint("qwen3_moe"), tmp_path / "fp8")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (source / "config.json").write_text(json.dumps(config))
    with (
        pytest.raises(MoescopeError, match=r"quantized weights.*calibrate it in memory"),
        layer_sequential(source),
    ):
        pass


def test_a_streaming_export_offers_the_calibrated_methods(tmp_path: Path) -> None:
    """Each chooses as the in-memory export would from the same calibration data."""
    model, tokenizer = load_model("toy", dtype="auto")  # as export_proxy loads it
    data = calibration_data(model, tokenizer, "tasks", n_tokens=1000)
    stats = collect_routing(model, data, tokenizer=tokenizer, n_tokens=1000, progress=False)
    for method in ("paper", "reap", "frequency"):
        options = {"keep": "1/4", "method": method, "calibration": "tasks", "n_tokens": 1000}
        streamed = export_streaming("toy", tmp_path / method, progress=False, **options)
        in_memory = select_experts(model, "1/4", method=method, stats=stats)
        assert streamed.selection.method == method
        kept = [layer.kept for layer in streamed.selection.layers]
        assert kept == [layer.kept for layer in in_memory.layers], method
        assert streamed.manifest["calibration"] == {"source": "tasks", "data": "task suite (seed 0)"}


def test_a_streaming_export_reads_each_layer_once_for_its_statistics(tmp_path: Path, monkeypatch) -> None:
    """Every batch of a layer-sequential pass reads every layer again: the pass takes as many rows
    per batch as memory allows, here all of them (16 rows a batch read the toy's layers 4 times)."""
    reads: list[str] = []
    read = LayerWeights.read
    monkeypatch.setattr(LayerWeights, "read", lambda self, layer: reads.append(layer) or read(self, layer))
    options = {"keep": "1/4", "method": "frequency", "calibration": "tasks", "n_tokens": 1000}
    export_streaming("toy", tmp_path / "proxy", progress=False, **options)
    assert reads and reads.count(reads[0]) == 1


def test_a_pass_takes_as_many_rows_as_half_the_memory_beside_a_layer_holds() -> None:
    """Of their hidden states and kept logits: each layer runs them in chunks its activations fit."""
    model = tiny("qwen3_moe")
    layer = largest_layer_bytes(model)
    row = forward_row_bytes(model, seq_len=128)
    room = layer + 2 * 100 * row
    assert pass_batch_size(model, n_tokens=10_000, available=room) == 100
    assert pass_batch_size(model, n_tokens=40, available=room) == 40  # a row per token at most
    assert pass_batch_size(model, n_tokens=10_000, available=layer) == 1  # at least one row


def test_a_pass_that_does_not_fit_in_memory_is_refused_before_a_layer_runs() -> None:
    """A batch too large beside one layer names the batch as the fix; a layer too large alone, the machine."""
    batch = {name: OPTIONS[name] for name in ("n_tokens", "batch_size", "seq_len")}
    with layer_sequential("toy") as model:
        layer = largest_layer_bytes(model)
        check_memory(model, **batch, available=1 << 40)
        with pytest.raises(
            MoescopeError, match=r"one decoder layer \(.+\) and the hidden states .* fewer tokens"
        ):
            check_memory(model, **batch, available=layer + 1)
        with pytest.raises(MoescopeError, match=r"needs a machine with more memory\.$"):
            check_memory(model, **batch, available=layer // 2)
    ids = torch.randint(3, 44, (6, 32))  # 44: the toy vocabulary
    with pytest.raises(MoescopeError, match=r"^one decoder layer .* is free; calibrate with fewer tokens"):
        collect_routing_sequential("toy", ids, available=layer + 1, **OPTIONS)


def test_the_command_line_refuses_a_calibration_that_does_not_fit(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A streaming export's calibration pass: one sentence on stderr, exit status 2, no output."""
    from moescope.cli import main

    monkeypatch.setattr("moescope._util.memory.available_memory", lambda: 1)
    out = tmp_path / "proxy"
    argv = ["export", "toy", "--streaming", "--keep", "1/4", "--method", "frequency", "--no-fidelity"]
    assert main([*argv, "--n-tokens", "1000", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moescope: error: one decoder layer") and err.count("\n") == 0 and not out.exists()
