"""What a replay measures inside one forward/backward, with hooks on the stock model.

- Router hooks keep each MoE layer's logits (with their graph, for the load-balancing and z
  losses) and top-k choice, whatever the architecture's router returns; from them, each layer's
  top-k boundary margin (the gap between the k-th and the next selection score, the routing-flip
  risk: a small margin is a choice that a little noise or precision swaps).
- Forward hooks on every module note the first one, in execution order, whose output holds a
  NaN or Inf: the operator where a numerical failure started.
- Gradient norms are taken per parameter group (attention, routed experts, router, shared
  experts, embeddings, other) after unscaling and before clipping, with the count of non-finite
  gradient values.
- Token entropies are summarised by response position bucket and as a histogram.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from moescope.models.routers import selection_scores, topk_margin
from moescope.models.sharding import any_sharded, local, sum_over_shards
from moescope.models.view import MoEModel

GROUPS = ("attention", "routed_experts", "router", "shared_experts", "embeddings", "other")
POSITION_BUCKETS = ((0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 1 << 30))
HIST_BINS = 10


@dataclass
class RouterRecord:
    logits: list[torch.Tensor] = field(default_factory=list)  # per MoE application (T, E)
    index: list[torch.Tensor] = field(default_factory=list)  # (T, k)
    layer: list[int] = field(default_factory=list)  # row of the MoE layer in moe.layers


@contextmanager
def record_routers(moe: MoEModel, *, enabled: bool = True) -> Iterator[RouterRecord]:
    """Collect router logits (graph kept) and top-k index of every MoE layer while active."""
    record = RouterRecord()
    handles = []
    for row, layer in enumerate(moe.layers if enabled else ()):

        def hook(module, args, out, _layer=layer, _row=row):
            logits, index = _layer.router_choice(out)
            record.logits.append(logits.reshape(-1, logits.shape[-1]))
            record.index.append(index.reshape(-1, index.shape[-1]))
            record.layer.append(_row)

        handles.append(layer.router.register_forward_hook(hook))
    try:
        yield record
    finally:
        for h in handles:
            h.remove()


@dataclass
class NonfiniteWatch:
    first_module: str | None = None


def has_nonfinite(out) -> bool:
    """Whether a module output (a tensor, a tuple of them, a ModelOutput) holds a NaN or Inf."""
    if torch.is_tensor(out):
        return out.is_floating_point() and not bool(torch.isfinite(out).all())
    if isinstance(out, (tuple, list)):
        return any(has_nonfinite(o) for o in out)
    if hasattr(out, "values") and callable(out.values):  # ModelOutput
        return any(has_nonfinite(o) for o in out.values())
    return False


@contextmanager
def watch_nonfinite(model: torch.nn.Module) -> Iterator[NonfiniteWatch]:
    """Note the first module (in execution order) whose forward output is not finite."""
    watch = NonfiniteWatch()
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(module, args, out, _name=name):
            if watch.first_module is None and has_nonfinite(out):
                watch.first_module = _name

        handles.append(module.register_forward_hook(hook))
    try:
        yield watch
    finally:
        for h in handles:
            h.remove()


def parameter_groups(model: torch.nn.Module, moe: MoEModel) -> dict[str, list[torch.nn.Parameter]]:
    """Trainable parameters by group; each parameter in exactly one group."""
    owner: dict[int, str] = {}

    def claim(module: torch.nn.Module | None, group: str) -> None:
        if module is not None:
            for p in module.parameters():
                owner.setdefault(id(p), group)

    for layer in moe.layers:
        claim(layer.router, "router")
        claim(layer.shared_experts, "shared_experts")
        claim(layer.shared_gate, "shared_experts")
        claim(layer.experts, "routed_experts")
    claim(model.get_input_embeddings(), "embeddings")
    claim(model.get_output_embeddings(), "embeddings")
    groups: dict[str, list[torch.nn.Parameter]] = {g: [] for g in GROUPS}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        group = owner.get(id(p)) or ("attention" if "attn" in name or "attention" in name else "other")
        groups[group].append(p)
    return groups


def grad_norms(groups: dict[str, list[torch.nn.Parameter]]) -> tuple[dict[str, float], float, int]:
    """Squared-norm sums per group (for reduction across ranks), the total norm, non-finite count.

    One fused norm call per group (fp32 accumulation); the non-finite values are counted only in a
    group whose norm is not finite, since a finite norm means there are none. Under FSDP2 each rank
    holds a disjoint shard of every gradient, so the local squares (and counts) are summed over
    ranks in one collective: the figures equal the unsharded model's on every rank."""
    names = [name for name, params in groups.items() if any(p.grad is not None for p in params)]
    grads = {name: [local(p.grad) for p in groups[name] if p.grad is not None] for name in names}
    squares = torch.zeros(len(names) + 1, dtype=torch.float64)
    for i, name in enumerate(names):
        norms = torch._foreach_norm(grads[name], 2, dtype=torch.float32)
        squares[i] = float(torch.stack(norms).pow(2).sum())
        if not math.isfinite(float(squares[i])):
            squares[-1] += float(sum((~torch.isfinite(g)).sum() for g in grads[name]))
    if any(any_sharded(groups[name]) for name in names):
        sum_over_shards(squares)
    sq = {name: float(squares[i]) for i, name in enumerate(names)}
    return sq, math.sqrt(sum(sq.values())) if sq else 0.0, int(squares[-1])


