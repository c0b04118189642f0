"""Fidelity of a proxy: how closely it follows the original on the same held-out tokens.

:func:`measure_fidelity` runs both models over one set of held-out token batches and reports

- **next-token KL** ``KL(original ‖ proxy)`` in nats, the mean over scored positions (the
  answer and end-of-sequence tokens of task data, every token of other data);
- **top-1 agreement**, the share of positions where both models' most likely token is the same;
- **perplexity** of each model on the scored tokens, and their ratio (proxy / original);
- **task accuracy** of both: the toy task suite (greedy and sampled) or a user's JSON Lines of
  prompts and answers (greedy), by exact match;
- **routing distance** per MoE layer: the total variation distance (half the L1 distance, 0 =
  the same, 1 = disjoint) between the original's share of routed slots *restricted to the kept
  experts and renormalized* and the proxy's share, both from the routing observer of the same
  pass; beside it the **coverage**, the share of the original's routed slots that went to kept
  experts.

The default data, ``"tasks"``, is the fixed held-out pool of every task family (prompt, answer
and end-of-sequence, families interleaved): never in a training stream, in export's
calibration pass or in healing, and the same for every selection method, so figures of
different proxies of one model compare. With a given seed every figure is deterministic.

:func:`validity_checklist` (from :mod:`moescope.export.fidelity.validity`) turns a :class:`Fidelity` and the
two models into the three pass/fail properties a proxy must keep; :func:`record_in_manifest`
writes both into the proxy's ``moescope.json``.

Example
-------
>>> from moescope.models.toy import load_toy
>>> from moescope.explore.clustering import select_experts
>>> from moescope.export.surgery import build_proxy
>>> model, tok = load_toy()
>>> proxy = build_proxy(model, select_experts(model, "1/2", method="random"))
>>> fid = measure_fidelity(model, proxy, tokenizer=tok, n_tokens=512, tasks=())
>>> fid.kl > 0 and 0 < fid.top1_agreement <= 1
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moescope import schema
from moescope._util.records import check_kind, jsonable, read_record, write_record
from moescope.errors import MoescopeError
from moescope.explore.calibration import TASKS, describe_source
from moescope.export.fidelity.agreement import heldout_batches, next_token_agreement
from moescope.export.fidelity.validity import (
    BACKBONE,
    CAPABILITY,
    ROUTING,
    WINDOW,
    Check,
    checklist_frame,
    kept_experts,
    validity_checklist,
)
from moescope.export.manifest import MANIFEST, read_manifest
from moescope.models.accuracy import TaskSpec, model_accuracy, resolve_tasks

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.explore.routing import RoutingStats
    from moescope.explore.selection import Selection
    from moescope.export.healing import HealingReport

__all__ = [
    "BACKBONE",
    "CAPABILITY",
    "DISTANCE",
    "ROUTING",
    "WINDOW",
    "Check",
    "Fidelity",
    "checklist_frame",
    "manifest_sections",
    "measure_fidelity",
    "record_in_manifest",
    "validity_checklist",
]

DISTANCE = "total_variation"
"""The routing distance: half the L1 distance between two load distributions, in [0, 1]."""
_KIND = "moescope.fidelity"
_FIX = "pass a file written by Fidelity.save, or measure the fidelity again"


# --- the result ------------------------------------------------------------------------------------


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
            "kind": _KIND,
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
        check_kind(d, _KIND, _FIX)
        accuracy = None
        if d["task_accuracy"] is not None:
            accuracy = _accuracy_frame(pd.DataFrame.from_records(d["task_accuracy"]))
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
        return cls.from_dict(read_record(path, _KIND, _FIX))


_SCALARS = ("kl", "top1_agreement", "perplexity_original", "perplexity_proxy", "perplexity_ratio")
_ACCURACY_COLUMNS = ["task", "mode", "n", "original", "proxy", "original_mixed", "proxy_mixed"]


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _accuracy_frame(frame: pd.DataFrame) -> pd.DataFrame:
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
        rows.append(_layer_shares(entry[schema.LAYER], original, kept, proxy))
    return pd.concat(rows, ignore_index=True) if rows else _layer_shares(0, np.zeros(0), [], {})


# --- routing --------------------------------------------------------------------------------------


def _layer_shares(
    layer: int, original: np.ndarray, kept: Sequence[int], proxy: dict[int, float]
) -> pd.DataFrame:
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


def routing_shares(
    original: RoutingStats, proxy: RoutingStats, kept: dict[int, tuple[int, ...]]
) -> pd.DataFrame:
    """Per (MoE layer, original expert) routed-slot shares of both models; see :class:`Fidelity`."""
    frames = []
    for row, layer in enumerate(original.layers):
        proxy_row = proxy.load_share[proxy.layer_index(layer)]
        frames.append(
            _layer_shares(
                layer, original.load_share[row], kept[layer], dict(zip(kept[layer], proxy_row, strict=True))
            )
        )
    return pd.concat(frames, ignore_index=True)


def _routing_figures(shares: pd.DataFrame) -> tuple[dict[int, float], dict[int, float]]:
    """Per layer: total variation distance over the kept experts, and coverage."""
    distance, coverage = {}, {}
    for layer, rows in shares.groupby(schema.LAYER, sort=True):
        kept = rows[rows["kept"]]
        distance[int(layer)] = 0.5 * float(np.abs(kept["original_kept"] - kept["proxy"]).sum())
        coverage[int(layer)] = float(kept["original"].sum())
    return distance, coverage


# --- task accuracy ---------------------------------------------------------------------------------


def task_accuracy(
    original: PreTrainedModel,
    proxy: PreTrainedModel,
    tokenizer: Any,
    tasks: TaskSpec,
    *,
    n_prompts: int = 100,
    samples: int = 4,
    seed: int = 0,
) -> pd.DataFrame | None:
    """Accuracy of both models on the same prompts (:data:`~moescope.models.accuracy.TaskSpec`);
    ``None`` when no task applies. Columns: see :attr:`Fidelity.task_accuracy`."""
    kw = {"n_prompts": n_prompts, "samples": samples, "seed": seed}
    return _both_accuracies(original, proxy, tokenizer, resolve_tasks(tasks, original), kw)


def _both_accuracies(
    original: PreTrainedModel, proxy: PreTrainedModel, tokenizer: Any, resolved: Any, kw: dict[str, Any]
) -> pd.DataFrame | None:
    if resolved is None:
        return None
    first, second = (model_accuracy(m, tokenizer, resolved, **kw) for m in (original, proxy))
    return pair_accuracy(first, second)


def pair_accuracy(original: pd.DataFrame, proxy: pd.DataFrame) -> pd.DataFrame:
    """Two :func:`~moescope.models.accuracy.model_accuracy` frames side by side."""
    frame = original.rename(columns={"accuracy": "original", "mixed": "original_mixed"})
    frame["proxy"] = proxy["accuracy"].to_numpy()
    frame["proxy_mixed"] = proxy["mixed"].to_numpy()
    return _accuracy_frame(frame)


def _describe_tasks(tasks: TaskSpec) -> str | list[str] | None:
    if tasks is None or isinstance(tasks, str | Path):
        return None if tasks is None else str(tasks)
    return list(tasks)


# --- the measurement ------------------------------------------------------------------------------


def resolve_models(original: Any, proxy: Any, tokenizer: Any) -> tuple[Any, Any, Any]:
    """Load models given as paths or ``"toy"``; the tokenizer defaults to the original's."""
    from moescope.models.loading import load_model

    loaded = []
    for model in (original, proxy):
        if isinstance(model, str | Path):
            model, own = load_model(model)
            tokenizer = tokenizer if tokenizer is not None else own
        loaded.append(model)
    vocab = [m.get_input_embeddings().num_embeddings for m in loaded]
    if vocab[0] != vocab[1]:
        raise MoescopeError(
            f"the original has {vocab[0]} token ids and the proxy {vocab[1]}; compare a proxy with its "
            "own source model."
        )
    return loaded[0], loaded[1], tokenizer


