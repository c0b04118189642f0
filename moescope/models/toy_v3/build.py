"""Regenerate the embedded toy-v3 model: ``python -m moescope.models.toy_v3.build --out DIR``.

Trains a stock ``DeepseekV3ForCausalLM`` from scratch on the task suite, built like today's large
MoEs: many fine-grained routed experts, top-6, a shared expert, sigmoid scores with a selection-only
correction bias, group-limited top-k and Multi-head Latent Attention. Load is balanced without an
auxiliary loss, as in DeepSeek-V3: after each optimiser step, per layer, every expert's correction
bias moves by ``γ · sign(mean load − its load)``, with the load counted from the router's own top-k
choice over the batch's real tokens. Steps are fixed (not a time budget) and the training loop,
measurement and card are shared with the toy (:mod:`moescope.models.toy._training`), so with the
same torch build and thread count the weights are bit-identical from run to run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from moescope.models.toy._training import (
    Batch,
    Recipe,
    RoutingCounter,
    answer_ce,
    build_embedded,
    build_main,
    train,
)
from moescope.models.toy.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

__all__ = ["V3Recipe", "balance_step", "build", "make_model", "model_config", "train_v3"]


@dataclass(frozen=True)
class V3Recipe(Recipe):
    """Every hyperparameter of toy-v3; saved in its ``toy_card.json``.

    The architecture fields carry their ``DeepseekV3Config`` names, so the config is built from them.
    """

    num_hidden_layers: int = 4
    # Every layer sparse (DeepSeek-V3 keeps its first 3 of 61 dense): with 4 layers a dense first
    # layer leaves only 3 for a proxy to cut, and in trial runs of 2400-3200 steps the dense-first
    # variant never learned add3.
    first_k_dense_replace: int = 0
    hidden_size: int = 128
    intermediate_size: int = 512  # a dense layer's MLP; unused while first_k_dense_replace is 0
    # Multi-head Latent Attention at toy size: key and value through one rank-64 latent with a
    # decoupled RoPE part; a full-rank query, as the small DeepSeek-V2-Lite and Moonlight have
    # (in trials a rank-64 query latent delayed the addition phase transition past 3000 steps).
    num_attention_heads: int = 4
    q_lora_rank: int | None = None
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    # Routed experts: 64 fine-grained, top-6, 4 groups of 16 of which a token may use the best 3.
    # topk_group=3 (DeepSeek-V3 uses 4 of 8) keeps 1/8 valid: 8 experts = 2 per group, 2 × 3 >= 6.
    n_routed_experts: int = 64
    num_experts_per_tok: int = 6
    n_group: int = 4
    topk_group: int = 3
    moe_intermediate_size: int = 16  # fine-grained: 1/8 of the hidden size (DeepSeek-V3: 2048/7168)
    # The always-on shared path, n_shared_experts × the routed width = 64, like Qwen1.5-MoE's shared
    # expert (4 × its routed width). In trials 2 shared experts (DeepSeek-V2-Lite, Moonlight) kept
    # 0.04-0.06 of add2 at keep 1/4, 4 kept 0.25-0.30, and 8 did not learn add3 in 3000 steps.
    n_shared_experts: int = 4
    routed_scaling_factor: float = 2.5  # DeepSeek-V3's value
    max_position_embeddings: int = 64  # longest example is 31 tokens
    experts_implementation: str = "grouped_mm"  # CPU train step 215 ms; eager 494 ms, batched_mm slower
    # Auxiliary-loss-free balancing: the correction bias moves by γ per step, DeepSeek-V3's 0.001
    # (0.01 balanced no better in a trial: 0.65-3.1 % per expert against 0.65-2.5 %)
    bias_update_speed: float = 1e-3
    # add3 is learned near step 1600-2000, add2 near 2200-2800; 3000 steps leave add2 in the
    # 30-90 % window when sampled at T=1 and add3 above it.
    steps: int = 3000
    # One thread: on 2 shared cores two threads spin against other processes (15x slower under
    # load); the thread count is part of what makes the weights bit-identical.
    threads: int = 1


# recipe fields that are no DeepseekV3Config field
_NOT_CONFIG = {f.name for f in fields(Recipe)} | {"experts_implementation", "bias_update_speed"}


def model_config(r: V3Recipe) -> DeepseekV3Config:
    """The stock DeepSeek-V3 config of toy-v3: the recipe's architecture fields under their config
    names, plus the tokenizer's ids, tied embeddings and no multi-token-prediction layer."""
    architecture = {k: v for k, v in r.to_dict().items() if k not in _NOT_CONFIG}
    return DeepseekV3Config(
        **architecture,
        num_key_value_heads=r.num_attention_heads,  # MLA: every head reads the one shared latent
        norm_topk_prob=True,
        num_nextn_predict_layers=0,
        tie_word_embeddings=True,
        vocab_size=VOCAB_SIZE,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def make_model(r: V3Recipe) -> DeepseekV3ForCausalLM:
    """A freshly initialised toy-v3 (under the caller's seed) with the recipe's experts kernel."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(model_config(r), experts_implementation=r.experts_implementation)


@torch.no_grad()
def balance_step(counter: RoutingCounter, speed: float) -> None:
    """DeepSeek-V3's auxiliary-loss-free update: per layer, ``bias += speed · sign(mean − load)``,
    then the counts start over. The bias shifts selection only, never the gate weights."""
    for layer, load in zip(counter.layers, counter.counts, strict=True):
        layer.correction_bias.add_(speed * torch.sign(load.mean() - load).float())
    counter.reset()


def train_v3(
    model: DeepseekV3ForCausalLM, tok: Any, r: V3Recipe, on_step: Callable[[int, dict], None] | None = None
) -> list[dict[str, float]]:
    """Train in place: cross-entropy on answer tokens; the correction biases balance the load."""
    with RoutingCounter(model) as counter:

        def step_loss(
            model: DeepseekV3ForCausalLM, batch: Batch
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            counter.mask = batch["attention_mask"]
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            ce = answer_ce(out.logits, batch)
            share = counter.counts / counter.counts.sum(dim=1, keepdim=True)
            return ce, {"ce": ce, "max_load": share.max() * share.shape[1]}

        return train(model, tok, r, step_loss, on_step, lambda: balance_step(counter, r.bias_update_speed))


def build(
    out: str | Path, r: V3Recipe | None = None, *, overwrite: bool = False, log: Callable[[str], Any] = print
) -> Path:
    """Train toy-v3 under recipe ``r``, measure it and write it to ``out`` atomically."""
    return build_embedded(out, r or V3Recipe(), make_model, train_v3, overwrite=overwrite, log=log)


if __name__ == "__main__":
    raise SystemExit(build_main(None, "python -m moescope.models.toy_v3.build", __doc__, build))
