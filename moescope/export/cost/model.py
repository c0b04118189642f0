"""Accelerator cost model: how many devices RL post-training of a model needs, full vs proxy.

A proxy keeps ``K`` of the ``E`` routed experts of every MoE layer (top-k unchanged), so it
drops the parameters of the cut experts and their router rows and nothing else. RL
post-training memory grows with the parameter count, state by state (bytes per parameter,
all overridable in :class:`TrainingMemory`):

=====================  =====  ===============================================================
state                  bytes  why
=====================  =====  ===============================================================
policy weights         2      bf16 weights the trainer runs forward and backward with
gradients              2      bf16 gradients
fp32 master weights    4      the optimizer updates an fp32 copy (mixed precision)
Adam m and v           8      two fp32 moments
frozen reference       2      bf16 reference policy for the KL term
rollout-engine copy    2      bf16 weights of the inference engine that generates rollouts
=====================  =====  ===============================================================

20 bytes per parameter in all. Of each device's memory (``device_memory_gb`` × ``usable_fraction``),
``activation_fraction`` is held back for activations and ``kv_cache_fraction`` for the rollout
engine's KV cache; the rest holds state. Devices = ⌈params × bytes per param / state per
device⌉, then optionally rounded up to a whole node of 8 (``rounding="node"``) or a power of
two (``"pow2"``). GB means 10⁹ bytes.

What the model ignores: activation and KV-cache memory really depend on batch, sequence
length and recomputation (here they are fixed fractions); it assumes every state is sharded
evenly over all devices and resident at once (ZeRO-3/FSDP with a colocated rollout engine, no
offloading, no parallelism overheads or replicated layers). And what a proxy does **not** save:
per-token compute. Top-k is unchanged, so every token still runs ``top_k`` experts
(``params_active`` hardly moves). With the same batch a compute-bound step on fewer devices
takes longer; device-hours per step (devices × step time) fall by the device ratio only if the
step time stays equal — pass measured step times per row to see the real figure.

Parameters are counted exactly for a Hugging Face config (the model is built on the ``meta``
device, no weight read; :mod:`moescope.models.summary`) and by the analytic formulas of
:func:`analytic_params` for the published models of ``moescope/data/moe_configs.json``.

Examples
--------
>>> table = cost_table(reference_models()[5])  # DeepSeek-V3
>>> table["experts"].tolist(), table["devices"].tolist(), table["reduction_pct"].round(1).tolist()
([256, 128, 64, 32], [267, 137, 72, 40], [0.0, 48.7, 73.0, 85.0])
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.io import read_json_object
from moescope.errors import MoescopeError
from moescope.export.cost.formulas import analytic_params, entry_from_config, field_of

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PretrainedConfig

    from moescope.models.summary import ModelSummary, ParamCounts

DEFAULT_KEEPS = ("1/2", "1/4", "1/8")
ROUNDINGS = ("device", "node", "pow2")
NODE_SIZE = 8  # accelerators per node, for rounding="node"
GB = 1e9
PROXY_NOTE = (
    "A proxy keeps top-k, so per-token compute (active parameters) stays: device-hours per step "
    "fall by the device ratio only if the step time stays equal."
)
STATES = {  # TrainingMemory field -> how the text output names it
    "policy_weights": "bf16 weights",
    "gradients": "bf16 grads",
    "master_weights": "fp32 master",
    "adam_states": "Adam m+v",
    "reference_model": "reference",
    "rollout_weights": "rollout copy",
}


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

    @classmethod
    def from_config(
        cls, source: PretrainedConfig | Mapping[str, Any] | str | Path, *, exact: bool = True
    ) -> ModelShape:
        """The shape of a checkpoint directory, ``"toy"``, a ``config.json``, a config or an entry.

        A Hugging Face config is counted exactly by default (``exact=False``: the analytic
        formulas); a ``moe_configs.json`` entry (a dict with ``routed_experts``) analytically. A
        multimodal config is costed by its text model (the vision tower is not counted).
        """
        if isinstance(source, str | Path):
            data, name = _read_source(source)
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
            return cls._from_hf(_hf_config(data, name), name, exact)
        if "routed_experts" in data:
            return cls.from_entry({"name": name, **data} if name and not data.get("name") else data)
        raise _not_a_config(name or "the mapping")

    @classmethod
    def _from_hf(cls, config: PretrainedConfig, name: str | None, exact: bool) -> ModelShape:
        config, note = _moe_text_config(config)
        name = name or getattr(config, "name_or_path", "") or config.model_type
        if not exact:
            entry = entry_from_config(config)
            return replace(cls.from_entry({**entry, "name": name}), note=note)
        summary = _meta_summary(config, name)
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
        )

    def with_keep(self, keep: str | float | int) -> ModelShape:
        """The proxy keeping ``keep`` routed experts per layer (``"1/4"``, ``0.25`` or a count).

        The cut experts' parameters and router rows go; backbone, shared experts and top-k stay.
        The keep is checked like every moescope keep (:func:`moescope.keep.parse_keep`).
        """
        from moescope.keep import parse_keep

        e = self.routed_experts
        kept = parse_keep(keep, e, self.top_k, self.n_group, topk_group=self.topk_group)
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read_source(source: str | Path) -> tuple[dict[str, Any], str]:
    """The JSON of ``"toy"``, a checkpoint directory or a config file, and a name for it."""
    from moescope.models.loading import TOY, resolve_model

    if str(source) == TOY:
        return _read_json(resolve_model(TOY) / "config.json"), TOY
    path = Path(source).expanduser()
    if not path.exists():
        raise MoescopeError(
            f"no such file or directory: {path}; pass a checkpoint directory, a config.json or 'toy'."
        )
    if path.is_dir():
        return _read_json(resolve_model(path) / "config.json"), path.name
    data = _read_json(path)
    if "model_type" not in data and "routed_experts" not in data:
        raise _not_a_config(str(path))
    return data, path.parent.name if path.name == "config.json" else path.stem


def _not_a_config(what: str) -> MoescopeError:
    return MoescopeError(
        f"{what} is not a model config: it has neither 'model_type' (a Hugging Face config.json) nor "
        "'routed_experts' (a moe_configs.json entry); pass a checkpoint's config.json."
    )


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json_object(path, "pass a model's config.json")
    if "models" in data and "model_type" not in data:
        raise MoescopeError(
            f"{path} lists several models; pass one model's config.json, or --reference for moescope's list."
        )
    return data


def _hf_config(data: Mapping[str, Any], name: str | None) -> PretrainedConfig:
    from transformers import CONFIG_MAPPING

    from moescope.models.arch import supported_architectures

    model_type = str(data["model_type"])
    if model_type not in CONFIG_MAPPING:
        raise MoescopeError(
            f"model_type '{model_type}' is not a transformers architecture; pass the config of a stock "
            f"transformers MoE model, one of: {', '.join(supported_architectures())}."
        )
    from huggingface_hub.errors import StrictDataclassError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config_class = CONFIG_MAPPING[model_type]
            # config.json spells inf/nan as {"__float__": "Infinity"}; decode them as from_pretrained does
            return config_class.from_dict(config_class._decode_special_floats(dict(data)))
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        why = str(exc).splitlines()[0]
        raise MoescopeError(f"transformers cannot read the config of {name or model_type} ({why}).") from None


def _moe_text_config(config: PretrainedConfig) -> tuple[PretrainedConfig, str]:
    """The config itself, or the text model of a multimodal one; checked to be a supported MoE."""
    from moescope.models.arch import language_config

    text = language_config(config, loadable=False)  # a dense or unknown model fails here, in one sentence
    if text is config:
        return config, ""
    return text, f"text model of {config.model_type} only; the vision tower is not counted"


def _meta_summary(config: PretrainedConfig, name: str) -> ModelSummary:
    from moescope.models.summary import summarize

    try:
        return summarize(config)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
        raise MoescopeError(f"transformers cannot build {name} from its config ({exc}).") from None


def reference_entries() -> list[dict[str, Any]]:
    """The entries of ``moescope/data/moe_configs.json``: published configs of 12 MoE models.

    A copy of the project's reference table, shipped in the package (offline, works from a
    wheel); each entry has the publisher's total and active parameter counts.
    """
    text = resources.files("moescope").joinpath("data/moe_configs.json").read_text()
    return json.loads(text)["models"]


def reference_models() -> list[ModelShape]:
    """The reference models as :class:`ModelShape`, counted by :func:`analytic_params`.

    Examples
    --------
    >>> [m.name for m in reference_models()][:2]
    ['Mixtral-8x7B', 'Mixtral-8x22B']
    """
    return [ModelShape.from_entry(entry) for entry in reference_entries()]


# --- memory and devices ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per parameter of each RL training state, and the device they must fit on.

    See the module docstring for the table of defaults and what the model ignores.

    Examples
    --------
    >>> m = TrainingMemory(device_memory_gb=64)  # e.g. an accelerator with 64 GB
    >>> m.bytes_per_param, round(m.state_gb_per_device, 2)
    (20.0, 40.32)
    """

    policy_weights: float = 2.0
    gradients: float = 2.0
    master_weights: float = 4.0
    adam_states: float = 8.0
    reference_model: float = 2.0
    rollout_weights: float = 2.0
    activation_fraction: float = 0.2  # of usable memory, for activations
    kv_cache_fraction: float = 0.1  # of usable memory, for the rollout engine's KV cache
    device_memory_gb: float = 80.0
    usable_fraction: float = 0.9  # what the framework can allocate (runtime, fragmentation)

    def __post_init__(self) -> None:
        if not self.device_memory_gb > 0:
            raise MoescopeError(
                f"device memory must be a positive number of GB, not {self.device_memory_gb}; "
                "pass the accelerator's memory, e.g. 80."
            )
        if not 0 < self.usable_fraction <= 1:
            raise MoescopeError(f"usable fraction {self.usable_fraction} is not in (0, 1]; pass e.g. 0.9.")
        headroom = self.activation_fraction + self.kv_cache_fraction
        if min(self.activation_fraction, self.kv_cache_fraction) < 0 or headroom >= 1:
            raise MoescopeError(
                f"activation and KV-cache fractions must be non-negative and leave room for state "
                f"(they sum to {headroom}); lower them."
            )
        if any(getattr(self, key) < 0 for key in STATES):
            raise MoescopeError(
                "bytes per parameter must not be negative; pass 0 for a state you do not keep."
            )

    @property
    def bytes_per_param(self) -> float:
        return float(sum(getattr(self, key) for key in STATES))

    @property
    def state_gb_per_device(self) -> float:
        """GB of one device left for parameter state after the activation and KV-cache headroom."""
        usable = self.device_memory_gb * self.usable_fraction
        return usable * (1 - self.activation_fraction - self.kv_cache_fraction)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "bytes_per_param": self.bytes_per_param,
            "state_gb_per_device": self.state_gb_per_device,
        }

    def text(self) -> str:
        """One line: the bytes per parameter and the memory of one device."""
        parts = ", ".join(f"{label} {getattr(self, key):g}" for key, label in STATES.items())
        return (
            f"state {self.bytes_per_param:g} B/param ({parts}); {self.device_memory_gb:g} GB devices, "
            f"{self.usable_fraction:.0%} usable, less {self.activation_fraction:.0%} activations and "
            f"{self.kv_cache_fraction:.0%} rollout KV cache: {self.state_gb_per_device:.1f} GB of state "
            "per device."
        )


