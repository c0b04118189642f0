"""The selection: which routed experts a proxy keeps in every MoE layer (``selection.json``).

Plain data, with no estimator behind it, so reading or checking a selection (export, replay)
needs neither scikit-learn nor a model. :func:`moescope.explore.clustering.select_experts`
makes one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope._util.io import write_atomic
from moescope.errors import MoescopeError
from moescope.provenance import config_hash
from moescope.schema import CLUSTER, EXPERT, LAYER, SCHEMA_VERSION, check_schema

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PretrainedConfig, PreTrainedModel

    from moescope.models.arch import MoEModel


@dataclass(frozen=True)
class LayerSelection:
    """One MoE layer of a selection: ``kept`` original expert ids (ascending), and per expert
    its cluster (``-1``: in no cluster, for the baselines) and score."""

    layer: int
    kept: tuple[int, ...]
    labels: tuple[int, ...]
    scores: tuple[float, ...]


@dataclass(frozen=True)
class Selection:
    """Which routed experts a proxy keeps in every MoE layer: ``selection.json``.

    Attributes
    ----------
    method, view, seed : how it was made (``view`` is the embedding view clustered, ``None``
        for the baselines).
    keep, keep_ratio : experts kept in every MoE layer, and ``keep / num_experts``.
    num_experts, top_k, n_group, model_type, config_hash : the source model.
    layers : one :class:`LayerSelection` per MoE layer, in decoder order.
    params : what the scores mean (``SCORES``) and the clusterer's parameters.

    :meth:`save` writes readable JSON with a ``schema_version``; export can take it instead of
    recomputing, after :meth:`check_model`.
    """

    method: str
    view: str | None
    seed: int
    keep: int
    keep_ratio: float
    num_experts: int
    top_k: int
    n_group: int
    model_type: str
    config_hash: str
    layers: tuple[LayerSelection, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for entry in self.layers:
            problem = _layer_problem(entry, self.keep, self.num_experts, self.n_group)
            if problem:
                raise MoescopeError(f"selection layer {entry.layer} {problem}; recompute the selection.")

    def kept(self, layer: int) -> tuple[int, ...]:
        """Kept expert ids (original indices, ascending) of decoder layer ``layer``."""
        for entry in self.layers:
            if entry.layer == layer:
                return entry.kept
        raise KeyError(f"decoder layer {layer} is not in the selection; layers: {self.layer_indices}")

    @property
    def layer_indices(self) -> list[int]:
        return [entry.layer for entry in self.layers]

    def to_frame(self) -> pd.DataFrame:
        """Long form, one row per (layer, expert): ``layer, expert, cluster, kept, score``."""
        import pandas as pd

        rows = [
            (entry.layer, expert, entry.labels[expert], expert in kept, entry.scores[expert])
            for entry in self.layers
            for kept in [set(entry.kept)]
            for expert in range(self.num_experts)
        ]
        return pd.DataFrame(rows, columns=[LAYER, EXPERT, CLUSTER, "kept", "score"])

    def to_json(self) -> str:
        """Readable JSON: the header indented, one line per layer."""
        head = {"schema_version": SCHEMA_VERSION, **asdict(self)}
        layers = head.pop("layers")
        lines = ",\n    ".join(json.dumps(entry, allow_nan=False) for entry in layers)
        body = json.dumps(head, indent=2, allow_nan=False)[:-2]
        return f'{body},\n  "layers": [\n    {lines}\n  ]\n}}\n'

    def save(self, path: str | Path) -> Path:
        """Write ``selection.json`` atomically (temporary sibling, then rename)."""
        return write_atomic(path, self.to_json().encode())

    @classmethod
    def load(cls, path: str | Path) -> Selection:
        """Read a ``selection.json`` written by :meth:`save`."""
        try:
            data = json.loads(Path(path).read_text())
            check_schema(data.pop("schema_version", None), path)
            layers = tuple(
                LayerSelection(e["layer"], tuple(e["kept"]), tuple(e["labels"]), tuple(e["scores"]))
                for e in data.pop("layers")
            )
            return cls(layers=layers, **data)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise MoescopeError(
                f"{path} is not a readable selection.json ({err}); write one with select_experts(...).save()."
            ) from err

    def check_model(self, config: PretrainedConfig | PreTrainedModel | MoEModel | dict[str, Any]) -> None:
        """Refuse a model other than the one the selection was made for (config hash)."""
        config = getattr(config, "config", config)
        found = config_hash(config)
        if found != self.config_hash:
            raise MoescopeError(
                f"this selection was made for a {self.model_type} model with config hash "
                f"{self.config_hash}, not this model ({found}); recompute it with select_experts "
                "on this model."
            )


def _layer_problem(entry: LayerSelection, keep: int, num_experts: int, n_group: int) -> str | None:
    kept = list(entry.kept)
    if len(kept) != keep or kept != sorted(set(kept)) or not all(0 <= e < num_experts for e in kept):
        return f"keeps {kept}, not {keep} distinct ascending expert ids below {num_experts}"
    if len(entry.labels) != num_experts or len(entry.scores) != num_experts:
        return f"has {len(entry.labels)} labels and {len(entry.scores)} scores, not one per expert"
    per_group = np.bincount(np.asarray(kept) // (num_experts // n_group), minlength=n_group)
    if n_group > 1 and np.any(per_group != keep // n_group):
        return f"keeps {per_group.tolist()} experts from its {n_group} routing groups, not the same from each"
    return None
