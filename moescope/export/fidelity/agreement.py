"""Next-token agreement of two models on the same tokens: held-out batches, KL, top-1, perplexity.

Shared by :mod:`moescope.export.fidelity.measure` (proxy vs original on held-out data) and
:mod:`moescope.export.healing` (the distillation loss, and the KL before and after). Batches are
right-padded with an attention mask; task batches also say which tokens are ``scored`` (the
answer and end-of-sequence), since the toy learned those and its predictions inside a random
prompt are arbitrary.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from moescope.errors import MoescopeError
from moescope.explore.calibration import TASKS, calibration_batches, check_budget, pad_scored
from moescope.explore.routing import observe_routing
from moescope.explore.stats import RoutingStats
from moescope.models.lm_head import head_input, head_rows, head_runs_apart, own_forward
from moescope.models.resident import execution_device, resident
from moescope.models.tasks import HELDOUT_MAX, TASK_FAMILIES, Example, heldout

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Batch = dict[str, torch.Tensor]


def heldout_batches(
    data: Any = TASKS,
    tokenizer: Any = None,
    *,
    n_tokens: int = 8192,
    batch_size: int = 16,
    seq_len: int = 128,
    seed: int = 0,
) -> list[Batch]:
    """Held-out token batches (right-padded, with attention masks) holding ``n_tokens`` real tokens.

    ``"tasks"`` means the held-out pool of every family, interleaved so any budget covers all
    families alike, with only the answer and end-of-sequence tokens scored (the toy learned
    those; its predictions inside a random prompt are arbitrary). Anything else is read as
    calibration data (a ``.txt`` / ``.jsonl`` path or token ids, see
    :func:`moescope.explore.routing.calibration_batches`), every token scored, and must be held out by
    the caller.
    """
    if isinstance(data, str) and data == TASKS:
        pools = [heldout(task, HELDOUT_MAX) for task in TASK_FAMILIES]
        examples = [ex for group in zip(*pools, strict=True) for ex in group]
        return list(task_batches(examples, tokenizer, n_tokens=n_tokens, batch_size=batch_size))
    return list(
        calibration_batches(
            data, tokenizer, n_tokens=n_tokens, batch_size=batch_size, seq_len=seq_len, seed=seed
        )
    )


def merge_batches(batches: Sequence[Batch], rows: int) -> list[Batch]:
    """Consecutive ``batches`` joined into batches of at most ``rows`` rows, each right-padded to
    the longest (masked, unscored): the same rows and scored tokens in fewer forwards, for a
    model that reads its checkpoint on every forward."""
    merged: list[Batch] = []
    for batch in batches:
        if merged and len(merged[-1]["input_ids"]) + len(batch["input_ids"]) <= rows:
            merged[-1] = _joined(merged[-1], batch)
        else:
            merged.append(dict(batch))
    return merged


def _joined(a: Batch, b: Batch) -> Batch:
    width = max(a["input_ids"].shape[1], b["input_ids"].shape[1])

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]))  # 0: masked, unscored

    return {key: torch.cat([padded(a[key]), padded(b[key])]) for key in a}


def task_batches(
    examples: Iterable[Example], tokenizer: Any, *, n_tokens: int, batch_size: int
) -> Iterator[Batch]:
    """Rows of ``prompt + answer + end-of-sequence``, right-padded, until ``n_tokens`` real tokens.

    Besides ``input_ids`` and ``attention_mask`` each batch has ``scored`` ``(B, T)``: the
    answer and end-of-sequence tokens, the positions a next-token figure is taken at.
    """
    if tokenizer is None:
        raise MoescopeError("task data needs the model's tokenizer; pass tokenizer=.")
    check_budget(n_tokens, batch_size, 1)
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    examples, left = iter(examples), n_tokens
    while left > 0 and (chunk := list(itertools.islice(examples, batch_size))):
        prompts = tokenizer([ex.prompt for ex in chunk])["input_ids"]
        answers = tokenizer([ex.answer for ex in chunk], add_special_tokens=False)["input_ids"]
        rows = [(p, a + eos) for p, a in zip(prompts, answers, strict=True)]
        left -= sum(len(p) + len(a) for p, a in rows)
        yield pad_scored(rows, tokenizer.pad_token_id or 0)


@dataclass
class _Sums:
    """Running sums over predicted positions, in float64."""

    tokens: int = 0
    kl: float = 0.0
    agree: int = 0
    nll_original: float = 0.0
    nll_proxy: float = 0.0

    def add(self, log_p: torch.Tensor, log_q: torch.Tensor, target: torch.Tensor) -> None:
        """``log_p``, ``log_q``: ``(N, V)`` log-probabilities of original and proxy; ``target`` ``(N,)``."""
        # Per-position KL is clamped at 0: float32 rounding may leave a -1e-9 on a perfect match.
        self.kl += float(_kl(log_p, log_q).clamp(min=0).double().sum())
        self.agree += int((log_p.argmax(-1) == log_q.argmax(-1)).sum())
        picked = target.unsqueeze(-1)
        self.nll_original -= float(log_p.gather(-1, picked).double().sum())
        self.nll_proxy -= float(log_q.gather(-1, picked).double().sum())
        self.tokens += int(target.numel())

    def figures(self) -> dict[str, Any]:
        n = max(self.tokens, 1)
        ppl_o, ppl_p = math.exp(self.nll_original / n), math.exp(self.nll_proxy / n)
        return {
            "n_tokens": self.tokens,
            "kl": self.kl / n,
            "top1_agreement": self.agree / n,
            "perplexity_original": ppl_o,
            "perplexity_proxy": ppl_p,
            "perplexity_ratio": ppl_p / ppl_o,
        }


@contextmanager
def evaluating(*models: torch.nn.Module) -> Iterator[None]:
    """Eval mode and no gradients inside; each model's training flag is restored after."""
    flags = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        with torch.no_grad():
            yield
    finally:
        for m, flag in zip(models, flags, strict=True):
            m.train(flag)