def memory_breakdown(shape: ModelShape, memory: TrainingMemory | None = None) -> dict[str, float]:
    """GB of each training state for the whole model, their total, and one device's budget.

    Examples
    --------
    >>> b = memory_breakdown(reference_models()[0])  # Mixtral-8x7B
    >>> round(b["adam_states"]), round(b["state_total"])
    (374, 934)
    """
    memory = memory or TrainingMemory()
    states = {key: shape.params_total * getattr(memory, key) / GB for key in STATES}
    usable = memory.device_memory_gb * memory.usable_fraction
    return states | {
        "state_total": sum(states.values()),
        "device_usable": usable,
        "device_activations": usable * memory.activation_fraction,
        "device_kv_cache": usable * memory.kv_cache_fraction,
        "device_state": memory.state_gb_per_device,
    }


def devices_needed(shape: ModelShape, memory: TrainingMemory | None = None, rounding: str = "device") -> int:
    """Accelerators whose state budget holds every training state of ``shape``.

    ``⌈params × bytes per param / state GB per device⌉``, rounded up to a multiple of
    ``NODE_SIZE`` (``rounding="node"``) or a power of two (``"pow2"``) when asked.

    Examples
    --------
    >>> devices_needed(reference_models()[0]), devices_needed(reference_models()[0], rounding="node")
    (19, 24)
    """
    if rounding not in ROUNDINGS:
        raise MoescopeError(f"rounding {rounding!r} is not one of {', '.join(ROUNDINGS)}.")
    memory = memory or TrainingMemory()
    state_gb = shape.params_total * memory.bytes_per_param / GB
    devices = max(1, math.ceil(state_gb / memory.state_gb_per_device - 1e-9))
    if rounding == "node":
        return math.ceil(devices / NODE_SIZE) * NODE_SIZE
    if rounding == "pow2":
        return 1 << (devices - 1).bit_length()
    return devices


