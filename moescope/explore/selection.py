"""The selection: which routed experts a proxy keeps in every MoE layer (``selection.json``).

Plain data, with no estimator behind it, so reading or checking a selection (export, replay)
needs neither scikit-learn nor a model. :func:`moescope.explore.clustering.select_experts`
makes one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope._util.io import write_atomic
from moescope.errors import MoescopeError
from moescope.explore.methods import METHODS as REGISTRY
from moescope.explore.methods import method_names
from moescope.keep import Keep
from moescope.models.loading import load_config
from moescope.provenance import config_hash
from moescope.schema import CLUSTER, EXPERT, LAYER, SCHEMA_VERSION, check_schema

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PretrainedConfig, PreTrainedModel

    from moescope.models.view import MoEModel

METHODS = method_names()
"""How :func:`~moescope.explore.clustering.select_experts` chooses (a selection's ``method``;
each one's needs and behaviour: :mod:`moescope.explore.methods`)."""

STREAMING_METHOD = next(m.name for m in REGISTRY.values() if m.one_read)
"""What the one-read shard cut (:func:`~moescope.export.streaming.export.export_streaming`)
chooses by unless told: it never runs the model, so it clusters the weights (the paper's views
need a calibration pass)."""


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

    def keep_of(self, keep: str | float | int | Keep) -> Keep:
        """``keep`` parsed against the source model's routing (exactly top-k accepted: a
        selection may keep it)."""
        return Keep.parse(keep, self.num_experts, self.top_k, self.n_group, allow_top_k=True)

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

    def made_for(self, config: PretrainedConfig | PreTrainedModel | MoEModel | dict[str, Any]) -> bool:
        """Whether this selection was made for the model of ``config`` (same config hash)."""
        return config_hash(getattr(config, "config", config)) == self.config_hash

    def check_model(self, config: PretrainedConfig | PreTrainedModel | MoEModel | dict[str, Any]) -> None:
        """Refuse a model other than the one the selection was made for (config hash)."""
        if not self.made_for(config):
            found = config_hash(getattr(config, "config", config))
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


def reusable_selection(
    path: str | Path | None,
    model: str | Path | PretrainedConfig | PreTrainedModel | dict[str, Any],
    keep: str | float | int | Keep,
) -> Path | None:
    """``path`` when it holds a selection that export can reuse for ``model`` at ``keep``, else ``None``.

    Reusable means: the file exists, was made for this model (same config hash) and keeps the
    count ``keep`` means for it. Anything else (no file, another model, another keep) gives
    ``None``, so the caller selects anew instead of failing on a stale file.

    Parameters
    ----------
    path : a ``selection.json``, or ``None`` / ``""`` for none.
    model : ``"toy"``, a checkpoint directory (only its config is read), or a config or model.
    keep : fraction, ratio or count of routed experts kept per layer, or its
        :class:`~moescope.keep.Keep`.

    Example
    -------
    >>> import tempfile
    >>> from moescope.explore.clustering import select_experts
    >>> from moescope.models.zoo import tiny
    >>> model = tiny("qwen3_moe")
    >>> path = select_experts(model, 0.5, method="random").save(Path(tempfile.mkdtemp()) / "s.json")
    >>> reusable_selection(path, model, "1/2") == path, reusable_selection(path, model, 0.75)
    (True, None)
    """
    if not path or not Path(path).is_file():
        return None
    found = Selection.load(path)
    config = load_config(model) if isinstance(model, str | Path) else model
    if not found.made_for(config):
        return None
    return Path(path) if found.keep == found.keep_of(keep).count else None


def selection_overlap(a: Selection, b: Selection) -> float:
    """Share of ``a``'s kept experts that ``b`` keeps too, pooled over the MoE layers.

    1 when both keep the same experts everywhere; about ``b.keep_ratio`` for unrelated picks.

    Example
    -------
    >>> from moescope.explore.clustering import select_experts
    >>> from moescope.models.zoo import tiny
    >>> model = tiny("qwen3_moe")
    >>> a, b = (select_experts(model, 0.5, method="random", seed=s) for s in (0, 0))
    >>> selection_overlap(a, b)
    1.0
    """
    if a.layer_indices != b.layer_indices:
        raise MoescopeError(
            f"the selections cover different MoE layers ({a.layer_indices} and {b.layer_indices}); "
            "compare selections of the same model."
        )
    shared = sum(len(set(a.kept(layer)) & set(b.kept(layer))) for layer in a.layer_indices)
    return shared / (a.keep * len(a.layer_indices))


def overlap_table(selections: Mapping[str, Selection]) -> pd.DataFrame:
    """:func:`selection_overlap` of every pair of named selections: row ``b``, column ``a``."""
    import pandas as pd

    return pd.DataFrame(
        {a: {b: selection_overlap(sa, sb) for b, sb in selections.items()} for a, sa in selections.items()}
    )


def kept_table(selections: Mapping[str, Selection]) -> pd.DataFrame:
    """The kept expert ids of each named selection (columns) in every MoE layer (rows)."""
    import pandas as pd

    first = next(iter(selections.values()))
    return pd.DataFrame(
        {name: [list(s.kept(layer)) for layer in first.layer_indices] for name, s in selections.items()},
        index=pd.Index(first.layer_indices, name=LAYER),
    )
