"""Taylor importance of a model loaded a decoder layer at a time: the in-memory sums on every
architecture that supports it, with one layer's weights in memory through the backward too."""

from __future__ import annotations

import warnings
import weakref

import numpy as np
import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.rl_data import RLCalibration
from moescope.explore.sequential import (
    forward_row_bytes,
    largest_layer_bytes,
    layer_sequential,
    pass_batch_size,
    taylor_importance_sequential,
)
from moescope.explore.taylor import supports_taylor, taylor_importance
from moescope.models.layer_weights import LayerWeights
from moescope.models.loading import load_model
from moescope.models.row_chunks import chunk_decoder_layers
from moescope.models.view import adapt, decoder_layers
from moescope.models.zoo import TINY_ARCHS, tiny

pytestmark = pytest.mark.usefixtures("one_thread")

_SLOW_ARCHS = {"granitemoehybrid"}  # the reference Mamba-2 kernel takes seconds on CPU
_SCALING = [a for a in TINY_ARCHS if supports_taylor(adapt(tiny(a)))]
OPTIONS = {"n_tokens": 192, "seq_len": 32}


def _ids(model: torch.nn.Module, rows: int = 6) -> torch.Tensor:
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(3, vocab, (rows, 32), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "arch", [pytest.param(a, marks=pytest.mark.slow) if a in _SLOW_ARCHS else a for a in _SCALING]
)
def test_sums_equal_the_in_memory_pass(arch: str, tiny_checkpoint) -> None:
    """Two batches of three rows in memory; one batch of all six a layer at a time (as many rows
    as memory allows): sums over sequences, the same whatever the batches."""
    path = tiny_checkpoint(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model(path, dtype="auto", with_tokenizer=False)
        ids = _ids(model)
        expected = taylor_importance(model, ids, batch_size=3, **OPTIONS)
        got = taylor_importance_sequential(path, ids, **OPTIONS)
        with layer_sequential(path, dtype="auto") as loaded:
            chunk_decoder_layers(loaded, lambda *_: 4)  # the six rows in chunks of 4 and 2
            chunked = taylor_importance(loaded, ids, **OPTIONS)
    assert (got.sequences, got.tokens, got.layers) == (expected.sequences, expected.tokens, expected.layers)
    assert got.config_hash == expected.config_hash and expected.sums.max() > 0
    for sums in (got.sums, chunked.sums):
        np.testing.assert_allclose(sums, expected.sums, rtol=1e-5, atol=1e-6 * expected.sums.max())


def _ragged(vocab: int) -> RLCalibration:
    """Six rows of 3 to 12 ids, right-padded in a batch of all six."""
    g = torch.Generator().manual_seed(0)
    lengths = [(8, 4), (2, 1), (6, 2), (2, 2), (9, 3), (3, 1)]
    rows = [torch.randint(3, vocab, (p + c,), generator=g).tolist() for p, c in lengths]
    prompts = tuple(tuple(r[:p]) for r, (p, _) in zip(rows, lengths, strict=True))
    completions = tuple(tuple(r[p:]) for r, (p, _) in zip(rows, lengths, strict=True))
    return RLCalibration(prompts, completions, seed=0, temperature=1.0, max_new_tokens=4)


def test_padded_rows_run_on_their_real_positions_through_the_backward(tiny_checkpoint) -> None:
    """A batch of rows of 12, 12, 8, 4, 4 and 3 ids in chunks of one row: each chunk runs on its
    rows' real positions, in the forward and again in the backward, the three shortest in one
    chunk (the widest row's 12 positions hold them), and the sums are the in-memory ones."""
    path = tiny_checkpoint("deepseek_v3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model(path, dtype="auto", with_tokenizer=False)
    data = _ragged(model.config.vocab_size)
    expected = taylor_importance(model, data, batch_size=2)
    widths: list[int] = []
    with layer_sequential(path, dtype="auto") as loaded:
        chunk_decoder_layers(loaded, lambda *_: 1)
        chunked = decoder_layers(loaded)[-1]._old_forward  # an MoE layer, which the backward reaches
        forward = chunked.forward
        chunked.forward = lambda *args, **kwargs: widths.append(args[0].shape[1]) or forward(*args, **kwargs)
        got = taylor_importance(loaded, data, batch_size=6)
    assert sorted(widths) == sorted([12, 12, 8, 4] * 2)  # each chunk twice: its forward and its backward
    np.testing.assert_allclose(got.sums, expected.sums, rtol=1e-5, atol=1e-6 * expected.sums.max())


@pytest.mark.parametrize(("rows", "chunks"), [(3, 2), (1, 1)])  # batches of 3 rows in 2 chunks; of 1 row
def test_one_decoder_layer_is_in_memory_through_the_backward(rows: int, chunks: int, monkeypatch) -> None:
    """Each layer's weights are read twice a batch (its forward, then once for the backward of
    all its chunks), however many chunks its rows run in, and no other layer's weights are
    alive, in a module or kept by autograd, while a layer runs."""
    reads: list[str] = []
    read = LayerWeights.read
    monkeypatch.setattr(LayerWeights, "read", lambda self, layer: reads.append(layer) or read(self, layer))
    alive: dict[int, list[weakref.ref]] = {}
    seen: list[int] = []
    with layer_sequential("toy") as model:
        layers = decoder_layers(model)
        forwards = [layer.forward for layer in layers]
        chunk_decoder_layers(model, lambda *_: 2)

        def track(index: int):
            def hook(*_: object) -> None:  # inside the layer: its weights are loaded
                alive[index] = [weakref.ref(p) for p in layers[index].parameters()]
                seen.append(sum(any(r() is not None for r in refs) for refs in alive.values()))

            return hook

        hooks = [layer.experts.register_forward_pre_hook(track(layer.index)) for layer in adapt(model).layers]
        taylor_importance(model, _ids(model), batch_size=rows, **OPTIONS)
        for hook in hooks:
            hook.remove()
        assert all(p.device.type == "meta" for p in layers.parameters())  # released after
        assert [layer.forward for layer in layers] == forwards  # accelerate's own forward
    assert set(seen) == {1}, seen
    batches = 6 // rows
    assert len(seen) == batches * chunks * 2 * len(layers)  # each chunk in the forward and the backward
    assert all(reads.count(layer) == batches * 2 for layer in set(reads)) and len(set(reads)) == len(layers)


def test_an_lm_head_read_from_disk_is_not_in_memory_beside_a_layer(tiny_checkpoint, monkeypatch) -> None:
    """It runs its rows in chunks too, each again in the backward, read once for the forward's
    chunks and once for the backward's: the head and a layer are never in memory together, and
    a batch never holds every position's logits."""
    head_alive: list[bool] = []
    with layer_sequential(tiny_checkpoint("qwen3_moe")) as model:
        head = model.get_output_embeddings()
        assert head.weight is not model.get_input_embeddings().weight
        held: list[weakref.ref] = []
        rows: list[int] = []
        forward = head._old_forward  # what accelerate's hook runs once the weight is loaded

        def watched(hidden: torch.Tensor) -> torch.Tensor:
            held.append(weakref.ref(head.weight))
            rows.append(len(hidden))
            return forward(hidden)

        monkeypatch.setattr(head, "_old_forward", watched)
        per_row = 16 * 32 * model.config.vocab_size  # a row's logits, four times over
        monkeypatch.setattr(model, "_pass_memory", largest_layer_bytes(model) + 2 * 2 * per_row)
        hooks = [
            layer.experts.register_forward_pre_hook(
                lambda *_: head_alive.append(any(r() is not None for r in held))
            )
            for layer in adapt(model).layers
        ]
        taylor_importance(model, _ids(model), batch_size=6, **OPTIONS)
        for hook in hooks:
            hook.remove()
        assert head.weight.device.type == "meta"
    assert rows == [2, 2, 2, 2, 2, 2]  # three chunks of two rows, in the forward and the backward
    assert head_alive and not any(head_alive)


def test_rl_completions_are_scored_as_in_memory(tiny_checkpoint, rl_rows) -> None:
    path, data = tiny_checkpoint("deepseek_v3"), rl_rows(3)
    model, _ = load_model(path, dtype="auto", with_tokenizer=False)
    expected = taylor_importance(model, data, batch_size=2)
    got = taylor_importance_sequential(path, data)
    assert got.tokens == expected.tokens == 9 and got.sequences == 3
    np.testing.assert_allclose(got.sums, expected.sums, rtol=1e-5, atol=1e-6 * expected.sums.max())


def test_a_batch_counts_every_layer_input_and_only_the_logits_it_holds(tiny_checkpoint) -> None:
    """The backward holds each layer's input; every position's logits only where the LM head
    cannot run in chunks (a model in memory, or one whose logits are not the head's output)."""
    model = tiny("qwen3_moe")
    whole = forward_row_bytes(model, seq_len=128, backward=True)
    assert whole > forward_row_bytes(model, seq_len=128)
    vocab = model.config.vocab_size
    with layer_sequential(tiny_checkpoint("qwen3_moe")) as loaded:
        chunked = forward_row_bytes(loaded, seq_len=128, backward=True)
        assert whole - chunked == 16 * 128 * vocab - 4 * vocab  # every position's logits, four times
        assert forward_row_bytes(loaded, seq_len=128) < chunked  # every layer's input kept
        loaded.config.logits_scaling = 4.0  # logits the head alone does not give: held whole
        assert forward_row_bytes(loaded, seq_len=128, backward=True) == whole
    room = largest_layer_bytes(model) + 2 * 100 * whole
    assert pass_batch_size(model, n_tokens=100_000, available=room, backward=True) == 100
    assert pass_batch_size(model, n_tokens=100_000, available=room) > 100


def test_a_pass_that_does_not_fit_is_refused_before_a_layer_runs() -> None:
    with layer_sequential("toy") as model:
        layer = largest_layer_bytes(model)
    ids = torch.randint(3, 44, (6, 32))  # 44: the toy vocabulary
    with pytest.raises(MoescopeError, match=r"^one decoder layer .* is free; calibrate with fewer tokens"):
        taylor_importance_sequential("toy", ids, available=layer + 1, **OPTIONS)