# --- the table ---------------------------------------------------------------------------------

COLUMNS = (
    "model",
    "keep",
    "experts",
    "top_k",
    "params_total",
    "params_routed",
    "params_active",
    "state_gb",
    "devices",
    "reduction_pct",
    "step_time_s",
    "device_hours",
    "note",
)
_INTEGER_COLUMNS = ("experts", "top_k", "params_total", "params_routed", "params_active", "devices")


def cost_table(
    model: ModelShape | PretrainedConfig | Mapping[str, Any] | str | Path,
    keeps: Sequence[str | float | int] = DEFAULT_KEEPS,
    *,
    memory: TrainingMemory | None = None,
    step_time_s: float | Mapping[str, float] | None = None,
    rounding: str = "device",
    strict: bool = True,
) -> pd.DataFrame:
    """Devices and cost of RL-training the full model and its proxies, one row each.

    Parameters
    ----------
    model : a :class:`ModelShape`, or anything :meth:`ModelShape.from_config` reads.
    keeps : proxies to cost, in moescope's keep grammar (``"1/4"``, ``0.25``, ``8``).
    step_time_s : seconds per RL step, one for every row (the best case for a proxy), or
        measured per row, keyed by ``"full"`` and the keeps as given (``{"full": 610, "1/2": 480}``).
    strict : raise on a keep the model's routing does not allow; else keep the row, empty
        but for ``note`` (which, on the full row, carries the model's own note).

    Returns
    -------
    One row per configuration (``COLUMNS``): ``reduction_pct`` is ``100·(1 − devices /
    full devices)``, ``device_hours`` is devices × step time / 3600 (NaN without a step time).

    Examples
    --------
    >>> t = cost_table("toy", step_time_s=60.0)
    >>> list(t["keep"]), int(t["devices"].iloc[0]), round(float(t["device_hours"].iloc[0]), 4)
    (['full', '1/2', '1/4', '1/8'], 1, 0.0167)
    """
    import pandas as pd

    shape = model if isinstance(model, ModelShape) else ModelShape.from_config(model)
    memory = memory or TrainingMemory()
    full = devices_needed(shape, memory, rounding)
    rows = [_row(shape, "full", full, full, memory, _step_time(step_time_s, "full"))]
    for keep in keeps:
        label = str(keep)
        try:
            proxy = shape.with_keep(keep)
        except MoescopeError as exc:
            if strict:
                raise
            rows.append({"model": shape.name, "keep": label, "top_k": shape.top_k, "note": str(exc)})
            continue
        devices = devices_needed(proxy, memory, rounding)
        rows.append(_row(proxy, label, devices, full, memory, _step_time(step_time_s, label)))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["note"] = frame["note"].fillna("")
    return frame.astype({column: "Int64" for column in _INTEGER_COLUMNS})


