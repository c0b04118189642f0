"""Decoder layers of a layer-sequential model run a forward's rows in chunks: the same statistics
and Taylor sums, padding included, one read of the checkpoint per forward whatever the chunks,
chunks sized within the pass's memory, and generation (a key/value cache) left whole."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch

from moescope.explore.rl_data import RLCalibration
from moescope.explore.routing import collect_routing
from moescope.explore.sequential import checkpoint_reads, layer_sequential
from moescope.explore.taylor import taylor_importance
from moescope.models.footprint import largest_layer_bytes, layer_activation_bytes
from moescope.models.loading import load_model
from moescope.models.row_chunks import _rows, chunk_decoder_layers
from moescope.models.view import adapt
from moescope.models.zoo import TINY_ARCHS, tiny

pytestmark = pytest.mark.usefixtures("one_thread")

ARRAYS = ("counts", "coactivation", "saliency_sum", "entropy_sum", "context_sum")


def _ragged_rows() -> RLCalibration:
    """Seven prompts of 3 to 9 ids, each with a completion of 2 to 4: padded rows in every batch."""
    g = torch.Generator().manual_seed(3)
    lengths = [(3 + i, 2 + i % 3) for i in range(7)]
    rows = [
        torch.randint(3, 44, (p + c,), generator=g).tolist() for p, c in lengths
    ]  # 44: the toy vocabulary
    prompts = tuple(tuple(r[:p]) for r, (p, _) in zip(rows, lengths, strict=True))
    completions = tuple(tuple(r[p:]) for r, (p, _) in zip(rows, lengths, strict=True))
    return RLCalibration(prompts, completions, seed=0, temperature=1.0, max_new_tokens=4)


def test_padded_rows_in_chunks_give_the_in_memory_statistics_and_sums_in_one_read_per_forward() -> None:
    """Chunks of 2 rows: padding is found per chunk (the observer reads each chunk's share of
    the mask), a forward still reads each layer once, and Taylor's backward once more. Each
    layer call of the routing pass is as wide as its chunk's longest real row, not the batch."""
    from moescope.explore.calibration import calibration_batches
    from moescope.models.row_chunks import real_lengths
    from moescope.models.view import decoder_layers

    data = _ragged_rows()
    options = {"n_tokens": 10_000, "batch_size": 7, "seq_len": 64}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model("toy")
    expected = collect_routing(model, data, progress=False, **options)
    expected_taylor = taylor_importance(model, data, batch_size=7)
    calls: list[tuple[int, int]] = []  # (rows, positions) of each call of the first layer
    with layer_sequential("toy") as loaded:
        chunk_decoder_layers(loaded, lambda *_: 2)
        chunked = decoder_layers(loaded)[0]._old_forward
        forward = chunked.forward
        chunked.forward = lambda *args, **kw: calls.append(tuple(args[0].shape[:2])) or forward(*args, **kw)
        got = collect_routing(loaded, data, progress=False, **options)
        assert checkpoint_reads(loaded) == 1  # one forward of 7 rows, four chunks
        chunked.forward = forward
        taylor = taylor_importance(loaded, data, batch_size=7)
        assert checkpoint_reads(loaded) == 3  # its forward and its backward
    assert got.n_tokens == expected.n_tokens == sum(len(r) for r in data.rows())
    (batch,) = calibration_batches(data, None, **options)
    lengths, starts = real_lengths(batch["attention_mask"]), [0, *np.cumsum([rows for rows, _ in calls])]
    assert starts[-1] == len(lengths) == 7 and max(lengths) == batch["input_ids"].shape[1]
    assert [width for _, width in calls] == [max(lengths[a:b]) for a, b in itertools.pairwise(starts)]
    assert min(width for _, width in calls) < max(lengths)  # some chunk ran on fewer positions
    for name in ARRAYS:
        np.testing.assert_allclose(
            getattr(got, name), getattr(expected, name), rtol=1e-5, atol=1e-5, err_msg=name
        )
    assert taylor.tokens == expected_taylor.tokens and expected_taylor.sums.max() > 0
    np.testing.assert_allclose(
        taylor.sums, expected_taylor.sums, rtol=1e-5, atol=1e-6 * expected_taylor.sums.max()
    )


