"""The floor of the study's curve-agreement goal: how near the original must a proxy be for ρ ≥ 0.8?

The fidelity study asks a proxy's healthy run to follow the original's loss, grad-norm and
entropy curves at a Spearman ρ of 0.8 or more. This script measures what that asks. It builds
copies of the model that keep every expert, each weight multiplied by ``1 + σ·N(0, 1)`` for each
``σ`` in ``--scales`` (a proxy as near the original as one can wish), replays the study's
healthy run on the original and on every copy (same config, data and sampling seeds:
``fidelity_study._config``), and judges each copy exactly as the study judges a proxy
(``moescope.analyze.verdict.compare``, as ``fidelity_study.judgment`` does). Each copy's KL
and accuracy ratio are measured as the export measures a proxy's, so the figures sit next to
the study's proxies (KL 0.4 to 4.4 nats).

    .venv/bin/python bench/curve_floor.py [--model toy-v3] [--scales 0.003 0.01 0.03 0.1] [--seeds 3]

Prints one row per scale: KL, capability, steps whose mean reward equals the original's, and
the mean ρ per curve over the seeds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fidelity_study import MODELS, _replay

GOAL_CURVES = ("actor/loss", "actor/grad_norm", "actor/entropy")
ALSO = ("reward/mean", "actor/kl")


def write_copy(model: str, scale: float, out: Path) -> Path:
    """The model with each weight multiplied by ``1 + scale·N(0, 1)`` (seeded), saved to ``out``."""
    import torch

    from moescope.export.manifest import copy_side_files
    from moescope.models.loading import load_model, resolve_model

    lm, _ = load_model(model, dtype=torch.float32, with_tokenizer=False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in lm.parameters():
            param.mul_(1 + scale * torch.randn(param.shape, generator=generator))
    lm.save_pretrained(out)
    copy_side_files(resolve_model(model), out)
    return out


def closeness(model: str, copies: dict[float, Path]) -> dict[float, tuple[float, float]]:
    """KL and accuracy ratio of each copy, measured as the export measures a proxy's."""
    from transformers import AutoModelForCausalLM

    from moescope.explore.calibration import calibration_data
    from moescope.export.fidelity.measure import measure_fidelity, validity_checklist
    from moescope.export.targeting import ratio_of
    from moescope.models.loading import load_model

    lm, tokenizer = load_model(model)
    held_out = calibration_data(lm, tokenizer, seed=1)
    figures = {}
    for scale, path in copies.items():
        copy = AutoModelForCausalLM.from_pretrained(path)
        measured = measure_fidelity(lm, copy, held_out, tokenizer=tokenizer)
        capability = validity_checklist(lm, copy, measured)[2]
        figures[scale] = (measured.kl, ratio_of(capability))
    return figures


def agreement(original: list[Path], copy: list[Path]) -> dict[str, Any]:
    """Mean ρ per curve over the seeds, and the steps whose mean reward equals the original's."""
    from moescope.analyze.verdict import compare
    from moescope.traces import read_trace

    rhos: dict[str, list[float]] = {}
    same = total = 0
    for o, c in zip(original, copy, strict=True):
        ours, theirs = read_trace(o), read_trace(c)
        for curve in compare(ours, theirs).curves:  # the study's judgment of a proxy run
            if curve.spearman is not None:
                rhos.setdefault(curve.metric, []).append(curve.spearman)
        pairs = list(zip(ours.steps, theirs.steps, strict=False))
        same += sum(a.get("reward/mean") == b.get("reward/mean") for a, b in pairs)
        total += len(pairs)
    return {"rho": {m: statistics.mean(v) for m, v in rhos.items()}, "same_reward": (same, total)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy-v3", choices=MODELS)
    parser.add_argument("--scales", nargs="+", type=float, default=(0.003, 0.01, 0.03, 0.1))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="moescope-floor-") as tmp:
        work = Path(tmp)
        copies = {s: write_copy(args.model, s, work / f"copy-{s:g}") for s in args.scales}
        labels = {"original": args.model, **{f"{s:g}": str(p) for s, p in copies.items()}}
        jobs = [
            (label, model, "healthy", seed, args.steps, str(work / f"{label}-{seed}.jsonl"))
            for label, model in labels.items()
            for seed in range(args.seeds)
        ]
        with ProcessPoolExecutor(args.workers) as pool:
            traces: dict[str, list[Path]] = {}
            for done in pool.map(_replay, jobs):
                traces.setdefault(done["label"], []).append(Path(done["trace"]))
        near = closeness(args.model, copies)
        rows = {s: agreement(traces["original"], traces[f"{s:g}"]) for s in args.scales}
    print(f"{args.model}: healthy run, {args.steps} steps, {args.seeds} seeds; ρ to the original")
    print(" | ".join(["σ", "KL", "capability", "same reward", *GOAL_CURVES, *ALSO]))
    for scale, row in rows.items():
        kl, capability = near[scale]
        same, total = row["same_reward"]
        rhos = [f"{row['rho'].get(m, float('nan')):.2f}" for m in GOAL_CURVES + ALSO]
        print(" | ".join([f"{scale:g}", f"{kl:.4f}", f"{capability:.2f}", f"{same}/{total}", *rhos]))
    misses = [s for s, row in rows.items() if any(row["rho"].get(m, 0.0) < 0.8 for m in GOAL_CURVES)]
    print(f"ρ < 0.8 on a goal curve from σ = {min(misses):g}" if misses else "every copy meets ρ ≥ 0.8")


if __name__ == "__main__":
    main()
