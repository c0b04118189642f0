"""The original's accuracy from few reads of the model: the estimators."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from moescope.explore.sequential import layer_sequential
from moescope.export.fidelity.original import answer_log_probs, original_accuracy
from moescope.models.accuracy import model_accuracy
from moescope.models.layer_weights import LayerWeights
from moescope.models.loading import load_model
from moescope.models.tasks import TASK_FAMILIES, Example, heldout


@pytest.fixture(scope="module")
def toy(one_thread):
    return load_model("toy")


def _step_by_step(model, tok, prompt: str, target: list[int]) -> tuple[float, bool]:
    """P(``target`` | ``prompt``) and whether greedy writes it, one unpadded forward per token."""
    ids = tok(prompt)["input_ids"]
    p, greedy = 1.0, True
    for token in target:
        with torch.no_grad():
            probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
        p *= float(probs[token])
        greedy &= int(probs.argmax()) == token
        ids = [*ids, token]
    return p, greedy


def _target(tok, answer: str) -> list[int]:
    return [*tok(answer, add_special_tokens=False)["input_ids"], tok.eos_token_id]


def test_answer_probabilities_equal_the_step_by_step_product(toy) -> None:
    """Rows of different lengths in one left-padded forward; "4" stops short of 46, so its
    end-of-sequence is unlikely and counts."""
    model, tok = toy
    cases = [("12+34=", "46"), ("12+34=", "4"), ("rev:abcdefghijkl=", "lkjihgfedcba"), ("1+1=", "2")]
    targets = [_target(tok, answer) for _, answer in cases]
    prompts = [tok(prompt)["input_ids"] for prompt, _ in cases]
    logp, greedy = answer_log_probs(model, prompts, targets, pad=tok.pad_token_id)
    expected = [
        _step_by_step(model, tok, prompt, target) for (prompt, _), target in zip(cases, targets, strict=True)
    ]
    np.testing.assert_allclose(np.exp(logp), [p for p, _ in expected], rtol=1e-4, atol=1e-9)
    assert greedy == [g for _, g in expected]
    assert expected[0][0] > 0.5 and expected[1][0] < 0.01  # the eos after "4" is what makes it unlikely


def test_teacher_forced_sampled_accuracy_is_the_mean_probability_of_the_answer_then_eos(toy) -> None:
    model, tok = toy
    frame = original_accuracy(model, tok, ("add3", "rev"), n_prompts=3, samples=2)
    for task in ("add3", "rev"):
        examples = heldout(task, 3)
        p, greedy = zip(
            *(_step_by_step(model, tok, ex.prompt, _target(tok, ex.answer)) for ex in examples), strict=True
        )
        rows = frame[frame["task"] == task].set_index("mode")
        assert rows.loc["greedy", "accuracy"] == sum(greedy) / 3
        assert rows.loc["sampled", "accuracy"] == pytest.approx(np.mean(p), abs=1e-5)
        mixed = np.mean([1 - q**2 - (1 - q) ** 2 for q in p])
        assert rows.loc["sampled", "mixed"] == pytest.approx(mixed, abs=1e-5)
    assert 0 < frame["accuracy"].min() < frame["accuracy"].max() <= 1  # not all right, not all wrong


def test_both_estimators_have_model_accuracy_s_rows_and_its_greedy_figures(toy) -> None:
    model, tok = toy
    expected = model_accuracy(model, tok, TASK_FAMILIES, n_prompts=6, samples=2)
    for method in ("teacher-forced", "sampled"):
        got = original_accuracy(model, tok, TASK_FAMILIES, n_prompts=6, samples=2, method=method)
        pd.testing.assert_frame_equal(got[["task", "mode", "n"]], expected[["task", "mode", "n"]])
        greedy = got["mode"] == "greedy"  # judged with each task's own budget though generated together
        assert got.loc[greedy, "accuracy"].tolist() == expected.loc[greedy, "accuracy"].tolist()


def test_a_prompt_file_is_judged_greedily_as_model_accuracy_judges_it(toy) -> None:
    model, tok = toy
    examples = [*heldout("add3", 4), Example("mine", "cpy:abc=", "abc"), Example("mine", "1+1=", "3")]
    expected = model_accuracy(model, tok, examples)
    for method in ("teacher-forced", "sampled"):
        pd.testing.assert_frame_equal(original_accuracy(model, tok, examples, method=method), expected)


def test_layer_sequential_gives_the_in_memory_figure_reading_each_layer_once_per_batch(
    toy, monkeypatch
) -> None:
    model, tok = toy
    reads: list[str] = []
    read = LayerWeights.read
    monkeypatch.setattr(LayerWeights, "read", lambda self, layer: reads.append(layer) or read(self, layer))
    options = {"n_prompts": 5, "samples": 2}
    expected = original_accuracy(model, tok, TASK_FAMILIES, **options)
    with layer_sequential("toy") as loaded:
        got = original_accuracy(loaded, tok, TASK_FAMILIES, **options)
        assert reads.count(reads[0]) == 1  # every prompt of every task in one forward
        reads.clear()
        batched = original_accuracy(loaded, tok, TASK_FAMILIES, batch_size=10, **options)
        assert reads.count(reads[0]) == 3  # 25 rows, 10 a forward
        reads.clear()
        original_accuracy(loaded, tok, TASK_FAMILIES, method="sampled", **options)
        assert reads.count(reads[0]) <= 2 * 13  # greedy and sampled: a read per token, 13 at most
    pd.testing.assert_frame_equal(got, expected, atol=1e-5, rtol=0)
    pd.testing.assert_frame_equal(batched, expected, atol=1e-5, rtol=0)


def test_short_memory_splits_the_forward_into_batches(toy, monkeypatch) -> None:
    from moescope._util import memory
    from moescope.explore.sequential import largest_layer_bytes

    model, tok = toy
    expected = original_accuracy(model, tok, ("add2", "rev"), n_prompts=4)
    forwards: list[int] = []
    handle = model.register_forward_pre_hook(lambda *_: forwards.append(1))
    monkeypatch.setattr(memory, "available_memory", lambda: largest_layer_bytes(model) + 2_000_000)
    try:
        got = original_accuracy(model, tok, ("add2", "rev"), n_prompts=4)
    finally:
        handle.remove()
    assert 1 < len(forwards) <= 8
    pd.testing.assert_frame_equal(got, expected, atol=1e-6, rtol=0)
