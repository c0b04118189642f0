"""What a cost depends on: a model's MoE dimensions and its parameters by role, for a
checkpoint, a config, or the published reference models of ``moescope/data/moe_configs.json``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError
from moescope.export.cost.formulas import analytic_params, entry_from_config, field_of, kv_heads, kv_per_token
from moescope.export.cost.sources import hf_config, meta_summary, moe_text_config, not_a_config, read_source
from moescope.keep import Keep

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from moescope.models.summary import ParamCounts


@dataclass(frozen=True)
class ModelShape:
    """What the cost depends on: a model's MoE dimensions and parameters by role.

    ``params_backbone`` holds everything but the experts, routers included (``params_router``
    alone); ``params_total = backbone + routed + shared``; ``params_active`` is what one token
    runs through (backbone, shared experts, top-k routed experts). ``counted`` says how:
    ``"exact"`` (the model built on the meta device) or ``"analytic"`` (:func:`analytic_params`).
    A proxy (:meth:`with_keep`) has ``source_experts`` set to the original expert count.

    Examples
    --------
    >>> shape = ModelShape.from_config("toy")
    >>> proxy = shape.with_keep("1/4")
    >>> proxy.routed_experts, shape.params_routed // proxy.params_routed, proxy.top_k == shape.top_k
    (8, 4, True)
    """

    name: str
    hidden_size: int
    num_layers: int
    num_moe_layers: int
    routed_experts: int
    shared_experts: int
    top_k: int
    params_total: int
    params_routed: int
    params_shared: int
    params_backbone: int
    params_router: int
    params_active: int
    n_group: int = 1
    topk_group: int = 1
    counted: str = "exact"
    published_total: int | None = None
    published_active: int | None = None
    source_experts: int | None = None
    note: str = ""
    kv_per_token: int = 0  # numbers the rollout engine's KV cache keeps per token, all layers
    kv_heads: int = 1  # heads the KV cache splits into over tensor-parallel ranks (MLA's latent: 1)

    @classmethod
    def from_config(
        cls, source: PretrainedConfig | Mapping[str, Any] | str | Path, *, exact: bool = True
    ) -> ModelShape:
        """The shape of a checkpoint directory, ``"toy"``, a ``config.json``, a config, an entry,
        or a reference model's name (``"DeepSeek-V3"``, when no such path exists).

        A Hugging Face config is counted exactly by default (``exact=False``: the analytic
        formulas); a ``moe_configs.json`` entry (a dict with ``routed_experts``) analytically. A
        multimodal config is costed by its text model (the vision tower is not counted).
        """
        if isinstance(source, str | Path):
            reference = _reference_entry(str(source))
            if reference is not None and not Path(source).exists():
                return cls.from_entry(reference)
            data, name = read_source(source)
            return cls._from_mapping(data, name, exact)
        if isinstance(source, Mapping):
            return cls._from_mapping(source, None, exact)
        return cls._from_hf(source, None, exact)

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> ModelShape:
        """The shape of a ``moe_configs.json`` entry, counted by :func:`analytic_params`."""
        experts = int(field_of(entry, "routed_experts"))
        name = str(entry.get("name") or "model")
        if experts < 2:
            raise MoescopeError(
                f"{name} has {experts} routed expert(s), so it is not a Mixture-of-Experts model."
            )
        published = {k: entry.get(f"{k}_params_b") for k in ("total", "active")}
        return cls._from_counts(
            analytic_params(entry),
            name=name,
            hidden_size=int(entry["hidden_size"]),
            num_layers=int(entry["num_layers"]),
            num_moe_layers=int(entry["num_moe_layers"]),
            routed_experts=experts,
            shared_experts=int(entry.get("shared_experts") or 0),
            top_k=int(entry["top_k"]),
            n_group=int(entry.get("n_group") or 1),
            topk_group=int(entry.get("topk_group") or 1),
            counted="analytic",
            published_total=None if published["total"] is None else round(published["total"] * 1e9),
            published_active=None if published["active"] is None else round(published["active"] * 1e9),
            note=str(entry.get("note", "")),
            kv_per_token=kv_per_token(entry),
            kv_heads=kv_heads(entry),
        )

    @classmethod
    def _from_counts(cls, counts: ParamCounts, **facts: Any) -> ModelShape:
        return cls(
            params_total=counts.total,
            params_routed=counts.routed_experts,
            params_shared=counts.shared_experts,
            params_backbone=counts.backbone,
            params_router=counts.router,
            params_active=counts.active_per_token,
            **facts,
        )

    @classmethod
    def _from_mapping(cls, data: Mapping[str, Any], name: str | None, exact: bool) -> ModelShape:
        if "model_type" in data:
            return cls._from_hf(hf_config(data, name), name, exact)
        if "routed_experts" in data:
            return cls.from_entry({"name": name, **data} if name and not data.get("name") else data)
        raise not_a_config(name or "the mapping")

    @classmethod
    def _from_hf(cls, config: PretrainedConfig, name: str | None, exact: bool) -> ModelShape:
        config, note = moe_text_config(config)
        name = name or getattr(config, "name_or_path", "") or config.model_type
        if not exact:
            entry = entry_from_config(config)
            return replace(cls.from_entry({**entry, "name": name}), note=note)
        summary = meta_summary(config, name)
        return cls._from_counts(
            summary.params,
            name=name,
            hidden_size=summary.hidden_size,
            num_layers=summary.num_layers,
            num_moe_layers=len(summary.moe_layers),
            routed_experts=summary.routed_experts,
            shared_experts=summary.shared_experts,
            top_k=summary.top_k,
            n_group=summary.n_group,
            topk_group=summary.topk_group,
            note=note,
            **_config_kv(config),
        )

    def with_keep(self, keep: str | float | int | Keep) -> ModelShape:
        """The proxy keeping ``keep`` routed experts per layer (``"1/4"``, ``0.25`` or a count).

        The cut experts' parameters and router rows go; backbone, shared experts and top-k stay.
        The keep is checked like every moescope keep (:class:`moescope.keep.Keep`).
        """
        e = self.routed_experts
        kept = Keep.parse(keep, e, self.top_k, self.n_group, topk_group=self.topk_group).fixed()
        per_expert, per_row = self.params_routed // e, self.params_router // e
        backbone = self.params_backbone - self.params_router + per_row * kept
        return replace(
            self,
            routed_experts=kept,
            params_routed=per_expert * kept,
            params_router=per_row * kept,
            params_backbone=backbone,
            params_total=backbone + per_expert * kept + self.params_shared,
            params_active=backbone + self.params_shared + per_expert * self.top_k,
            published_total=None,
            published_active=None,
            source_experts=self.source_experts or e,
        )

    @property
    def weight_tensors(self) -> int:
        """About how many weight tensors a training framework holds, one per expert projection:
        three per routed and per shared expert, a router per MoE layer, three per dense FFN,
        eight per layer for attention and norms, and the embeddings, final norm and LM head.
        What sending weights tensor by tensor pays a fixed cost for."""
        dense = self.num_layers - self.num_moe_layers
        experts = self.routed_experts + (1 if self.shared_experts else 0)
        return self.num_moe_layers * (3 * experts + 1) + 3 * dense + 8 * self.num_layers + 3

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _config_kv(config: PretrainedConfig) -> dict[str, int]:
    """``kv_per_token`` and ``kv_heads`` of a Hugging Face config: by the analytic entry where there
    is a formula for its type, else from its attention's dimensions (MLA's latent where the config
    has a ``kv_lora_rank``, grouped-query heads otherwise), layer by layer where the config has
    per-layer settings (transformers' heterogeneous configs); the heads are the largest layer's."""
    try:
        entry = entry_from_config(config)
        return {"kv_per_token": kv_per_token(entry), "kv_heads": kv_heads(entry)}
    except MoescopeError:
        per_layer = getattr(config, "per_layer_config", None)
        layers = per_layer or [config] * int(config.num_hidden_layers)
        return {
            "kv_per_token": sum(_layer_kv(layer) for layer in layers),
            "kv_heads": max(1 if _latent(layer) else _heads(layer)[1] for layer in layers),
        }


def _heads(config: Any) -> tuple[int, int]:
    """(attention heads, key-value heads) of a config."""
    heads = int(config.num_attention_heads)
    return heads, int(getattr(config, "num_key_value_heads", None) or heads)


def _latent(config: Any) -> int:
    """What an MLA layer caches per token (its key-value latent and shared rotary key); 0 for
    any other attention."""
    rank = getattr(config, "kv_lora_rank", None)
    return int(rank) + int(getattr(config, "qk_rope_head_dim", None) or 0) if rank else 0


def _layer_kv(config: Any) -> int:
    """Numbers one attention layer caches per token: MLA's latent, else grouped-query keys and values."""
    return _latent(config) or _gqa_kv(config)


def _gqa_kv(config: Any) -> int:
    """Keys and values of one grouped-query attention layer, per token."""
    heads, groups = _heads(config)
    return 2 * groups * int(getattr(config, "head_dim", None) or config.hidden_size // heads)


def reference_entries() -> list[dict[str, Any]]:
    """The entries of ``moescope/data/moe_configs.json``: published configs of 12 MoE models.

    A copy of the project's reference table, shipped in the package (offline, works from a
    wheel); each entry has the publisher's total and active parameter counts.
    """
    text = resources.files("moescope").joinpath("data/moe_configs.json").read_text()
    return json.loads(text)["models"]


def _reference_entry(name: str) -> dict[str, Any] | None:
    """The reference entry named ``name`` (any case), if there is one."""
    return next((e for e in reference_entries() if e["name"].lower() == name.lower()), None)


def reference_models() -> list[ModelShape]:
    """The reference models as :class:`ModelShape`, counted by :func:`analytic_params`.

    Examples
    --------
    >>> [m.name for m in reference_models()][:2]
    ['Mixtral-8x7B', 'Mixtral-8x22B']
    """
    return [ModelShape.from_entry(entry) for entry in reference_entries()]
