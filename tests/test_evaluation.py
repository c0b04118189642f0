from __future__ import annotations

import math

import pytest
import torch

from moescope.errors import MoescopeError
from moescope.models.evaluation import (
    TaskAccuracy,
    TaskResult,
    decode_completions,
    evaluate_tasks,
    generate_answers,
)
from moescope.models.tasks import heldout, score
from moescope.models.toy import load_toy


@pytest.fixture(scope="module")
def toy():
    return load_toy()


def _accuracy() -> TaskAccuracy:
    results = (TaskResult("add2", 10, 0.9, 0.75, 0.4), TaskResult("rev", 10, 1.0, 0.95, 0.1))
    return TaskAccuracy(results, samples=4, temperature=1.0, seed=0)


def test_frame_is_long_form_with_one_row_per_task_and_mode() -> None:
    frame = _accuracy().to_frame()
    assert frame.columns.tolist() == ["task", "mode", "accuracy", "mixed", "n"]
    assert frame[["task", "mode"]].values.tolist() == [
        ["add2", "greedy"],
        ["add2", "sampled"],
        ["rev", "greedy"],
        ["rev", "sampled"],
    ]
    assert math.isnan(frame["mixed"][0]) and frame["mixed"][1] == 0.4


def test_save_load_round_trip(tmp_path) -> None:
    acc = _accuracy()
    assert TaskAccuracy.load(acc.save(tmp_path / "acc.json")) == acc
    assert acc["rev"].greedy == 1.0 and acc.tasks == ("add2", "rev")


def test_decode_stops_at_eos_and_keeps_stray_specials(toy) -> None:
    _, tok = toy
    ids = torch.tensor([[*tok("57", add_special_tokens=False).input_ids, tok.eos_token_id, 5, 0]])
    assert decode_completions(tok, ids) == ["57"]
    stray = torch.tensor([[*tok("5", add_special_tokens=False).input_ids, tok.bos_token_id, 9]])
    assert score(heldout("add2", 1)[0], decode_completions(tok, stray)[0]) == 0.0
    assert "<bos>" in decode_completions(tok, stray)[0]


def test_left_padded_batches_answer_like_single_prompts(toy) -> None:
    # padding must not change what the model says, or the batch size would change the reward
    model, tok = toy
    examples = heldout("add3", 6) + heldout("sort", 6)  # prompt lengths 9 to 17
    batched = generate_answers(model, tok, examples, batch_size=12, do_sample=False)
    assert batched == [generate_answers(model, tok, [ex], do_sample=False)[0] for ex in examples]
    assert sum(score(ex, a) for ex, a in zip(examples, batched, strict=True)) > 0


def test_sampling_is_deterministic_under_a_seed_and_restores_mode(toy) -> None:
    model, tok = toy
    model.train()
    a = evaluate_tasks(model, tok, ["add3"], n=16, samples=4, seed=1)
    assert model.training  # an RL loop calling evaluate mid-run keeps its mode
    model.eval()
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    assert evaluate_tasks(model, tok, ["add3"], n=16, samples=4, seed=1) == a
    assert torch.rand(1) == before  # the caller's random stream is untouched
    # per-task seeds: a task's figures do not depend on its companions
    assert evaluate_tasks(model, tok, ["add2", "add3"], n=16, samples=4, seed=1)["add3"] == a["add3"]


def test_unknown_task_is_a_user_error(toy) -> None:
    model, tok = toy
    with pytest.raises(MoescopeError, match="Unknown task"):
        evaluate_tasks(model, tok, ["mul"], n=4)
