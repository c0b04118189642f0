"""How the trainer's side comes to differ from the rollout's when routing replay does not help:
the faults users of verl, slime, NeMo-RL and prime-rl report (:mod:`moescope.replay.faults`),
and the masks they reach for beyond importance-sampling correction.

- :func:`drifted`: the ``engine_drift`` fault's rollout log-probs, offset by seeded noise whose
  scale grows every faulted step;
- :func:`combined_in`: the ``parallel_reduction`` fault, every MoE layer's routed output rounded
  to another precision in the trainer's passes (the combine reduced otherwise), router untouched;
- :func:`stale`: the ``stale_routes`` fault's replayed routes, shifted by a token or the previous
  step's;
- :func:`mismatch_keep`: ``is_mask`` (tokens outside ratio bounds, IcePop-style) and
  ``seq_kl_mask`` (responses above a KL bound), as 0/1 weights of the loss.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from moescope.models.view import MoEModel
from moescope.replay.faults import Fault
from moescope.replay.losses import k3_kl
from moescope.replay.precision import DTYPES


def drifted(roll: torch.Tensor, fault: Fault, step: int, seed: int) -> torch.Tensor:
    """The rollout's log-probs ``roll`` ``(N, L)`` offset per token by standard normal noise times
    ``ARG × (faulted steps so far)``: a gap that grows step by step (vime#64), seeded by the run's
    seed, the step and the batch's shape, so a rerun drifts alike."""
    scale = float(fault.arg) * (step - fault.step + 1)
    gen = torch.Generator().manual_seed(zlib.crc32(f"drift:{seed}:{step}:{tuple(roll.shape)}".encode()))
    noise = torch.randn(roll.shape, generator=gen, dtype=torch.float32)
    return roll + scale * noise.to(roll.device, roll.dtype)


@contextmanager
def combined_in(moe: MoEModel, precision: str) -> Iterator[None]:
    """Every MoE layer's routed-expert output rounded to ``precision`` (the weighted sum over the
    top-k reduced in it, as another expert-parallel layout does); the router is not touched."""
    dtype = DTYPES[precision]

    def hook(module: torch.nn.Module, args: object, out: object) -> object:
        return on_output(out, lambda t: t.to(dtype).to(t.dtype))

    with ExitStack() as stack:
        for layer in moe.layers:
            stack.callback(layer.experts.register_forward_hook(hook).remove)
        yield


def on_output(out: Any, change: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A module's output with ``change`` applied to its floating-point tensor: the output itself,
    or the first item of a tuple (blocks that also return router logits), the rest kept."""
    if torch.is_tensor(out):
        return change(out) if out.is_floating_point() else out
    if isinstance(out, tuple) and out:
        return (on_output(out[0], change), *out[1:])
    return out


def stale(
    routes: list[torch.Tensor], shape: tuple[int, int], how: str, previous: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    """The routes a wrongly wired replay hands the trainer, per MoE application ``(N·L, k)``:
    ``shift``: each token gets the route of the token before it in its row (the first keeps its
    own); ``step``: the routes recorded at the previous step, token by token in order (cycled
    over this batch's tokens, its shape being another)."""
    n, width = shape
    if how == "shift":
        out = []
        for r in routes:
            rows = r.reshape(n, width, -1)
            out.append(torch.cat([rows[:, :1], rows[:, :-1]], 1).reshape(r.shape))
        return out
    if not previous:
        return list(routes)
    return [
        p.reshape(-1, p.shape[-1])[torch.arange(r.shape[0]) % (p.numel() // p.shape[-1])].to(r.device)
        for r, p in zip(routes, previous, strict=False)
    ]


def mismatch_keep(
    train_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    ratio_bound: float | None,
    kl_bound: float | None,
) -> torch.Tensor | None:
    """0/1 weights ``(N, L)`` of the tokens the masks keep (``None`` with neither on).

    ``ratio_bound`` C: a token whose ratio π_train / π_rollout lies outside ``[1/C, C]`` is
    masked (IcePop; verl's token ``rollout_rs``); ``kl_bound``: a response whose mean k3
    KL(rollout ‖ training) per token exceeds it is masked whole (verl's sequence KL mode)."""
    if ratio_bound is None and kl_bound is None:
        return None
    keep = torch.ones_like(train_logp)
    if ratio_bound is not None:
        log_ratio = (train_logp - rollout_logp).nan_to_num(0.0)
        bound = float(torch.log(torch.tensor(ratio_bound)))
        keep = keep * (log_ratio.abs() <= bound).float()
    if kl_bound is not None:
        kl = (k3_kl(rollout_logp, train_logp).nan_to_num(0.0) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        keep = keep * (kl <= kl_bound).float()[:, None]
    return keep
