"""Which prompts each RL step sees: a fixed schedule, the same on every model, rank and resume.

Step ``s`` takes prompts ``[s * P, (s + 1) * P)`` of one deterministic stream: the toy task
suite's mixed training stream (never a held-out prompt) or a JSONL file shuffled once per epoch
with the seed. Because the schedule depends only on the config, the original and the proxy see
the same data in the same order, and a resumed run sees what the killed one would have.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from moescope.models.prompts import FILE_ANSWER_TOKENS, prompt_stream
from moescope.models.tasks import Example, max_answer_chars
from moescope.replay.config import ReplayConfig

DEFAULT_MAX_NEW_TOKENS = FILE_ANSWER_TOKENS


def prompt_schedule(config: ReplayConfig) -> list[list[Example]]:
    """``steps`` lists of ``prompts_per_step`` examples."""
    n, per = config.steps * config.prompts_per_step, config.prompts_per_step
    source = config.tasks if config.prompts == "toy" else config.prompts
    stream = list(itertools.islice(prompt_stream(source, seed=config.seed), n))
    return [stream[i : i + per] for i in range(0, n, per)]


def max_new_tokens(config: ReplayConfig, schedule: Sequence[Sequence[Example]]) -> int:
    """The generation budget: as configured, else the longest toy answer + 1 (end of sequence)."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    if config.prompts == "toy":
        return max(max_answer_chars(ex.task) for step in schedule for ex in step) + 1
    return DEFAULT_MAX_NEW_TOKENS
