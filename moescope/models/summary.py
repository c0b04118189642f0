"""Architecture summary of an MoE model: what ``moescope inspect`` prints.

Parameter counts come from the model's structure, so a checkpoint path is summarized by
building the model on PyTorch's ``meta`` device from its config — no weight is read and a
600 B-parameter model costs the same as a toy.

Examples
--------
>>> from moescope.models.zoo import tiny
>>> s = summarize(tiny("qwen2_moe"))
>>> s.routed_experts, s.top_k, s.shared_experts
(8, 2, 1)
"""

from __future__ import annotations

import itertools
import json
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.models.loading import check_weights, load_config, resolve_model
from moescope.models.routers import describe
from moescope.models.support import language_config
from moescope.models.table import config_value
from moescope.models.view import MoEModel, adapt

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by role. ``backbone`` includes the routers (also given alone)."""

    total: int
    backbone: int
    router: int
    routed_experts: int
    shared_experts: int
    active_per_token: int  # backbone + shared + top_k of E routed experts in every MoE layer

    def remaining(self, keep: float) -> float:
        """Share of the parameters a proxy keeping the fraction ``keep`` of the routed experts
        still has, counting the experts cut (their router rows, a row of ``hidden_size`` each,
        are left out of the count).

        Example
        -------
        >>> ParamCounts(100, 20, 1, 80, 0, 30).remaining(1 / 4)
        0.4
        """
        return (self.total - (1 - keep) * self.routed_experts) / self.total


@dataclass(frozen=True)
class ModelSummary:
    """What a user needs to know about an MoE model before cutting a proxy of it."""

    source: str
    model_type: str
    architecture: str
    model_class: str
    dtype: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    moe_layers: tuple[int, ...]
    dense_layers: tuple[int, ...]
    routed_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_experts: int
    routing: str
    router_bias: bool
    correction_bias: bool
    n_group: int
    topk_group: int
    count_key: str
    topk_key: str
    params: ParamCounts
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_frame(self) -> pd.DataFrame:
        """Long form: one row per field (``field``, ``value``), parameters flattened."""
        import pandas as pd

        rows = [(k, v) for k, v in self.to_dict().items() if k != "params"]
        rows += [(f"params.{k}", v) for k, v in asdict(self.params).items()]
        return pd.DataFrame(rows, columns=["field", "value"])

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    def text(self) -> str:
        """Human-readable table, as ``moescope inspect`` prints it."""
        p = self.params
        groups = f"{self.n_group} groups, top {self.topk_group} used" if self.n_group > 1 else "none"
        lines = [
            ("model", self.source),
            ("architecture", f"{self.architecture} ({self.model_type}, {self.model_class})"),
            ("dtype", self.dtype),
            ("layers", f"{self.num_layers} ({len(self.moe_layers)} MoE, {len(self.dense_layers)} dense)"),
            ("MoE layers", _ranges(self.moe_layers)),
            ("routed experts", f"{self.routed_experts} per MoE layer (config key {self.count_key})"),
            ("top-k", f"{self.top_k} (config key {self.topk_key})"),
            ("shared experts", str(self.shared_experts)),
            ("routing", self.routing),
            ("router bias", "yes" if self.router_bias else "no"),
            ("correction bias", "yes (selection only)" if self.correction_bias else "no"),
            ("groups", groups),
            ("expert FFN width", str(self.expert_intermediate_size)),
            ("hidden / vocab", f"{self.hidden_size} / {self.vocab_size}"),
            ("params total", _count(p.total)),
            ("  backbone", f"{_count(p.backbone)} (routers {_count(p.router)})"),
            ("  routed experts", f"{_count(p.routed_experts)} ({p.routed_experts / max(p.total, 1):.1%})"),
            ("  shared experts", _count(p.shared_experts)),
            ("  active per token", _count(p.active_per_token)),
        ]
        if self.notes:
            lines.append(("notes", self.notes))
        width = max(len(k) for k, _ in lines)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit} ({n:,})"
    return f"{n:,}"


def _ranges(indices: tuple[int, ...]) -> str:
    """``(1, 2, 3, 5)`` → ``1-3, 5``."""
    parts = []
    for _, run in itertools.groupby(enumerate(indices), key=lambda pair: pair[1] - pair[0]):
        values = [i for _, i in run]
        parts.append(str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}")
    return ", ".join(parts)


def count_params(moe: MoEModel) -> ParamCounts:
    """Split the model's parameters by role (tied parameters counted once)."""
    routed = {id(p) for layer in moe.layers for p in layer.experts.parameters()}
    router = {id(p) for layer in moe.layers for p in layer.router.parameters()}
    shared = {
        id(p)
        for layer in moe.layers
        for module in (layer.shared_experts, layer.shared_gate)
        if module is not None
        for p in module.parameters()
    }
    sizes = {"routed": 0, "router": 0, "shared": 0, "other": 0}
    for param in moe.model.parameters():  # yields each tied parameter once
        key = next(
            (
                k
                for k, ids in (("routed", routed), ("router", router), ("shared", shared))
                if id(param) in ids
            ),
            "other",
        )
        sizes[key] += param.numel()
    backbone = sizes["other"] + sizes["router"]
    active = backbone + sizes["shared"] + sizes["routed"] * moe.top_k // max(moe.num_experts, 1)
    return ParamCounts(
        total=backbone + sizes["routed"] + sizes["shared"],
        backbone=backbone,
        router=sizes["router"],
        routed_experts=sizes["routed"],
        shared_experts=sizes["shared"],
        active_per_token=active,
    )