def _chunk_sizes(model: str, ids: torch.Tensor, available: int) -> list[int]:
    """The rows of each chunk the first MoE layer ran in one routing pass over ``ids``."""
    sizes: list[int] = []
    width = ids.shape[1]
    with layer_sequential(model, available=available) as loaded:
        first = adapt(loaded).layers[0].experts
        first.register_forward_pre_hook(lambda _, args: sizes.append(args[0].shape[0] // width))
        collect_routing(loaded, ids, n_tokens=ids.numel(), batch_size=len(ids), seq_len=width, progress=False)
    return sizes


def test_chunks_take_as_many_rows_as_the_pass_memory_holds_beside_a_layer() -> None:
    """Half the room beside the largest layer, in one row's activations; one row at least. The
    first row runs alone, measured: toy's layers take less than their estimate, which sizes the rest."""
    ids = torch.randint(3, 44, (9, 16), generator=torch.Generator().manual_seed(0))
    with layer_sequential("toy") as probe:
        layer, row = largest_layer_bytes(probe), layer_activation_bytes(probe.config, rows=1, seq_len=16)
    for available, chunk in ((layer + 2 * 4 * row, 4), (layer + 1, 1)):
        assert _chunk_sizes("toy", ids, available) == [1, *[chunk] * (8 // chunk)], available


def test_chunks_are_sized_by_a_measured_row_where_the_estimate_falls_short(tiny_checkpoint) -> None:
    """Qwen3-Next's gated delta rule, run by its reference kernels on the CPU, holds far more
    than two dozen hidden vectors a token: a room of four rows by the estimate takes one row at
    a time, the size the first row was measured at."""
    from moescope.models.peak_memory import peak_allocation

    path = tiny_checkpoint("qwen3_next")
    ids = torch.randint(3, 128, (6, 32), generator=torch.Generator().manual_seed(0))
    with layer_sequential(path) as probe:
        layer, row = largest_layer_bytes(probe), layer_activation_bytes(probe.config, rows=1, seq_len=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _chunk_sizes(path, ids, layer + 2 * 4 * row) == [1] * 6
    with peak_allocation(torch.device("cpu")) as peak:
        torch.empty(3 * row, dtype=torch.uint8).fill_(1)
    assert 3 * row <= peak.bytes < 4 * row  # the measure itself: one tensor of three rows' estimate


def test_generation_runs_whole_rows_and_samples_as_in_memory() -> None:
    """A key/value cache written a chunk at a time would be wrong: a forward that carries one
    is never chunked, and greedy decoding equals the in-memory model's."""
    ids = torch.randint(3, 44, (4, 6), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = load_model("toy")
    expected = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    asked: list[bool] = []
    with layer_sequential("toy") as loaded:
        chunk_decoder_layers(loaded, lambda _, backward, __: asked.append(backward) or 1)
        got = loaded.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got, expected) and not asked


def test_only_tensors_with_a_row_per_entry_are_cut() -> None:
    rows, part = 5, slice(1, 3)
    hidden, mask, shared, positions = (
        torch.zeros(5, 7, 4),
        torch.ones(5, 1, 7, 7),
        torch.ones(1, 7, 2),
        torch.arange(7),
    )
    args = (
        hidden,
        {"mask": mask, "cos_sin": (shared, torch.zeros(5, 7, 2)), "cache_position": positions, "n": 3},
    )
    cut_hidden, cut = _rows(args, part, rows)
    assert cut_hidden.shape == (2, 7, 4) and cut["mask"].shape == (2, 1, 7, 7)
    assert cut["cos_sin"][0] is shared and cut["cos_sin"][1].shape == (2, 7, 2)  # broadcast rows kept whole
    assert cut["cache_position"] is positions and cut["n"] == 3


def test_the_held_out_kl_of_an_original_whose_head_runs_apart_is_the_in_memory_one(monkeypatch) -> None:
    """The original's forward stops at its head, which then runs two rows at a time beside the
    proxy's forward of the same rows: the same KL, agreement and routing as in memory."""
    from moescope.export.fidelity.agreement import SCORED_BYTES, next_token_agreement, task_batches
    from moescope.models.tasks import heldout

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tokenizer = load_model("toy")
        proxy, _ = load_model("toy")
    with torch.no_grad():
        for parameter in proxy.parameters():
            parameter.add_(0.01 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    batches = list(task_batches(heldout("add2", 10), tokenizer, n_tokens=10_000, batch_size=10))
    expected, expected_stats = next_token_agreement(model, proxy, batches, observe=True)
    with layer_sequential("toy") as loaded:
        width, vocab = batches[0]["input_ids"].shape[1], loaded.config.vocab_size
        chunk = SCORED_BYTES * width * vocab
        monkeypatch.setattr(loaded, "_pass_memory", largest_layer_bytes(loaded) + 2 * 2 * chunk + 1)
        got, stats = next_token_agreement(loaded, proxy, batches, observe=True)
    assert got["n_tokens"] == expected["n_tokens"] > 0 and expected["kl"] > 0
    for name in ("kl", "top1_agreement", "perplexity_ratio"):
        assert got[name] == pytest.approx(expected[name], rel=1e-5), name
    np.testing.assert_array_equal(stats[0].counts, expected_stats[0].counts)
    np.testing.assert_array_equal(stats[1].counts, expected_stats[1].counts)


def test_a_table_of_positions_is_not_cut_as_rows_where_the_rows_are_as_many(tiny_checkpoint) -> None:
    """inkling2's layers take a (positions × positions) table of relative distances: in a forward
    of 8 rows of 8 positions it has a row's count of entries. The layer's first such forward runs
    as one chunk; once a forward of 5 rows showed the table is no row's, the next runs a row a
    chunk with the table whole; the teacher equals the in-memory one each time."""
    from moescope.explore.calibration import pad_scored
    from moescope.export.teacher import build_teacher_cache
    from moescope.models.view import decoder_layers
    from moescope.models.zoo import tiny

    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(2, 100, (5,), generator=g).tolist(), [7, 9, 11]) for _ in range(8)]
    square, fewer = [pad_scored(pairs, 0)], [pad_scored(pairs[:5], 0)]
    expected = build_teacher_cache(tiny("inkling2_text"), square, k=8)
    calls: list[int] = []
    with layer_sequential(tiny_checkpoint("inkling2_text"), available=1) as loaded:  # a chunk of one row
        chunked = decoder_layers(loaded)[0]._old_forward
        forward = chunked.forward
        chunked.forward = lambda *args, **kwargs: calls.append(len(args[0])) or forward(*args, **kwargs)
        first = build_teacher_cache(loaded, square, k=8, available=2**30)
        first_calls = calls[:]
        build_teacher_cache(loaded, fewer, k=8, available=2**30)
        calls.clear()
        again = build_teacher_cache(loaded, square, k=8, available=2**30)
    assert first_calls == [8] and calls == [1] * 8
    torch.testing.assert_close(first.log_probs, expected.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again.log_probs, expected.log_probs, rtol=1e-5, atol=1e-5)


# Run on every position: inkling2's layers take a table of relative distances (positions ×
# positions); under DeepSeek sparse attention (top-4 keys here) a query's keys can fall on the padding.
UNTRIMMED = {"inkling2_text", "inkling2_loop_text", "deepseek_v32", "glm_moe_dsa", "dots3_note_text", "hy_v4"}


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_right_padded_rows_run_on_their_real_positions_and_give_the_in_memory_teacher(
    arch: str, tiny_checkpoint
) -> None:
    """The teacher's rows, longest first, run a chunk at a time on their real positions alone:
    here one row, or as many as the widest row's positions hold (the rows of 5 and 3 positions
    together, the widest holding 10), each layer call as wide as its longest row, and the
    distributions at the scored positions those of the model in memory, in the rows' own order."""
    from moescope.explore.calibration import pad_scored
    from moescope.export.teacher import build_teacher_cache
    from moescope.models.view import decoder_layers

    g = torch.Generator().manual_seed(1)
    pairs = [
        (torch.randint(2, 100, (2 + i,), generator=g).tolist(), [7, 9, 11][: 1 + i % 3]) for i in range(6)
    ]
    batches = [pad_scored(pairs[:3], 0), pad_scored(pairs[3:], 0)]
    expected = build_teacher_cache(tiny(arch), batches, k=8)
    widths: list[int] = []
    with layer_sequential(tiny_checkpoint(arch), available=1) as loaded:  # a chunk of one row
        chunked = decoder_layers(loaded)[0]._old_forward
        forward = chunked.forward
        chunked.forward = lambda *args, **kwargs: widths.append(args[0].shape[1]) or forward(*args, **kwargs)
        got = build_teacher_cache(loaded, batches, k=8, available=2**30)
    lengths = sorted((len(p) + len(c) for p, c in pairs), reverse=True)
    assert lengths == [10, 8, 7, 6, 5, 3]
    assert widths == ([lengths[0]] * len(lengths) if arch in UNTRIMMED else [10, 8, 7, 6, 5])
    torch.testing.assert_close(got.log_probs, expected.log_probs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.log_rest, expected.log_rest, rtol=1e-5, atol=1e-5)