def _step_time(step_time_s: float | Mapping[str, float] | None, label: str) -> float:
    value = step_time_s.get(label) if isinstance(step_time_s, Mapping) else step_time_s
    if value is None:
        return math.nan
    if not value > 0:
        raise MoescopeError(f"step time {value} s is not positive; pass the seconds one RL step takes.")
    return float(value)


def _row(
    shape: ModelShape, label: str, devices: int, full: int, memory: TrainingMemory, step_time: float
) -> dict[str, Any]:
    return {
        "model": shape.name,
        "keep": label,
        "experts": shape.routed_experts,
        "top_k": shape.top_k,
        "params_total": shape.params_total,
        "params_routed": shape.params_routed,
        "params_active": shape.params_active,
        "state_gb": shape.params_total * memory.bytes_per_param / GB,
        "devices": devices,
        "reduction_pct": 100.0 * (1 - devices / full),
        "step_time_s": step_time,
        "device_hours": devices * step_time / 3600,
        "note": shape.note if label == "full" else "",
    }


def reference_table(
    keeps: Sequence[str | float | int] = DEFAULT_KEEPS,
    *,
    memory: TrainingMemory | None = None,
    step_time_s: float | None = None,
    rounding: str = "device",
) -> pd.DataFrame:
    """:func:`cost_table` of every reference model, stacked; a keep a model cannot take is noted.

    Examples
    --------
    >>> t = reference_table()
    >>> reduction = t.pivot(index="model", columns="keep", values="reduction_pct")
    >>> reduction.loc["DeepSeek-V3", ["1/2", "1/4", "1/8"]].round(1).tolist()
    [48.7, 73.0, 85.0]
    """
    import pandas as pd

    tables = [
        cost_table(shape, keeps, memory=memory, step_time_s=step_time_s, rounding=rounding, strict=False)
        for shape in reference_models()
    ]
    return pd.concat(tables, ignore_index=True)


