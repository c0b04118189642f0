"""Regenerate the embedded toy model: ``python -m moescope.models.toy.build --out DIR``.

Trains a stock ``Qwen3MoeForCausalLM`` from scratch on the task suite with a fixed number of
steps (not a time budget, so a busy machine gives the same model), then measures it and writes
a standard Hugging Face checkpoint plus ``toy_card.json``: the recipe, per-task accuracy
(greedy, sampled, mixed), per-layer expert load, wall time and library versions. With the same
torch build and thread count the weights are bit-identical from run to run. The training loop,
measurement and card are shared with the other embedded models (:mod:`._training`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from moescope.models.toy._training import (
    Batch,
    Recipe,
    answer_ce,
    build_embedded,
    build_main,
    eval_settings,
    train,
)
from moescope.models.toy.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

__all__ = [
    "ToyRecipe",
    "build",
    "eval_settings",
    "make_model",
    "model_config",
    "per_layer_aux_loss",
    "train_toy",
]


@dataclass(frozen=True)
class ToyRecipe(Recipe):
    """Every hyperparameter of the toy model; saved in ``toy_card.json``."""

    # model: 32 experts, top-2, so that keeping 1/8 of the experts still leaves more than top-k
    num_layers: int = 4
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    num_experts: int = 32
    top_k: int = 2
    moe_intermediate_size: int = 32  # narrow experts keep the fp32 checkpoint under 10 MB
    max_position_embeddings: int = 64  # longest example is 31 tokens
    # router load balancing, applied per layer (the stock loss pools all layers' counts, which
    # cannot see an expert that is dead in one layer and busy in another)
    router_aux_loss_coef: float = 0.05
    # Addition learns in a sharp phase transition (add2 near 1700 steps, add3 near 1900);
    # 2400 steps leaves add2 just below 90 % and add3 near 45 % when sampled at T=1.
    steps: int = 2400


def model_config(r: ToyRecipe) -> Qwen3MoeConfig:
    """The stock Qwen3-MoE config of the toy: every layer sparse, normalised top-k weights."""
    return Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=r.hidden_size,
        intermediate_size=4 * r.hidden_size,  # unused: no dense MLP layers
        moe_intermediate_size=r.moe_intermediate_size,
        num_hidden_layers=r.num_layers,
        num_attention_heads=r.num_heads,
        num_key_value_heads=r.num_kv_heads,
        head_dim=r.head_dim,
        num_experts=r.num_experts,
        num_experts_per_tok=r.top_k,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=r.router_aux_loss_coef,
        max_position_embeddings=r.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def make_model(r: ToyRecipe) -> Qwen3MoeForCausalLM:
    """A freshly initialised toy (under the caller's seed)."""
    return Qwen3MoeForCausalLM(model_config(r))


def per_layer_aux_loss(
    router_logits: tuple[torch.Tensor, ...], mask: torch.Tensor, r: ToyRecipe
) -> torch.Tensor:
    """Mean over layers of the stock Switch load-balancing loss computed on each layer alone."""
    losses = [load_balancing_loss_func((lg,), r.num_experts, r.top_k, mask) for lg in router_logits]
    return torch.stack(losses).mean()


def train_toy(
    model: Qwen3MoeForCausalLM, tok: Any, r: ToyRecipe, on_step: Callable[[int, dict], None] | None = None
) -> list[dict[str, float]]:
    """Train in place: cross-entropy on answer tokens plus the per-layer load-balancing loss."""

    def step_loss(model: Qwen3MoeForCausalLM, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch["attention_mask"]
        out = model(input_ids=batch["input_ids"], attention_mask=mask, output_router_logits=True)
        ce = answer_ce(out.logits, batch)
        aux = per_layer_aux_loss(out.router_logits, mask, r)
        return ce + r.router_aux_loss_coef * aux, {"ce": ce, "aux": aux}

    return train(model, tok, r, step_loss, on_step)


def build(
    out: str | Path, r: ToyRecipe | None = None, *, overwrite: bool = False, log: Callable[[str], Any] = print
) -> Path:
    """Train the toy model under recipe ``r``, measure it and write it to ``out`` atomically."""
    return build_embedded(out, r or ToyRecipe(), make_model, train_toy, overwrite=overwrite, log=log)


if __name__ == "__main__":
    raise SystemExit(build_main(None, "python -m moescope.models.toy.build", __doc__, build))
