"""The RL prompt stream: which prompts, in which order, a replay trains on.

One deterministic stream per source and seed, shared by the replay (its step ``s`` takes the
stream's prompts ``[s * P, (s + 1) * P)``, :func:`moescope.replay.data.prompt_schedule`) and by
the export's ``"rl"`` calibration (:mod:`moescope.explore.rl_data`), which routes the replay's
own first prompts. The task suite's source is its mixed training stream (never a held-out
prompt); a JSON Lines file of prompts is shuffled once per epoch with the seed.

Example
-------
>>> import itertools
>>> [ex.task for ex in itertools.islice(prompt_stream(("add2", "rev"), seed=0), 4)]
['add2', 'rev', 'add2', 'rev']
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence

from moescope.models.accuracy import TaskSpec, is_prompt_file, load_prompts, named_families
from moescope.models.tasks import Example, check_tasks, max_answer_chars, mixed_examples

FILE_ANSWER_TOKENS = 32
"""New tokens a completion of a prompt file's prompt may take (the task suite bounds its own)."""


def prompt_stream(source: TaskSpec = None, *, seed: int) -> Iterator[Example]:
    """The endless prompt stream of ``source``: the task suite (``None``, ``"toy"``, ``()``: every
    family; family names: those) or a ``.jsonl`` file of prompts, epoch after epoch."""
    if is_prompt_file(source):
        return _file_stream(load_prompts(source), seed)  # type: ignore[arg-type]
    return mixed_examples(_families(source), seed=seed)


def answer_budget(source: TaskSpec = None) -> int:
    """New tokens a sampled completion may take: the longest answer of the task suite's families
    plus end-of-sequence, or :data:`FILE_ANSWER_TOKENS` for a prompt file."""
    if is_prompt_file(source):
        return FILE_ANSWER_TOKENS
    return max(max_answer_chars(task) for task in check_tasks(_families(source))) + 1


def _families(source: TaskSpec) -> tuple[str, ...] | None:
    source = named_families(source)
    if source is None or source == "toy" or not len(source):  # type: ignore[arg-type]
        return None
    return check_tasks(source)  # type: ignore[arg-type]


def _file_stream(examples: Sequence[Example], seed: int) -> Iterator[Example]:
    for epoch in itertools.count():
        order = list(examples)
        random.Random(f"moescope-replay:{seed}:{epoch}").shuffle(order)
        yield from order
