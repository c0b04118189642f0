"""Layer-sequential calibration: the same statistics as the in-memory pass, one layer in memory,
and the calibrated selections it gives a streaming export."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_data
from moescope.explore.clustering import select_experts
from moescope.explore.routing import collect_routing
from moescope.explore.sequential import (
    collect_routing_sequential,
    layer_device_map,
    layer_sequential,
    router_rows,
)
from moescope.export.streaming.export import export_streaming
from moescope.models.loading import load_model
from moescope.models.view import adapt, decoder_layers
from moescope.models.zoo import TINY_ARCHS, tiny

OPTIONS = {"n_tokens": 192, "batch_size": 3, "seq_len": 32, "progress": False}
ARRAYS = ("counts", "prob_mass", "coactivation", "saliency_sum", "entropy_sum", "max_logit", "context_sum")


def _ids(model: torch.nn.Module) -> torch.Tensor:
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(3, vocab, (6, 32), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_statistics_equal_the_in_memory_pass(arch: str, tiny_checkpoint) -> None:
    path = tiny_checkpoint(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model(path, with_tokenizer=False)
        ids = _ids(model)
        expected = collect_routing(model, ids, **OPTIONS)
        got = collect_routing_sequential(path, ids, **OPTIONS)
    assert got.n_tokens == expected.n_tokens == 192 and got.config_hash == expected.config_hash
    for name in ARRAYS:
        np.testing.assert_allclose(
            getattr(got, name), getattr(expected, name), rtol=1e-5, atol=1e-6, err_msg=name
        )


def test_one_decoder_layer_is_in_memory_at_a_time() -> None:
    resident: list[int] = []
    with layer_sequential("toy") as model:
        layers = decoder_layers(model)
        assert all(p.device.type == "meta" for p in layers.parameters())  # nothing loaded yet
        assert model.get_input_embeddings().weight.device.type == "cpu"

        def count(*_: object) -> None:
            resident.append(sum(any(p.device.type != "meta" for p in layer.parameters()) for layer in layers))

        handles = [layer.register_forward_pre_hook(count) for layer in layers]
        hooks = [layer.experts.register_forward_hook(count) for layer in adapt(model).layers]
        collect_routing(model, _ids(model), **OPTIONS)
        for handle in handles + hooks:
            handle.remove()
        assert all(p.device.type == "meta" for p in layers.parameters())  # and released after
    assert resident and set(resident[::2]) == {0} and set(resident[1::2]) == {1}  # before / inside a layer


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
