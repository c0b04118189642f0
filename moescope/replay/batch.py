"""Packing groups into right-padded training tensors, and the policy's token log-probs.

Sequences are ``prompt + response`` right-padded, with position ids counting from 0, so a real
token's log-prob does not depend on how long the other sequences in its batch are (a trainer
that packs rows with position ids reset at each boundary computes the same; one that does not
reset them is the ``packing_positions`` fault). Token ``t``
is scored by the logits at ``t - 1``; only response tokens count in the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from moescope.replay.precision import autocast
from moescope.replay.rollout import Group


@dataclass
class Batch:
    input_ids: torch.Tensor  # (N, L)
    attention_mask: torch.Tensor  # (N, L)
    response_mask: torch.Tensor  # (N, L - 1) float: 1 where the target token is a response token
    advantages: torch.Tensor  # (N,)
    positions: torch.Tensor  # (N, L - 1) index of the target token within its response

    @property
    def tokens(self) -> int:
        return int(self.response_mask.sum())

    def select(self, rows: Sequence[int]) -> Batch:
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        return Batch(
            *(
                t[idx]
                for t in (
                    self.input_ids,
                    self.attention_mask,
                    self.response_mask,
                    self.advantages,
                    self.positions,
                )
            )
        )


def pack(groups: Sequence[Group], advantages: Sequence[float], pad_id: int) -> Batch:
    """One row per sample of ``groups`` (in order), with its advantage."""
    rows = [(g.prompt_ids, r) for g in groups for r in g.responses]
    width = max(len(p) + len(r) for p, r in rows) if rows else 1
    n = len(rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    resp = torch.zeros((n, width - 1))
    pos = torch.zeros((n, width - 1), dtype=torch.long)
    for i, (prompt, response) in enumerate(rows):
        seq = prompt + response
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        start = len(prompt) - 1  # logits at start predict the first response token
        resp[i, start : start + len(response)] = 1
        pos[i, start : start + len(response)] = torch.arange(len(response))
    return Batch(ids, attn, resp, torch.tensor(list(advantages), dtype=torch.float32), pos)


def token_logprobs(
    model: torch.nn.Module, batch: Batch, *, temperature: float, precision: str, packed: bool = False
) -> tuple[torch.Tensor, torch.Tensor, object]:
    """``(log π(token), entropy of π)`` per target position ``(N, L - 1)``, and the raw output.

    Logits are divided by the sampling temperature first, as the rollout sampled from them.
    ``packed``: the rows' real tokens are run as one sequence with position ids that are not
    reset at the rows' boundaries, so (as a varlen kernel finds the boundaries from those resets)
    every row attends to the rows before it: the ``packing_positions`` fault.
    """
    device = next(model.parameters()).device
    n, width = batch.input_ids.shape
    with autocast(precision, device):
        if packed:
            valid = batch.attention_mask.bool().to(device)
            ids = batch.input_ids.to(device)[valid][None]  # (1, S): the rows one after another
            out = model(
                input_ids=ids, position_ids=torch.arange(ids.shape[1], device=device)[None], use_cache=False
            )
            flat = out.logits[0]  # (S, V)
            logits = flat.new_zeros(n, width, flat.shape[-1]).masked_scatter(valid[..., None], flat)
        else:
            out = model(
                input_ids=batch.input_ids.to(device),
                attention_mask=batch.attention_mask.to(device),
                position_ids=torch.arange(width, device=device).expand(n, width),
                use_cache=False,
            )
            logits = out.logits
    logits = logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    target = batch.input_ids[:, 1:].to(device)
    logp = logp_all.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, out