# --- output -----------------------------------------------------------------------------------


def cost_json(
    table: pd.DataFrame, memory: TrainingMemory | None = None, rounding: str = "device"
) -> dict[str, Any]:
    """The table as JSON-ready data: the memory assumptions, the rounding and one record per row."""
    records = table.astype(object).where(table.notna(), None).to_dict("records")
    return {"memory": (memory or TrainingMemory()).to_dict(), "rounding": rounding, "rows": records}


def cost_text(table: pd.DataFrame, memory: TrainingMemory | None = None, rounding: str = "device") -> str:
    """The table as ``moescope cost`` prints it: a block per model, then the assumptions."""
    blocks = [_model_text(group) for _, group in table.groupby("model", sort=False)]
    assumptions = (memory or TrainingMemory()).text()
    if rounding != "device":
        assumptions += f" Devices rounded up to a {'node of 8' if rounding == 'node' else 'power of two'}."
    return "\n\n".join([*blocks, assumptions, PROXY_NOTE])


def _model_text(group: pd.DataFrame) -> str:
    full = group.iloc[0]
    share = full["params_routed"] / full["params_total"]
    header = (
        f"{full['model']}: {_short(full['params_total'])} parameters ({share:.0%} in routed experts), "
        f"{full['experts']} routed experts per MoE layer, top-{full['top_k']}"
    )
    head = ["keep", "experts", "params", "active", "state GB", "devices", "reduction", "device-h/step"]
    rows = [head] + [_cells(row) for _, row in group.iterrows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  " + "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    notes = [f"  {row['keep']}: {row['note']}" for _, row in group.iterrows() if row["note"]]
    return "\n".join([header, *lines, *notes])


def _cells(row: pd.Series) -> list[str]:
    if row.isna()["devices"]:  # a keep the model's routing does not allow
        return [row["keep"], *["-"] * 7]
    reduction = "-" if row["keep"] == "full" else f"{row['reduction_pct']:.1f}%"
    hours = "-" if math.isnan(row["device_hours"]) else _num(row["device_hours"])
    return [
        row["keep"],
        str(row["experts"]),
        _short(row["params_total"]),
        _short(row["params_active"]),
        _num(row["state_gb"]),
        str(row["devices"]),
        reduction,
        hours,
    ]


def _num(x: float) -> str:
    """``13,420.5`` for large numbers, three significant digits for small ones."""
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def _short(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
