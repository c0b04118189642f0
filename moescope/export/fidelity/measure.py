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

The figures come back as a :class:`~moescope.export.fidelity.records.Fidelity`.
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

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from moescope import schema
from moescope._util.records import write_record
from moescope.errors import MoescopeError
from moescope.explore.calibration import TASKS, describe_source
from moescope.export.fidelity.agreement import heldout_batches, merge_batches, next_token_agreement
from moescope.export.fidelity.records import (
    DISTANCE,
    Check,
    Fidelity,
    HealingReport,
    accuracy_frame,
    layer_shares,
    manifest_sections,
)
from moescope.export.fidelity.validity import (
    BACKBONE,
    CAPABILITY,
    ROUTING,
    WINDOW,
    checklist_frame,
    kept_experts,
    validity_checklist,
)
from moescope.export.manifest import MANIFEST, read_manifest
from moescope.models.accuracy import TaskSpec, model_accuracy, resolve_tasks
from moescope.models.loading import load_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.explore.selection import Selection
    from moescope.explore.stats import RoutingStats

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


# --- routing --------------------------------------------------------------------------------------


def routing_shares(
    original: RoutingStats, proxy: RoutingStats, kept: dict[int, tuple[int, ...]]
) -> pd.DataFrame:
    """Per (MoE layer, original expert) routed-slot shares of both models; see :class:`Fidelity`."""
    frames = []
    for row, layer in enumerate(original.layers):
        proxy_row = proxy.load_share[proxy.layer_index(layer)]
        frames.append(
            layer_shares(
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
    original: PreTrainedModel,
    proxy: PreTrainedModel,
    tokenizer: Any,
    resolved: Any,
    kw: dict[str, Any],
    known: pd.DataFrame | None = None,
) -> pd.DataFrame | None:
    if resolved is None:
        return None
    first = known if known is not None else model_accuracy(original, tokenizer, resolved, **kw)
    return pair_accuracy(first, model_accuracy(proxy, tokenizer, resolved, **kw))


def pair_accuracy(original: pd.DataFrame, proxy: pd.DataFrame) -> pd.DataFrame:
    """Two :func:`~moescope.models.accuracy.model_accuracy` frames side by side."""
    frame = original.rename(columns={"accuracy": "original", "mixed": "original_mixed"})
    frame["proxy"] = proxy["accuracy"].to_numpy()
    frame["proxy_mixed"] = proxy["mixed"].to_numpy()
    return accuracy_frame(frame)


def _describe_tasks(tasks: TaskSpec) -> str | list[str] | None:
    if tasks is None or isinstance(tasks, str | Path):
        return None if tasks is None else str(tasks)
    return list(tasks)


# --- the measurement ------------------------------------------------------------------------------


def resolve_models(original: Any, proxy: Any, tokenizer: Any) -> tuple[Any, Any, Any]:
    """Load models given as paths or ``"toy"``; the tokenizer defaults to the original's."""
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
    original_accuracy: pd.DataFrame | None = None,
    rows_per_forward: int | None = None,
) -> Fidelity:
    """Compare ``proxy`` with ``original`` on held-out data; see the module docstring.

    Parameters
    ----------
    original, proxy : loaded models, or ``"toy"`` / checkpoint directories.
    data : ``"tasks"`` (the task suite's held-out pool) or held-out calibration data.
    tokenizer : the original's; loaded with it when the original is a path.
    n_tokens : real-token budget of the held-out pass.
    tasks : ``None`` (the task suite for toy and toy-v3, else none), ``"toy"``, family names, ``()`` or a
        ``.jsonl`` path of ``{"prompt", "answer"}`` (see :func:`task_accuracy`).
    seed : sampling seed of the task accuracy.
    selection : which original experts the proxy keeps; found from the proxy's manifest or its
        router rows when not given (a healed in-memory proxy needs it).
    n_prompts, samples : held-out prompts per family and samples per prompt (toy suite).
    batch_size, seq_len : rows per forward pass and longest row of the held-out pass.
    rows_per_forward : join the held-out batches into forwards of this many rows (the same rows
        and tokens: for an original read a layer at a time, where each forward reads it).
    original_accuracy : the original's accuracy frame on ``tasks``, measured before (an export's,
        teacher-forced: :mod:`moescope.export.fidelity.original`) or given; measured here by
        sampling when ``None``.
    """
    original, proxy, tokenizer = resolve_models(original, proxy, tokenizer)
    kept = kept_experts(original, proxy, selection)
    resolved = resolve_tasks(tasks, original)  # a malformed prompt file fails before any forward pass
    batches = heldout_batches(data, tokenizer, n_tokens=n_tokens, batch_size=batch_size, seq_len=seq_len)
    if rows_per_forward:
        batches = merge_batches(batches, rows_per_forward)
    figures, stats = next_token_agreement(original, proxy, batches, observe=True)
    shares = routing_shares(*stats, kept)
    distance, coverage = _routing_figures(shares)
    kw = {"n_prompts": n_prompts, "samples": samples, "seed": seed}
    accuracy = _both_accuracies(original, proxy, tokenizer, resolved, kw, original_accuracy)
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
