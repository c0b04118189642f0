"""Parameter counts of MoE models from their published dimensions (no model built).

The formulas behind :mod:`moescope.export.cost.shape` for entries of ``moescope/data/moe_configs.json``
(published configs of large MoE models) and for Hugging Face configs turned into such
entries; tested against exact meta-device counts of tiny configs and the publishers' totals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from moescope.models.summary import ParamCounts


@dataclass(frozen=True)
class _Dims:
    """The dimensions the analytic formulas read, from a moe_configs.json-style entry."""

    hidden: int
    layers: int
    moe_layers: int
    experts: int
    top_k: int
    expert_width: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    shared_width: int = 0
    dense_width: int = 0
    mla: tuple[int, int, int, int, int] | None = None  # q_lora (0: none), kv_lora, rope, nope, v
    tied: bool = False
    attention_bias: str | None = None  # "qkv" or "qkvo": which projections have a bias
    qk_norm: str | None = None  # "head" (one norm per head width) or "full" (over all heads)
    attention_sinks: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    shared_gate: bool = False


_EXTRA_KEYS = ("attention_bias", "qk_norm", "attention_sinks", "router_bias", "expert_bias", "shared_gate")


def field_of(entry: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    """``entry[key]``; a missing or null value is ``default``, or an error naming the key."""
    value = entry.get(key)
    if value is None:
        if default is ...:
            name = entry.get("name") or entry.get("model_type") or "the entry"
            raise MoescopeError(
                f"{name} has no '{key}'; add it (see moescope/data/moe_configs.json 'fields')."
            )
        return default
    return value


def _dims(entry: Mapping[str, Any]) -> _Dims:
    hidden, heads = int(field_of(entry, "hidden_size")), int(field_of(entry, "heads"))
    mla = None
    if entry.get("attention") == "MLA":
        keys = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        mla = (int(entry.get("q_lora_rank") or 0), *(int(field_of(entry, key)) for key in keys))
    layers, moe_layers = int(field_of(entry, "num_layers")), int(field_of(entry, "num_moe_layers"))
    return _Dims(
        hidden=hidden,
        layers=layers,
        moe_layers=moe_layers,
        experts=int(field_of(entry, "routed_experts")),
        top_k=int(field_of(entry, "top_k")),
        expert_width=int(field_of(entry, "moe_intermediate_size")),
        vocab=int(field_of(entry, "vocab_size")),
        heads=heads,
        kv_heads=int(field_of(entry, "kv_heads", heads)),
        head_dim=int(field_of(entry, "head_dim", hidden // heads)),
        shared_width=int(field_of(entry, "shared_intermediate_size")) if entry.get("shared_experts") else 0,
        dense_width=int(field_of(entry, "dense_intermediate_size")) if layers > moe_layers else 0,
        mla=mla,
        tied=bool(entry.get("tie_word_embeddings", False)),
        **{key: entry[key] for key in _EXTRA_KEYS if entry.get(key) is not None},
    )


def _attention(d: _Dims) -> int:
    """One attention block: projections, their biases, q/k norms and sinks."""
    if d.mla is not None:
        return _mla(d)
    h, q, kv = d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim
    n = h * q + 2 * h * kv + q * h
    if d.attention_bias:
        n += q + 2 * kv + (h if d.attention_bias == "qkvo" else 0)
    n += {"head": 2 * d.head_dim, "full": q + kv}.get(d.qk_norm or "", 0)
    return n + (d.heads if d.attention_sinks else 0)


def _mla(d: _Dims) -> int:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank query and key-value paths."""
    q_lora, kv_lora, rope, nope, v = d.mla or (0, 0, 0, 0, 0)
    h, qk = d.hidden, d.heads * (nope + rope)
    query = h * q_lora + q_lora + q_lora * qk if q_lora else h * qk  # a-proj, its norm, b-proj
    key_value = h * (kv_lora + rope) + kv_lora + kv_lora * d.heads * (nope + v)
    bias = q_lora + kv_lora + rope + h if d.attention_bias else 0
    return query + key_value + d.heads * v * h + bias


def _glu(hidden: int, width: int) -> int:
    """Gated FFN (gate, up, down) of ``width``: 3·H·I."""
    return 3 * hidden * width