def entropy_summary(
    entropy: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, vocab: int
) -> dict[str, list[float]]:
    """Sums and counts per position bucket and a histogram over [0, ln V] (summable across ranks)."""
    ent, m, pos = entropy.detach().float(), mask > 0, positions
    bucket_sum, bucket_count = [], []
    for lo, hi in POSITION_BUCKETS:
        sel = m & (pos >= lo) & (pos < hi)
        bucket_sum.append(float(ent[sel].sum()))
        bucket_count.append(float(sel.sum()))
    values = ent[m]
    top = math.log(vocab)
    hist = (
        torch.histc(values.clamp(0, top), bins=HIST_BINS, min=0.0, max=top)
        if values.numel()
        else torch.zeros(HIST_BINS)
    )
    return {"bucket_sum": bucket_sum, "bucket_count": bucket_count, "hist": hist.tolist()}


def routing_sums(record: RouterRecord, valid: torch.Tensor, moe: MoEModel) -> dict[str, torch.Tensor]:
    """Per-layer expert counts, router-entropy sums, top-k margin sums and token counts over
    valid tokens; max |logit|."""
    num_layers, num_experts = len(moe.layers), moe.num_experts
    counts = torch.zeros(num_layers, num_experts)
    ent, tokens = torch.zeros(num_layers), torch.zeros(num_layers)
    margin, margin_tokens = torch.zeros(num_layers), torch.zeros(num_layers)
    max_logit = torch.tensor(0.0)
    flat = valid.reshape(-1).bool()
    for logits, index, row in zip(record.logits, record.index, record.layer, strict=True):
        lg, idx = logits.detach().float()[flat.to(logits.device)], index[flat.to(index.device)]
        counts[row] += torch.bincount(idx.reshape(-1).cpu(), minlength=num_experts).float()
        p = torch.softmax(lg, -1)
        ent[row] += float(-(torch.xlogy(p, p)).sum())
        tokens[row] += lg.shape[0]
        layer = moe.layers[row]
        gap = topk_margin(selection_scores(lg, layer.rule, layer.correction_bias), layer.top_k).cpu()
        margin[row] += float(gap.nan_to_num(0.0).sum())
        margin_tokens[row] += float(torch.isfinite(gap).sum())
        if lg.numel():
            max_logit = torch.maximum(max_logit, lg.abs().max().cpu())
    return {
        "counts": counts,
        "entropy_sum": ent,
        "tokens": tokens,
        "margin_sum": margin,
        "margin_tokens": margin_tokens,
        "max_logit": max_logit,
    }


def routing_flips(
    trained: RouterRecord, rolled: RouterRecord, valid: torch.Tensor, num_layers: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per layer, the valid tokens whose top-k set differs between two passes over the same
    batch (the trainer's and the rollout engine's), and the valid tokens seen."""
    flipped, tokens = torch.zeros(num_layers), torch.zeros(num_layers)
    flat = valid.reshape(-1).bool()
    for a, b, row in zip(trained.index, rolled.index, trained.layer, strict=True):
        keep = flat.to(a.device)
        differs = (a[keep].sort(-1).values != b[keep].sort(-1).values).any(-1)
        flipped[row] += float(differs.sum())
        tokens[row] += float(keep.sum())
    return flipped, tokens
