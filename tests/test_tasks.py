from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from moescope.errors import MoescopeError
from moescope.models import tasks
from moescope.models.tasks import ALPHABET, HELDOUT_MAX, TASK_FAMILIES, Example, heldout, make_examples, score


@pytest.mark.parametrize("task", TASK_FAMILIES)
def test_generators_are_deterministic_under_a_seed(task: str) -> None:
    assert make_examples(task, 50, seed=3) == make_examples(task, 50, seed=3)
    assert make_examples(task, 50, seed=3) != make_examples(task, 50, seed=4)
    assert heldout(task, 20) == heldout(task, 20)


@pytest.mark.parametrize("task", TASK_FAMILIES)
def test_heldout_is_disjoint_from_training(task: str) -> None:
    reserved = {ex.prompt for ex in heldout(task, HELDOUT_MAX)}
    assert len(reserved) == HELDOUT_MAX  # distinct prompts
    train = make_examples(task, 20_000, seed=0)
    assert not reserved & {ex.prompt for ex in train}
    mixed = itertools.islice(tasks.mixed_examples(seed=0), 20_000)
    assert not any(ex.prompt in reserved for ex in mixed if ex.task == task)


def test_heldout_prefixes_are_stable() -> None:
    # heldout(n) is the first n of one pool, so a small evaluation is a subset of a larger one
    assert heldout("add3", 200)[:50] == heldout("add3", 50)
    with pytest.raises(MoescopeError, match="held-out"):
        heldout("add3", HELDOUT_MAX + 1)


@pytest.mark.parametrize("task", TASK_FAMILIES)
def test_examples_are_well_formed_and_correct(task: str) -> None:
    for ex in make_examples(task, 200, seed=1) + heldout(task, 200):
        assert ex.task == task and ex.prompt.endswith("=")
        assert set(ex.prompt + ex.answer) <= set(ALPHABET)
        assert 1 <= len(ex.answer) <= tasks.max_answer_chars(task)
        assert score(ex, ex.answer) == 1.0


def test_answers_match_their_definitions() -> None:
    a, b = heldout("add3", 1)[0].prompt[:-1].split("+")
    assert heldout("add3", 1)[0].answer == str(int(a) + int(b))
    rev = heldout("rev", 1)[0]
    assert rev.answer == rev.prompt[4:-1][::-1]
    srt = heldout("sort", 1)[0]
    assert srt.answer == "".join(sorted(srt.prompt[4:-1]))


def test_mixed_stream_covers_every_family_about_uniformly() -> None:
    counts = {t: 0 for t in TASK_FAMILIES}
    for ex in itertools.islice(tasks.mixed_examples(seed=0), 5000):
        counts[ex.task] += 1
    expected = 5000 / len(TASK_FAMILIES)
    assert all(abs(c - expected) < 0.15 * expected for c in counts.values())
    only = {ex.task for ex in itertools.islice(tasks.mixed_examples(["add2", "rev"], seed=0), 100)}
    assert only == {"add2", "rev"}


@pytest.mark.parametrize(
    ("completion", "reward"),
    [("579", 1.0), (" 579\n", 1.0), ("5790", 0.0), ("57", 0.0), ("", 0.0), ("579<eos>", 0.0)],
)
def test_score_is_exact_match(completion: str, reward: float) -> None:
    assert score(Example("add3", "123+456=", "579"), completion) == reward


def test_unknown_task_names_the_valid_ones() -> None:
    with pytest.raises(MoescopeError, match="add2, add3"):
        make_examples("mul", 3, seed=0)
    with pytest.raises(MoescopeError, match="Unknown task"):
        list(itertools.islice(tasks.mixed_examples(["add2", "nope"], seed=0), 1))


def test_import_stays_free_of_torch() -> None:
    # pure Python, so the RL reward and the command line can score without loading torch
    code = "import sys, moescope.models.tasks; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