def analytic_params(entry: Mapping[str, Any]) -> ParamCounts:
    """Parameters by role from the dimensions of a ``moe_configs.json``-style entry.

    Formulas (H hidden, V vocabulary, L layers of which M are MoE, E routed experts, I expert
    width; ``h`` heads, ``g`` KV heads, ``d`` head width):

    - GQA attention: ``H·h·d + 2·H·g·d + h·d·H`` (+ biases ``h·d + 2·g·d`` [+ ``H`` for the
      output], + q/k norms ``2·d`` per head or ``h·d + g·d`` over all heads, + ``h`` sinks);
    - MLA attention: ``H·r_q + r_q + r_q·h·(n+p)`` (query; ``H·h·(n+p)`` without ``r_q``) +
      ``H·(r_kv+p) + r_kv + r_kv·h·(n+v)`` (key-value) + ``h·v·H`` (output);
    - a routed expert: ``3·H·I`` (+ ``2·I + H`` biases); a router: ``E·H`` (+ ``E`` bias) per MoE
      layer; shared experts: ``3·H·I_shared`` per MoE layer (+ ``H`` gate); dense layers:
      ``3·H·I_dense`` each;
    - norms ``2·H`` per layer + ``H``; embeddings ``V·H``, plus ``V·H`` for an untied LM head.

    ``backbone`` holds everything but the routed and shared experts (routers included, as in
    :class:`~moescope.models.summary.ParamCounts`); ``active_per_token`` adds the shared experts and
    ``top_k`` routed experts per MoE layer. Buffers (DeepSeek's correction bias) are no
    parameters. Optional entry keys for exactness on small models: ``tie_word_embeddings``,
    ``attention_bias`` ("qkv"/"qkvo"), ``qk_norm`` ("head"/"full"), ``attention_sinks``,
    ``router_bias``, ``expert_bias``, ``shared_gate``.

    Examples
    --------
    >>> from moescope.export.cost.shape import reference_entries
    >>> analytic_params(reference_entries()[0]).total  # Mixtral-8x7B
    46702792704
    """
    d = _dims(entry)
    h, dense_layers = d.hidden, d.layers - d.moe_layers
    expert = _glu(h, d.expert_width) + (2 * d.expert_width + h if d.expert_bias else 0)
    router = d.moe_layers * d.experts * (h + (1 if d.router_bias else 0))
    shared = d.moe_layers * (_glu(h, d.shared_width) + (h if d.shared_gate else 0)) if d.shared_width else 0
    embeddings = d.vocab * h * (1 if d.tied else 2)
    backbone = (
        d.layers * (_attention(d) + 2 * h) + h + embeddings + dense_layers * _glu(h, d.dense_width) + router
    )
    routed = d.moe_layers * d.experts * expert
    return _param_counts(
        total=backbone + routed + shared,
        backbone=backbone,
        router=router,
        routed_experts=routed,
        shared_experts=shared,
        active_per_token=backbone + shared + d.moe_layers * d.top_k * expert,
    )


def kv_per_token(entry: Mapping[str, Any]) -> int:
    """Numbers the KV cache keeps per token over all layers: ``2·g·d`` per layer for grouped-query
    attention (keys and values of ``g`` heads of width ``d``), ``r_kv + p`` for MLA (the
    compressed latent and the shared rotary key, as inference engines cache it).

    Examples
    --------
    >>> from moescope.export.cost.shape import reference_entries
    >>> kv_per_token(reference_entries()[5])  # DeepSeek-V3: (512 + 64) x 61 layers
    35136
    """
    d = _dims(entry)
    if d.mla is not None:
        return d.layers * (d.mla[1] + d.mla[2])
    return d.layers * 2 * d.kv_heads * d.head_dim


def kv_heads(entry: Mapping[str, Any]) -> int:
    """Heads the KV cache splits into across tensor-parallel ranks: the key-value heads of
    grouped-query attention, 1 for MLA (inference engines cache its latent as one head, whole on
    every rank).

    Examples
    --------
    >>> from moescope.export.cost.shape import reference_entries
    >>> [kv_heads(reference_entries()[i]) for i in (3, 5)]  # Qwen3-30B-A3B, DeepSeek-V3
    [4, 1]
    """
    d = _dims(entry)
    return 1 if d.mla is not None else d.kv_heads