def measure_fidelity(
    original: PreTrainedModel | str | Path,
    proxy: PreTrainedModel | str | Path,
    data: Any = TASKS,
    *,
    tokenizer: Any = None,
    n_tokens: int = 8192,
    tasks: TaskSpec = None,
    seed: int = 0,
    selection: Selection | None = None,
    n_prompts: int = 100,
    samples: int = 4,
    batch_size: int = 16,
    seq_len: int = 128,
) -> Fidelity:
    """Compare ``proxy`` with ``original`` on held-out data; see the module docstring.

    Parameters
    ----------
    original, proxy : loaded models, or ``"toy"`` / checkpoint directories.
    data : ``"tasks"`` (the task suite's held-out pool) or held-out calibration data.
    tokenizer : the original's; loaded with it when the original is a path.
    n_tokens : real-token budget of the held-out pass.
    tasks : ``None`` (toy suite for the toy, else none), ``"toy"``, family names, ``()`` or a
        ``.jsonl`` path of ``{"prompt", "answer"}`` (see :func:`task_accuracy`).
    seed : sampling seed of the task accuracy.
    selection : which original experts the proxy keeps; found from the proxy's manifest or its
        router rows when not given (a healed in-memory proxy needs it).
    n_prompts, samples : held-out prompts per family and samples per prompt (toy suite).
    batch_size, seq_len : rows per forward pass and longest row of the held-out pass.
    """
    original, proxy, tokenizer = resolve_models(original, proxy, tokenizer)
    kept = kept_experts(original, proxy, selection)
    resolved = resolve_tasks(tasks, original)  # a malformed prompt file fails before any forward pass
    batches = heldout_batches(data, tokenizer, n_tokens=n_tokens, batch_size=batch_size, seq_len=seq_len)
    figures, stats = next_token_agreement(original, proxy, batches, observe=True)
    shares = routing_shares(*stats, kept)
    distance, coverage = _routing_figures(shares)
    kw = {"n_prompts": n_prompts, "samples": samples, "seed": seed}
    accuracy = _both_accuracies(original, proxy, tokenizer, resolved, kw)
    settings = {
        "n_tokens": n_tokens,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "tasks": _describe_tasks(tasks),
        "n_prompts": n_prompts,
        "samples": samples,
        "seed": seed,
    }
    return Fidelity(
        **figures,
        task_accuracy=accuracy,
        routing_distance=distance,
        routing_coverage=coverage,
        routing_shares=shares,
        data="held-out task pool" if isinstance(data, str) and data == TASKS else describe_source(data),
        settings=settings,
    )


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


def record_in_manifest(
    proxy_dir: str | Path,
    fidelity: Fidelity | None = None,
    checklist: Sequence[Check] | None = None,
    healing: HealingReport | None = None,
) -> dict[str, Any]:
    """Add the given results to the proxy's ``moescope.json`` atomically; returns the new manifest.

    A section given replaces the one recorded; the others stay as they are.
    """
    manifest = read_manifest(proxy_dir)
    if manifest is None:
        raise MoescopeError(f"{proxy_dir} has no {MANIFEST}, so it is no moescope proxy; export one first.")
    manifest.update(manifest_sections(fidelity, checklist, healing))
    write_manifest_atomic(Path(proxy_dir), manifest)
    return manifest


def write_manifest_atomic(directory: Path, manifest: dict[str, Any]) -> Path:
    """``moescope.json`` written to a temporary sibling and renamed into place."""
    return write_record(directory / MANIFEST, manifest)
