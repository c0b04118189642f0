"""The records a proxy's manifest carries: :class:`Fidelity`, the checklist's :class:`Check`
and the :class:`HealingReport`, and :func:`manifest_sections`, the entries of ``moescope.json``
they become.

Plain results with ``to_dict`` / ``from_dict`` / ``save`` / ``load`` and no measurement:
:mod:`~moescope.export.fidelity.measure`, :mod:`~moescope.export.fidelity.validity` and
:mod:`moescope.export.healing` compute them, and each imports its types from here rather than
from another of the three.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moescope import schema
from moescope._util.records import check_kind, jsonable, read_record, write_record

__all__ = [
    "DISTANCE",
    "Check",
    "Fidelity",
    "HealingReport",
    "accuracy_frame",
    "layer_shares",
    "manifest_sections",
]

DISTANCE = "total_variation"
"""The routing distance: half the L1 distance between two load distributions, in [0, 1]."""


# --- the checklist --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One property of the checklist: ``passed``, the ``figure`` that says why, and the evidence."""

    name: str
    passed: bool
    figure: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- fidelity -------------------------------------------------------------------------------------


_FIDELITY_KIND = "moescope.fidelity"
_FIDELITY_FIX = "pass a file written by Fidelity.save, or measure the fidelity again"


@dataclass(frozen=True, eq=False)
class Fidelity:
    """Proxy vs original on the same held-out tokens.

    Attributes
    ----------
    n_tokens : positions scored: the answer and end-of-sequence tokens of task data, every real
        token after the first of a row otherwise.
    kl : mean next-token ``KL(original ‖ proxy)``, nats.
    top1_agreement : share of positions whose most likely next token is the same.
    perplexity_original, perplexity_proxy, perplexity_ratio : on the scored tokens; the ratio
        is proxy / original (1 = as good, above 1 = worse).
    task_accuracy : per task and mode (``greedy`` / ``sampled``): ``n``, ``original``,
        ``proxy`` accuracy and, for sampled, the ``*_mixed`` share of prompts with mixed
        results (GRPO groups with a signal); ``None`` when no tasks apply.
    routing_distance : MoE layer → total variation distance (:data:`DISTANCE`) between the
        original's routed-slot shares over the kept experts (renormalized) and the proxy's.
    routing_coverage : MoE layer → share of the original's routed slots on kept experts.
    routing_shares : per (layer, original expert): ``kept``, the ``original`` share over all
        experts, ``original_kept`` (renormalized over the kept) and ``proxy`` (NaN if dropped);
        the data of an original-vs-proxy routing histogram.
    data : what the held-out tokens were.
    settings : the arguments that produced the figures (token budget, tasks, samples, seed).
    """

    n_tokens: int
    kl: float
    top1_agreement: float
    perplexity_original: float
    perplexity_proxy: float
    perplexity_ratio: float
    task_accuracy: pd.DataFrame | None
    routing_distance: dict[int, float]
    routing_coverage: dict[int, float]
    routing_shares: pd.DataFrame
    data: str = ""
    settings: dict[str, Any] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """The fidelity table, long form: ``figure, layer, task, mode, original, proxy, value``.

        ``value`` is the figure itself (KL, agreement, perplexity ratio, accuracy ratio proxy /
        original, routing distance or coverage); ``original`` / ``proxy`` hold the two sides
        where a figure compares two numbers.
        """
        nan = math.nan
        rows = [
            ("kl", None, None, None, nan, nan, self.kl),
            ("top1_agreement", None, None, None, nan, nan, self.top1_agreement),
            ("perplexity", None, None, None, self.perplexity_original, self.perplexity_proxy,
             self.perplexity_ratio),
        ]  # fmt: skip
        if self.task_accuracy is not None:
            for r in self.task_accuracy.itertuples():
                rows.append(
                    ("accuracy", None, r.task, r.mode, r.original, r.proxy, _ratio(r.proxy, r.original))
                )
        for name, figures in (
            ("routing_distance", self.routing_distance),
            ("routing_coverage", self.routing_coverage),
        ):
            rows += [(name, layer, None, None, nan, nan, value) for layer, value in figures.items()]
        columns = ["figure", schema.LAYER, schema.TASK, "mode", "original", "proxy", "value"]
        frame = pd.DataFrame(rows, columns=columns)
        frame[schema.LAYER] = frame[schema.LAYER].astype("Int64")
        return frame

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (non-finite numbers as ``None``): what the manifest stores."""
        shares = self.routing_shares
        layers = []
        for layer, rows in shares.groupby(schema.LAYER, sort=True):
            kept = rows[rows["kept"]]
            layers.append({
                schema.LAYER: int(layer),
                "kept": kept[schema.EXPERT].tolist(),
                "original": rows["original"].tolist(),
                "proxy": kept["proxy"].tolist(),
            })  # fmt: skip
        out = {
            "kind": _FIDELITY_KIND,
            "schema_version": schema.SCHEMA_VERSION,
            "n_tokens": self.n_tokens,
            "kl": self.kl,
            "top1_agreement": self.top1_agreement,
            "perplexity_original": self.perplexity_original,
            "perplexity_proxy": self.perplexity_proxy,
            "perplexity_ratio": self.perplexity_ratio,
            "routing_distance_kind": DISTANCE,
            "routing_distance": {str(k): v for k, v in self.routing_distance.items()},
            "routing_coverage": {str(k): v for k, v in self.routing_coverage.items()},
            "routing_shares": layers,
            "task_accuracy": None if self.task_accuracy is None else self.task_accuracy.to_dict("records"),
            "data": self.data,
            "settings": self.settings,
        }
        return jsonable(out)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Fidelity:
        """The inverse of :meth:`to_dict`."""
        check_kind(d, _FIDELITY_KIND, _FIDELITY_FIX)
        accuracy = None
        if d["task_accuracy"] is not None:
            accuracy = accuracy_frame(pd.DataFrame.from_records(d["task_accuracy"]))
        return cls(
            n_tokens=int(d["n_tokens"]),
            **{name: _float(d[name]) for name in _SCALARS},
            task_accuracy=accuracy,
            routing_distance={int(k): _float(v) for k, v in d["routing_distance"].items()},
            routing_coverage={int(k): _float(v) for k, v in d["routing_coverage"].items()},
            routing_shares=_shares_from_lists(d["routing_shares"]),
            data=d.get("data", ""),
            settings=d.get("settings", {}),
        )

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (temporary sibling, then rename)."""
        return write_record(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Fidelity:
        """Read a file written by :meth:`save`."""
        return cls.from_dict(read_record(path, _FIDELITY_KIND, _FIDELITY_FIX))


_SCALARS = ("kl", "top1_agreement", "perplexity_original", "perplexity_proxy", "perplexity_ratio")
_ACCURACY_COLUMNS = ["task", "mode", "n", "original", "proxy", "original_mixed", "proxy_mixed"]


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def accuracy_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The columns of :attr:`Fidelity.task_accuracy`, in order and with their dtypes."""
    frame = frame.reindex(columns=_ACCURACY_COLUMNS)
    numbers = ["original", "proxy", "original_mixed", "proxy_mixed"]
    frame[numbers] = frame[numbers].astype(float)
    frame["n"] = frame["n"].astype(int)
    return frame


def _shares_from_lists(layers: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for entry in layers:
        kept = entry["kept"]
        original = np.asarray([_float(v) for v in entry["original"]])
        proxy = dict(zip(kept, (_float(v) for v in entry["proxy"]), strict=True))
        rows.append(layer_shares(entry[schema.LAYER], original, kept, proxy))
    return pd.concat(rows, ignore_index=True) if rows else layer_shares(0, np.zeros(0), [], {})


def layer_shares(
    layer: int, original: np.ndarray, kept: Sequence[int], proxy: dict[int, float]
) -> pd.DataFrame:
    """One layer's rows of :attr:`Fidelity.routing_shares` from the original's shares over all
    experts, the kept ids and the proxy's share per kept id."""
    is_kept = np.isin(np.arange(len(original)), kept)
    mass = original[is_kept].sum()
    return pd.DataFrame({
        schema.LAYER: layer,
        schema.EXPERT: np.arange(len(original)),
        "kept": is_kept,
        "original": original,
        "original_kept": np.where(is_kept, original / mass if mass else np.nan, np.nan),
        "proxy": [proxy.get(e, np.nan) for e in range(len(original))],
    })  # fmt: skip


# --- healing --------------------------------------------------------------------------------------


_HEALING_KIND = "moescope.healing"
_HEALING_FIX = "pass a file written by HealingReport.save, or heal again"


@dataclass(frozen=True, eq=False)
class HealingReport:
    """What :func:`~moescope.export.healing.heal` did and what it changed.

    Attributes
    ----------
    steps, lr, seed, batch_size : the run (Adam, cosine decay to 0, gradient clip 1.0).
    n_tokens : real tokens of calibration data trained on.
    loss : training KL (nats) at every step.
    kl_before, kl_after, top1_before, top1_after : next-token KL to the original and top-1
        agreement on held-out data, before and after.
    accuracy : per task and mode the proxy's accuracy ``before`` and ``after`` (and the
        original's), or ``None`` when no tasks apply.
    trained : names of the tensors trained (router rows and biases, kept experts).
    frozen_verified : tensors verified bit-identical after training.
    data, heldout : what the calibration data and the held-out data were.
    capability : healing in rounds toward a capability target (``moescope heal
        --min-capability``): the target, the steps between measurements, each round's ratio,
        whether it was reached; ``None`` otherwise.
    """

    steps: int
    lr: float
    seed: int
    batch_size: int
    n_tokens: int
    loss: tuple[float, ...]
    kl_before: float
    kl_after: float
    top1_before: float
    top1_after: float
    accuracy: pd.DataFrame | None
    trained: tuple[str, ...]
    frozen_verified: int
    data: str = ""
    heldout: str = ""
    capability: dict[str, Any] | None = None

    def to_frame(self) -> pd.DataFrame:
        """The training curve, long form: ``step, loss``."""
        return pd.DataFrame({schema.STEP: range(len(self.loss)), "loss": self.loss})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (non-finite numbers as ``None``): what the manifest stores."""
        out = {name: getattr(self, name) for name in _FIELDS}
        out["loss"] = list(self.loss)
        out["trained"] = list(self.trained)
        out["accuracy"] = None if self.accuracy is None else self.accuracy.to_dict("records")
        if self.capability is not None:
            out["capability"] = self.capability
        return jsonable({"kind": _HEALING_KIND, "schema_version": schema.SCHEMA_VERSION, **out})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HealingReport:
        """The inverse of :meth:`to_dict`."""
        check_kind(d, _HEALING_KIND, _HEALING_FIX)
        values = {name: d[name] for name in _FIELDS}
        values["loss"] = tuple(math.nan if v is None else float(v) for v in d["loss"])
        values["trained"] = tuple(d["trained"])
        values["accuracy"] = None if d["accuracy"] is None else pd.DataFrame.from_records(d["accuracy"])
        return cls(**values, capability=d.get("capability"))

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (temporary sibling, then rename)."""
        return write_record(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> HealingReport:
        """Read a file written by :meth:`save`."""
        return cls.from_dict(read_record(path, _HEALING_KIND, _HEALING_FIX))


_FIELDS = (
    "steps", "lr", "seed", "batch_size", "n_tokens", "loss", "kl_before", "kl_after", "top1_before",
    "top1_after", "accuracy", "trained", "frozen_verified", "data", "heldout",
)  # fmt: skip


# --- the manifest ---------------------------------------------------------------------------------


def manifest_sections(
    fidelity: Fidelity | None = None,
    checklist: Sequence[Check] | None = None,
    healing: HealingReport | None = None,
) -> dict[str, Any]:
    """The ``fidelity``, ``checklist`` and ``healing`` entries of ``moescope.json`` (given ones only)."""
    sections: dict[str, Any] = {}
    if fidelity is not None:
        sections["fidelity"] = fidelity.to_dict()
    if checklist is not None:
        sections["checklist"] = [jsonable(check.to_dict()) for check in checklist]
    if healing is not None:
        sections["healing"] = healing.to_dict()
    return sections
