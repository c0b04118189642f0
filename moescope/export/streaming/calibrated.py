"""The selections that need a calibration pass (``frequency``, ``reap``, ``paper``), for a
streaming export: the pass runs a decoder layer at a time (:mod:`moescope.explore.sequential`),
so a checkpoint larger than memory gets every method the in-memory export offers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moescope.explore.calibration import calibration_data, calibration_record
from moescope.explore.clustering import select_experts
from moescope.explore.methods import method as method_named
from moescope.explore.routing import collect_routing
from moescope.explore.selection import Selection
from moescope.explore.sequential import check_memory, layer_sequential, pass_batch_size, router_rows
from moescope.export.config import ExportConfig
from moescope.keep import Keep
from moescope.models.loading import load_tokenizer


def calibrated_selection(
    source: Path, config: ExportConfig, calibration: Any, keep: Keep, progress: bool
) -> tuple[Selection, dict[str, Any]]:
    """``keep`` experts per layer chosen by ``config.method`` from a layer-sequential calibration
    pass over ``calibration`` (a named source, a file or token ids), and the manifest's record
    of that data."""
    with layer_sequential(source, dtype="auto") as lm:  # as the in-memory export loads it
        seed, n_tokens = config.seed, config.n_tokens
        batch_size = pass_batch_size(lm, n_tokens=n_tokens)  # each batch reads every layer again
        check_memory(lm, n_tokens=n_tokens, batch_size=batch_size)
        tokenizer = load_tokenizer(source)
        data = calibration_data(
            lm, tokenizer, calibration, n_tokens=n_tokens, seed=seed, prompts=config.tasks
        )
        with router_rows(lm) as routers:
            stats = collect_routing(
                lm,
                data,
                tokenizer=tokenizer,
                n_tokens=n_tokens,
                batch_size=batch_size,
                seed=seed,
                progress=progress,
            )
        options: dict[str, Any] = {"method": config.method, "stats": stats, "seed": seed}
        if method_named(config.method).views:
            options |= {"views": config.views, "view_weights": config.view_weights, "routers": routers}
        chosen = select_experts(lm, keep, allow_top_k=config.allow_top_k, **options)
    name = calibration if isinstance(calibration, str) else "data"
    return chosen, calibration_record(data, name)