def _log_probs(model: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """``(B, T-1, V)`` float32 next-token log-probabilities at every position but the last."""
    device = execution_device(model)  # a layer-sequential original's first weight is on meta
    inputs = {key: batch[key].to(device) for key in ("input_ids", "attention_mask")}
    return torch.log_softmax(model(**inputs, use_cache=False).logits[:, :-1].float(), dim=-1)


def _targets(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, T-1)``: which positions are scored (every real next token, unless the batch says
    ``scored``; rows are right-padded) and the next tokens."""
    scored = batch.get("scored", batch["attention_mask"].bool())
    return scored[:, 1:], batch["input_ids"][:, 1:]


def scored_log_probs(model: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """``(N, V)`` float32 next-token log-probabilities of ``model`` at the batch's N scored positions."""
    valid, _ = _targets(batch)
    log_q = _log_probs(model, batch)
    return log_q[valid.to(log_q.device)]


def _scored(
    original: PreTrainedModel, proxy: PreTrainedModel, batch: Batch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(N, V)`` log-probabilities of original (no gradient) and proxy at the N scored
    positions, and the ``(N,)`` next tokens there."""
    valid, target = _targets(batch)
    with torch.no_grad():
        log_p = _log_probs(original, batch)
    log_q = _log_probs(proxy, batch).to(log_p.device)
    valid = valid.to(log_p.device)
    return log_p[valid], log_q[valid], target.to(log_p.device)[valid]


# Bytes per position and vocabulary entry that scoring a row holds: both models' logits, their
# float32 log-softmax and the scored rows of each, and the KL's three temporaries.
SCORED_BYTES = 40


def _scored_parts(
    original: PreTrainedModel, proxy: PreTrainedModel, batch: Batch
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """:func:`_scored` of ``batch``; where a model's LM head runs apart (a layer-sequential
    original, or proxy, :func:`~moescope.models.lm_head.head_runs_apart`), in chunks of rows:
    one forward of that model to its head over every row (one read of its checkpoint), then
    each chunk's logits of both models, so a forward's size is set by the rows' hidden states
    and a chunk's by their logits."""
    models = (original, proxy)
    if not any(head_runs_apart(model) for model in models):
        yield _scored(original, proxy, batch)
        return
    width = batch["input_ids"].shape[1]
    rows = min(head_rows(model, width, SCORED_BYTES) for model in models if head_runs_apart(model))
    with ExitStack() as held:
        original_logits, proxy_logits = (_logits_of_rows(model, batch, held) for model in models)
        for start in range(0, len(batch["input_ids"]), rows):
            part = {key: value[start : start + rows] for key, value in batch.items()}
            valid, target = _targets(part)
            log_p = original_logits(part, start)
            log_q = proxy_logits(part, start).to(log_p.device)
            valid = valid.to(log_p.device)
            yield log_p[valid], log_q[valid], target.to(log_p.device)[valid]


def _logits_of_rows(
    model: PreTrainedModel, batch: Batch, held: ExitStack
) -> Callable[[Batch, int], torch.Tensor]:
    """``(part, start) → (rows, T-1, V)`` float32 next-token log-probabilities of ``model`` on
    the rows of ``batch`` from ``start``: where its head runs apart, from the head's input of
    every row (one forward, now) through its head (read at the first part, in memory until
    ``held`` closes, so never beside the other model's forward); else a forward of the part."""
    if not head_runs_apart(model):
        return lambda part, _: _log_probs(model, part)
    device = execution_device(model)
    hidden = head_input(model, {key: batch[key].to(device) for key in ("input_ids", "attention_mask")})
    head = model.get_output_embeddings()
    load_head = functools.cache(lambda: held.enter_context(resident(head)))  # at the first part only

    def log_probs(part: Batch, start: int) -> torch.Tensor:
        load_head()
        logits = own_forward(head)(hidden[start : start + len(part["input_ids"])])
        return torch.log_softmax(logits[:, :-1].float(), dim=-1)

    return log_probs


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``(N,)`` ``KL(p ‖ q)`` per position."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def kl_loss(original: PreTrainedModel, proxy: PreTrainedModel, batch: Batch) -> torch.Tensor:
    """Mean next-token ``KL(original ‖ proxy)`` over the batch's scored positions, with gradients
    through the proxy only: the distillation loss of :func:`moescope.export.healing.heal`."""
    log_p, log_q, _ = _scored(original, proxy, batch)
    return _kl(log_p, log_q).mean()


def next_token_agreement(
    original: PreTrainedModel,
    proxy: PreTrainedModel,
    batches: Sequence[Batch],
    *,
    observe: bool = False,
) -> tuple[dict[str, Any], tuple[RoutingStats, RoutingStats] | None]:
    """KL, top-1 agreement and perplexities of ``proxy`` against ``original`` over ``batches``.

    With ``observe``, also the routing statistics of both models from the same forward passes
    (no second pass), as ``(original, proxy)``.
    """
    sums = _Sums()
    with ExitStack() as stack, evaluating(original, proxy):
        observers = [stack.enter_context(observe_routing(m)) for m in (original, proxy)] if observe else []
        for batch in batches:
            for scored in _scored_parts(original, proxy, batch):
                sums.add(*scored)
        stats = tuple(observer.stats() for observer in observers)
    return sums.figures(), (stats if observe else None)  # type: ignore[return-value]