def summarize(model: PreTrainedModel | PretrainedConfig | str | Path) -> ModelSummary:
    """Summarize a loaded model, a config, ``"toy"``, or a checkpoint directory (read without weights)."""
    from transformers import PretrainedConfig

    if isinstance(model, PretrainedConfig):
        return _summary(adapt(_meta_model(model)), source=model.model_type, dtype=_checkpoint_dtype(model))
    if isinstance(model, str | Path):
        config = load_config(model)
        check_weights(resolve_model(model))
        summary = _summary(adapt(_meta_model(config)), source=str(model), dtype=_checkpoint_dtype(config))
        if language_config(config) is not config:
            note = f"the language model of a {config.model_type} checkpoint; its other parts are not counted"
            summary = replace(summary, notes="; ".join(filter(None, (note, summary.notes))))
        return summary
    return _summary(
        adapt(model),
        source=getattr(model, "name_or_path", "") or type(model).__name__,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
    )


def _meta_model(config: PretrainedConfig) -> PreTrainedModel:
    import torch
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config)


def _checkpoint_dtype(config: PretrainedConfig) -> str:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "unknown"


def _summary(moe: MoEModel, *, source: str, dtype: str) -> ModelSummary:
    config, spec, first = moe.config, moe.spec, moe.layers[0]
    shared = 0
    if first.shared_experts is not None:
        shared = int(getattr(config, spec.shared_count_key, 1) or 1) if spec.shared_count_key else 1
    return ModelSummary(
        source=source,
        model_type=config.model_type,
        architecture=spec.name,
        model_class=type(moe.model).__name__,
        dtype=dtype,
        hidden_size=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        num_layers=moe.num_layers,
        moe_layers=tuple(moe.moe_indices),
        dense_layers=moe.dense_layers,
        routed_experts=moe.num_experts,
        top_k=moe.top_k,
        expert_intermediate_size=int(config_value(config, spec.intermediate_key)),
        shared_experts=shared,
        routing=describe(first.rule),
        router_bias=spec.router_bias is not None,
        correction_bias=first.correction_bias is not None,
        n_group=first.rule.n_group,
        topk_group=first.rule.topk_group,
        count_key=spec.count_key,
        topk_key=spec.topk_key,
        params=count_params(moe),
        notes=spec.notes,
    )
