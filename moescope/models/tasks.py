"""The synthetic verifiable task suite: generators, a fixed held-out set and the exact-match scorer.

The toy model is trained on these tasks, and the RL replay later uses the same generators as
prompts and :func:`score` as the reward, so training, evaluation and RL agree on one definition
of "correct". Everything here is pure Python (no torch), deterministic under a seed, and the
held-out prompts of each family never appear in its training stream.

Each example is ``prompt + answer``: the model reads ``prompt`` (ending in ``=``) and must
generate ``answer`` followed by end-of-sequence. All characters belong to :data:`ALPHABET`.

Example
-------
>>> ex = heldout("add2", n=1)[0]
>>> score(ex, ex.answer), score(ex, ex.answer + "0")
(1.0, 0.0)
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache

from moescope.errors import MoescopeError

ALPHABET = "0123456789+-=:" + string.ascii_lowercase
"""Every character a prompt or an answer may contain (the toy tokenizer's vocabulary)."""

HELDOUT_MAX = 500
"""Size of the reserved held-out pool per family; ``heldout(task, n)`` returns its first ``n``."""

_LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class Example:
    """One task instance: the model sees ``prompt`` and must produce ``answer``.

    Attributes
    ----------
    task : str
        Family name, one of :data:`TASK_FAMILIES`.
    prompt : str
        Input text, ending in ``=``.
    answer : str
        The single correct completion (without end-of-sequence).
    """

    task: str
    prompt: str
    answer: str


@dataclass(frozen=True)
class _Family:
    sample: Callable[[random.Random], tuple[str, str]]  # rng -> (prompt, answer)
    max_answer_chars: int


def _add(lo: int, hi: int) -> Callable[[random.Random], tuple[str, str]]:
    # Most significant digit first: the hard direction for a left-to-right model (carries
    # must be anticipated), which is what keeps add3 between "never" and "always".
    def sample(rng: random.Random) -> tuple[str, str]:
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return f"{a}+{b}=", str(a + b)

    return sample


def _letters(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(lo, hi)))


def _string_task(tag: str, fn: Callable[[str], str]) -> Callable[[random.Random], tuple[str, str]]:
    # Letter strings give the router a wider token vocabulary than digits alone.
    def sample(rng: random.Random) -> tuple[str, str]:
        s = _letters(rng, 4, 12)
        return f"{tag}:{s}=", fn(s)

    return sample


_FAMILIES: dict[str, _Family] = {
    "add2": _Family(_add(10, 99), 3),
    "add3": _Family(_add(100, 999), 4),
    "copy": _Family(_string_task("cpy", lambda s: s), 12),
    "rev": _Family(_string_task("rev", lambda s: s[::-1]), 12),
    "sort": _Family(_string_task("srt", lambda s: "".join(sorted(s))), 12),
}

TASK_FAMILIES: tuple[str, ...] = tuple(_FAMILIES)
"""Names of the task families, in a fixed order."""


def _family(task: str) -> _Family:
    try:
        return _FAMILIES[task]
    except KeyError:
        raise MoescopeError(f"Unknown task {task!r}; choose one of {', '.join(TASK_FAMILIES)}.") from None


def check_tasks(tasks: Sequence[str] | None) -> tuple[str, ...]:
    """Validate task names, defaulting to every family.

    Raises
    ------
    MoescopeError
        If a name is not in :data:`TASK_FAMILIES`, or the list is empty.
    """
    if tasks is None:
        return TASK_FAMILIES
    if isinstance(tasks, str):
        tasks = (tasks,)
    for t in tasks:
        _family(t)
    if not tasks:
        raise MoescopeError(f"No task given; choose from {', '.join(TASK_FAMILIES)}.")
    return tuple(tasks)


def family_names(text: str) -> tuple[str, ...] | None:
    """The task families a command-line value such as ``add2,add3`` names, or ``None`` when it
    names something else (``toy``, a prompt file): the one place a flag tells the two apart."""
    names = tuple(part.strip() for part in text.split(","))
    return names if all(name in _FAMILIES for name in names) else None


def max_answer_chars(task: str) -> int:
    """Longest possible answer of ``task``, in characters: the generation budget for evaluation."""
    return _family(task).max_answer_chars


@cache
def _heldout_pool(task: str) -> tuple[Example, ...]:
    # A string seed is hashed with SHA-512 by `random`, so the pool is identical in every
    # process and Python version; distinct prompts make per-prompt accuracy meaningful.
    rng = random.Random(f"moescope-heldout:{task}")
    fam, seen, pool = _family(task), set(), []
    while len(pool) < HELDOUT_MAX:
        prompt, answer = fam.sample(rng)
        if prompt not in seen:
            seen.add(prompt)
            pool.append(Example(task, prompt, answer))
    return tuple(pool)


@cache
def _heldout_prompts(task: str) -> frozenset[str]:
    return frozenset(ex.prompt for ex in _heldout_pool(task))


def heldout(task: str, n: int = 200) -> list[Example]:
    """The fixed held-out examples of ``task``: the first ``n`` of a reserved pool.

    The pool (:data:`HELDOUT_MAX` distinct prompts) is excluded from every training stream, so
    accuracy on it measures generalisation, not memory.

    Raises
    ------
    MoescopeError
        If ``task`` is unknown or ``n`` is outside ``1..HELDOUT_MAX``.
    """
    pool = _heldout_pool(task)
    if not 1 <= n <= HELDOUT_MAX:
        raise MoescopeError(f"The held-out set holds 1 to {HELDOUT_MAX} examples per task, not {n}.")
    return list(pool[:n])


def _train_stream(task: str, rng: random.Random) -> Iterator[Example]:
    fam, reserved = _family(task), _heldout_prompts(task)
    while True:
        prompt, answer = fam.sample(rng)
        if prompt not in reserved:  # rejection keeps the held-out pool unseen
            yield Example(task, prompt, answer)


def make_examples(task: str, n: int, *, seed: int) -> list[Example]:
    """Draw ``n`` training examples of ``task`` (with replacement), never a held-out prompt.

    Parameters
    ----------
    task : str
        Family name.
    n : int
        Number of examples.
    seed : int
        Same seed, same examples; different tasks with one seed are independent streams.
    """
    rng = random.Random(f"moescope-train:{task}:{seed}")
    return list(itertools.islice(_train_stream(task, rng), n))


def mixed_examples(tasks: Sequence[str] | None = None, *, seed: int) -> Iterator[Example]:
    """An endless training stream that picks the family uniformly at random for each example.

    Used to train the toy model (every batch mixes families) and to draw RL prompts.
    """
    names = check_tasks(tasks)
    rng = random.Random(f"moescope-mixed:{','.join(names)}:{seed}")
    streams = {t: _train_stream(t, rng) for t in names}
    while True:
        yield next(streams[rng.choice(names)])


def score(example: Example, completion: str) -> float:
    """Exact-match reward: 1.0 if ``completion`` is the answer, else 0.0.

    ``completion`` is the decoded text generated after the prompt with special tokens removed;
    surrounding whitespace is ignored, anything else (an extra digit, a missing letter) is wrong.
    """
    return 1.0 if completion.strip() == example.answer else 0.0
