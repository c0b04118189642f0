"""Reward functions: ``(example, completion) -> float``, chosen by name or passed in.

``exact`` is the task suite's own scorer (the stripped completion equals the answer);
``numeric`` compares the first number in the completion with the answer's number (so ``" 42."``
scores for ``42``); ``regex`` treats the answer as a pattern the stripped completion must fully
match. A user function that raises stops the replay with one sentence naming the prompt.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from moescope._util.numbers import DECIMAL
from moescope.errors import MoescopeError
from moescope.models.tasks import Example, score

RewardFn = Callable[[Example, str], float]

_NUMBER = re.compile(rf"[-+]?{DECIMAL}")


def exact_match(example: Example, completion: str) -> float:
    """1.0 when the stripped completion is the answer, else 0.0."""
    return score(example, completion)


def numeric(example: Example, completion: str) -> float:
    """1.0 when the first number in the completion equals the answer's (relative tolerance 1e-9)."""
    want, got = _NUMBER.search(example.answer), _NUMBER.search(completion)
    if want is None or got is None:
        return 0.0
    return 1.0 if math.isclose(float(want.group()), float(got.group()), rel_tol=1e-9) else 0.0


def regex(example: Example, completion: str) -> float:
    """1.0 when the stripped completion fully matches the answer read as a regular expression."""
    return 1.0 if re.fullmatch(example.answer, completion.strip()) else 0.0


REWARD_FUNCTIONS: dict[str, RewardFn] = {"exact": exact_match, "numeric": numeric, "regex": regex}


def reward_function(reward: str | RewardFn) -> RewardFn:
    """The named reward, or ``reward`` itself when it is already a function."""
    if callable(reward):
        return reward
    if reward not in REWARD_FUNCTIONS:
        raise MoescopeError(
            f"Unknown reward {reward!r}; use one of {', '.join(REWARD_FUNCTIONS)} or pass a function."
        )
    return REWARD_FUNCTIONS[reward]


def score_all(fn: RewardFn, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
    """Rewards for aligned examples and completions; a failing or non-numeric reward is bad input."""
    name = getattr(fn, "__name__", repr(fn))
    out = []
    for ex, text in zip(examples, completions, strict=True):
        try:
            value = float(fn(ex, text))
        except Exception as err:
            raise MoescopeError(
                f"Reward function {name} raised {type(err).__name__} ({err}) on prompt {ex.prompt!r}; "
                "fix the function so it returns a number for every completion."
            ) from None
        out.append(value)
    return out
