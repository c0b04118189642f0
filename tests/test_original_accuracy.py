"""The original's accuracy from few reads of the model: the estimators, their record, a given figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from moescope.errors import MoescopeError
from moescope.explore.sequential import layer_sequential
from moescope.export.fidelity.original import answer_log_probs, original_accuracy
from moescope.export.fidelity.original_record import (
    OriginalAccuracy,
    cached_original_accuracy,
    parse_original_accuracy,
)
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


# --- the record ------------------------------------------------------------------------------------


def test_the_record_is_reused_for_the_same_measurement_only(toy, tmp_path: Path) -> None:
    model, tok = toy
    path = tmp_path / "original_accuracy.json"
    first, reused = cached_original_accuracy(path, model, tok, ("add2",), n_prompts=3)
    assert not reused and path.is_file()
    pd.testing.assert_frame_equal(first.to_frame(), original_accuracy(model, tok, ("add2",), n_prompts=3))
    again, reused = cached_original_accuracy(path, model, tok, ("add2",), n_prompts=3, seed=7)
    assert reused  # teacher-forced draws nothing: the seed does not change its figure
    pd.testing.assert_frame_equal(again.to_frame(), first.to_frame())
    assert math.isnan(OriginalAccuracy.load(path).to_frame()["mixed"][0])  # greedy's NaN survives JSON
    for changed in ({"n_prompts": 4}, {"method": "sampled"}, {"samples": 2}):
        _, reused = cached_original_accuracy(path, model, tok, ("add2",), **{"n_prompts": 3, **changed})
        assert not reused, changed
        cached_original_accuracy(path, model, tok, ("add2",), n_prompts=3)
    _, reused = cached_original_accuracy(path, model, tok, ("add3",), n_prompts=3)
    assert not reused
    lines = heldout("add2", 2)  # a prompt file: no seed nor samples, so only the estimator differs
    assert not cached_original_accuracy(path, model, tok, lines)[1]
    assert not cached_original_accuracy(path, model, tok, lines, method="sampled")[1]
    assert cached_original_accuracy(path, model, tok, lines, method="sampled", samples=9, seed=9)[1]


def test_another_model_or_a_damaged_record_is_measured_again(toy, tmp_path: Path) -> None:
    model, tok = toy
    path = tmp_path / "original_accuracy.json"
    cached_original_accuracy(path, model, tok, ("add2",), n_prompts=2)
    other, other_tok = load_model("toy-v3")
    record, reused = cached_original_accuracy(path, other, other_tok, ("add2",), n_prompts=2)
    assert not reused and OriginalAccuracy.load(path).measurement == record.measurement
    path.write_text("{not json")
    assert not cached_original_accuracy(path, other, other_tok, ("add2",), n_prompts=2)[1]


# --- a given figure --------------------------------------------------------------------------------


def test_a_given_figure_becomes_the_frame_the_check_compares() -> None:
    overall = parse_original_accuracy(" 0.83 ", ("add2", "add3"), n_prompts=50)
    assert overall["mode"].tolist() == ["greedy", "sampled"] * 2 and overall["n"].tolist() == [50] * 4
    assert overall.loc[overall["mode"] == "sampled", "accuracy"].tolist() == [0.83, 0.83]
    per_task = parse_original_accuracy("add3=0.7, add2=0", ("add2", "add3"))
    assert per_task.loc[per_task["mode"] == "sampled", "accuracy"].tolist() == [0.0, 0.7]
    lines = [Example("a", "x", "y"), Example("b", "x", "y"), Example("a", "z", "y")]
    given = parse_original_accuracy("a=0.5,b=1", lines)
    assert given[["task", "mode", "accuracy", "n"]].values.tolist() == [
        ["a", "greedy", 0.5, 2],
        ["b", "greedy", 1.0, 1],
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (" ", "is empty"),
        ("0.8,", "empty part"),
        ("high", "not a number"),
        ("83", "outside 0 to 1"),
        ("-0.1", "outside 0 to 1"),
        ("nan", "outside 0 to 1"),
        ("add2=1.5,add3=0.5", "add2=1.5 is outside 0 to 1"),
        ("add2=0.9,add4=0.5", "names add4, not among the measured tasks (add2, add3)"),
        ("add2=0.9", "no share for add3"),
        ("add2=0.9,0.5", "'0.5' names no task"),
        ("add2=0.9,add2=0.8", "gives add2 twice"),
        ("0", "solves none of the tasks"),
        ("add2=0,add3=0", "solves none of the tasks"),
    ],
)
def test_a_bad_given_figure_is_one_sentence_with_the_fix(text: str, says: str) -> None:
    with pytest.raises(MoescopeError) as err:
        parse_original_accuracy(text, ("add2", "add3"))
    message = str(err.value)
    assert says in message and "\n" not in message and message.count("; ") == 1 and message.endswith(".")