def _param_counts(**counts: int) -> ParamCounts:
    from moescope.models.summary import ParamCounts  # torch: costing a published model needs none

    return ParamCounts(**counts)


# --- from a Hugging Face config to an entry ---------------------------------------------------


def _qkvo(config: Any) -> str | None:
    return "qkvo" if getattr(config, "attention_bias", False) else None


# model type -> the extra entry keys its transformers class implies (see analytic_params)
_EXTRAS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "mixtral": lambda c: {},
    "qwen2_moe": lambda c: {"attention_bias": "qkv" if c.qkv_bias else None, "shared_gate": True},
    "qwen3_moe": lambda c: {"attention_bias": _qkvo(c), "qk_norm": "head"},
    "olmoe": lambda c: {"attention_bias": _qkvo(c), "qk_norm": "full"},
    "deepseek_v3": lambda c: {"attention_bias": _qkvo(c)},
    "glm4_moe": lambda c: {
        "attention_bias": "qkv" if c.attention_bias else None,
        "qk_norm": "head" if c.use_qk_norm else None,
    },
    "gpt_oss": lambda c: {
        "attention_bias": _qkvo(c),
        "attention_sinks": True,
        "router_bias": True,
        "expert_bias": True,
    },
    "llama4_text": lambda c: {"attention_bias": _qkvo(c)},
}


def _moe_layer_count(config: Any) -> int:
    n, model_type = int(config.num_hidden_layers), config.model_type
    if model_type in ("deepseek_v3", "glm4_moe"):
        return n - int(config.first_k_dense_replace)
    if model_type == "llama4_text":
        return len(config.moe_layers)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step, skip = int(config.decoder_sparse_step), set(config.mlp_only_layers)
        return sum(1 for i in range(n) if i not in skip and (i + 1) % step == 0)
    return n


def entry_from_config(config: PretrainedConfig) -> dict[str, Any]:
    """The ``moe_configs.json``-style entry of a Hugging Face config, for :func:`analytic_params`.

    Covers the architectures of the reference models (``mixtral``, ``qwen2_moe``, ``qwen3_moe``,
    ``olmoe``, ``deepseek_v3``, ``glm4_moe``, ``gpt_oss``, ``llama4_text``), so the formulas can
    be checked against transformers' own classes.

    Examples
    --------
    >>> from moescope.models.zoo import tiny_config
    >>> entry_from_config(tiny_config("mixtral"))["routed_experts"]
    8
    """
    from moescope.models.support import spec_for  # torch: costing a published model needs none
    from moescope.models.table import config_value

    spec, model_type = spec_for(config), config.model_type
    if model_type not in _EXTRAS:
        raise MoescopeError(
            f"there is no analytic formula for model type '{model_type}'; count it exactly instead "
            f"(exact=True), or use one of: {', '.join(_EXTRAS)}."
        )
    c, rule = config, spec.rule(config)
    width = int(config_value(c, spec.intermediate_key))
    shared, shared_width = 0, 0
    if spec.shared_experts:
        shared = int(getattr(c, spec.shared_count_key)) if spec.shared_count_key else 1
        key = spec.shared_intermediate_key
        shared_width = int(getattr(c, key)) if key else shared * width
    mla_keys = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    mla = {key: getattr(c, key, None) for key in mla_keys}
    return {
        "name": getattr(c, "name_or_path", "") or model_type,
        "hidden_size": c.hidden_size,
        "num_layers": c.num_hidden_layers,
        "num_moe_layers": _moe_layer_count(c),
        "routed_experts": spec.num_experts(c),
        "shared_experts": shared,
        "top_k": spec.top_k(c),
        "moe_intermediate_size": width,
        "shared_intermediate_size": shared_width,
        "dense_intermediate_size": getattr(c, "intermediate_size_mlp", None) or c.intermediate_size,
        "vocab_size": c.vocab_size,
        "heads": c.num_attention_heads,
        "kv_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", None),
        "n_group": rule.n_group,
        "topk_group": rule.topk_group,
        "attention": "MLA" if mla["kv_lora_rank"] else "GQA",
        **(mla if mla["kv_lora_rank"] else {}),
        "tie_word_embeddings": bool(c.tie_word_embeddings),
        **_EXTRAS[model_type](c),
    }


# --- the shape of a model ----------------------------------------------------------------------
