"""The fault × fix table: does each known fix remove its fault, on a proxy as on the original?

For every embedded model (``toy``, ``toy-v3``) a capability-targeted proxy is exported at
``--keep`` (``moescope export MODEL --keep 1/4``: healed in rounds until it keeps the
checklist's accuracy ratio), then every fault × fix pair of :data:`PAIRS` is validated on it with
the model as ``--original``, once per seed (:func:`moescope.validate`: the fault replayed alone
and with the fix, same seeds and prompts, on both models, and each model without the fault, whose
findings are its own and not judged). A pair's word is the validation's summary (removed,
reduced, unchanged, no finding); the proxy agrees when its word is the original's.

    .venv/bin/python bench/fault_fix.py [--models toy toy-v3] [--keep 1/4] [--steps 16] [--seeds 0 1]
                                        [--work DIR]

writes ``OUT/fault-fix.json`` (every validation) and ``OUT/fault-fix.md`` (the table and the
agreement); ``--tables-only`` rewrites the .md from the .json. ``--only FAULT ...`` runs the pairs
of those faults alone and puts them into OUT's .json in place of their old entries, the other
pairs kept as they were (a table too slow to rerun whole, extended by its new cells).
``--work DIR`` keeps the proxies and the validation directories, and a rerun takes the ones
already there as they are; with ``--rejudge`` it gives their verdicts again from the kept traces
(after a change to the diagnosis).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

MODELS = ("toy", "toy-v3")
# fault, fix, replay overrides the pair needs: each fault with the fixes practitioners reach for
# (DESIGN's fault vocabulary; ../shared/reference/rl-mismatch.md for the mismatch fixes)
PAIRS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("lr_spike@MID", "grad_clip", {}),
    ("lr_spike@MID", "lower_lr", {}),
    ("fp16_overflow@MID", "bf16", {"precision": "fp16"}),
    ("fp16_overflow@MID", "loss_scale", {"precision": "fp16"}),
    ("nan_op@MID", "grad_clip", {}),
    ("routing_mismatch:fp8", "routing_replay", {}),
    ("routing_mismatch:fp8", "is_correction", {}),
    ("routing_mismatch:fp8", "gspo", {}),
    ("routing_mismatch:fp8", "fp32_router", {}),
    ("rollout_logprob_precision:bf16", "is_correction", {}),
    ("rollout_logprob_precision:bf16", "gspo", {}),
    ("router_precision:bf16", "fp32_router", {}),
    # mismatches routing replay does not remove, and the masks users reach for beyond IS correction
    ("engine_drift", "is_mask", {}),
    ("engine_drift", "seq_kl_mask", {}),
    ("engine_drift", "is_correction", {}),
    ("parallel_reduction:bf16", "is_mask", {}),
    ("parallel_reduction:bf16", "fp32_router", {}),  # an fp32 router does not help (NeMo-RL#4243)
    ("packing_positions", "is_mask", {"packing": True}),
    ("packing_positions", "seq_kl_mask", {"packing": True}),
    ("stale_routes", "is_mask", {"routing_replay": True}),
    ("stale_routes", "seq_kl_mask", {"routing_replay": True}),
    ("resume_state@MID", "lower_lr", {}),
    ("aux_loss_double@MID", "aux_loss:0.005", {"aux_loss_coef": 0.01}),
)
BASE = {"prompts_per_step": 4, "group_size": 8, "tasks": ("add2", "add3")}


def _name(fault: str) -> str:
    """A fault's name without its step and argument (``lr_spike@MID`` → ``lr_spike``)."""
    return fault.split(":")[0].split("@")[0]


def _tag(fault: str, fix: str) -> str:
    return f"{_name(fault)}--{fix.replace(':', '-')}"


def _export(model: str, keep: str, out: Path) -> dict[str, Any]:
    """The capability-targeted proxy (taken as it is when ``out`` already holds one)."""
    import moescope

    manifest = out / "moescope.json"
    if not manifest.is_file():
        moescope.export_proxy(model, moescope.ExportConfig(keep=keep), out=out, progress=False)
    record = json.loads(manifest.read_text())
    checks = {c["name"]: c for c in record.get("checklist", [])}
    return {"proxy": str(out), "capability": checks.get("task capability retained", {}).get("figure")}


def _validate(job: tuple[str, str, str, str, dict[str, Any], int, int, str, bool]) -> dict[str, Any]:
    """Worker: one fault × fix pair on the proxy and its original."""
    import torch

    torch.set_num_threads(1)
    import moescope
    from moescope.analyze.validation import read_validation, rejudge

    model, proxy, fault, fix, overrides, steps, seed, out, again = job
    fault = fault.replace("MID", str(steps // 2))
    started = time.perf_counter()
    if not (Path(out) / "validation.json").is_file():
        config = moescope.ReplayConfig(steps=steps, seed=seed, **BASE, **overrides)
        moescope.validate(proxy, fault, [fix], config=config, original=model, out=out, overwrite=True)
    result = rejudge(out) if again else read_validation(out)
    return {
        "model": model,
        "seed": seed,
        "fault": fault,
        "fix": fix,
        "precision": overrides.get("precision", "fp32"),
        "overrides": {k: v for k, v in overrides.items() if k != "precision"},
        "proxy": result.summary,
        "original": result.original.summary,
        "agrees": result.agrees(),
        "proxy_verdicts": result.verdicts,
        "original_verdicts": result.original.verdicts,
        "proxy_cost": result.cost,
        "original_cost": result.original.cost,
        "notes": result.notes,
        "seconds": round(time.perf_counter() - started, 1),
    }


def run(
    models: tuple[str, ...],
    keep: str,
    steps: int,
    seeds: tuple[int, ...],
    workers: int,
    work: Path,
    again: bool = False,
    only: tuple[str, ...] = (),
) -> dict[str, Any]:
    proxies = {}
    for model in models:
        t = time.perf_counter()
        proxies[model] = _export(model, keep, work / f"{model}-proxy")
        print(f"{model}: proxy {proxies[model]} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    jobs = [
        (
            model,
            proxies[model]["proxy"],
            fault,
            fix,
            overrides,
            steps,
            seed,
            str(work / model / f"seed{seed}" / _tag(fault, fix)),
            again,
        )
        for seed in seeds
        for model in models
        for fault, fix, overrides in PAIRS
        if not only or _name(fault) in only
    ]
    with ProcessPoolExecutor(workers) as pool:
        pairs = []
        for record in pool.map(_validate, jobs):
            seconds = record.pop("seconds")  # printed only: a rejudged pair takes none
            print(
                f"{record['model']} seed {record['seed']} {record['fault']} + {record['fix']}: "
                f"proxy {record['proxy']}, original {record['original']} ({seconds} s)",
                file=sys.stderr,
            )
            pairs.append(record)
    return {
        "keep": keep,
        "steps": steps,
        "seeds": list(seeds),
        "base": BASE,
        "proxies": proxies,
        "pairs": pairs,
    }


def merged(old: dict[str, Any], new: dict[str, Any], only: set[str]) -> dict[str, Any]:
    """``old`` with the pairs of the faults in ``only`` replaced by ``new``'s (same keep and steps);
    the seeds are those of the old table, the new pairs' seeds listed under ``seeds_new``."""
    if (old["keep"], old["steps"]) != (new["keep"], new["steps"]):
        raise SystemExit(f"--only needs the table's keep {old['keep']} and steps {old['steps']}")
    kept = [p for p in old["pairs"] if _name(p["fault"]) not in only]
    return {**old, "seeds_new": new["seeds"], "proxies_new": new["proxies"], "pairs": kept + new["pairs"]}


def agreement(pairs: list[dict[str, Any]]) -> tuple[int, int]:
    """Pairs where the proxy's word is the original's, and pairs in all."""
    return sum(bool(p["agrees"]) for p in pairs), len(pairs)


def markdown(result: dict[str, Any]) -> str:
    """The summary table (one row per fault × fix, one column per model, every seed in a cell),
    the agreement, then every pair's findings."""
    pairs, seeds = result["pairs"], result["seeds"]
    agreed, total = agreement(pairs)
    base = result["base"]
    lines = [
        f"# Fault × fix at keep {result['keep']} (capability-targeted proxies)",
        "",
        f"`python bench/fault_fix.py --keep {result['keep']} --steps {result['steps']} "
        f"--seeds {' '.join(map(str, seeds))}`: GRPO, {base['prompts_per_step']} prompts × "
        f"{base['group_size']} samples per step on {', '.join(base['tasks'])}, {result['steps']} steps, "
        f"point faults at step {result['steps'] // 2}. Per pair, what the fix did to the findings the "
        "fault raised, in one word (removed / reduced / unchanged; no finding: the fault raised none), "
        "on the proxy / on its original, one entry per seed; a disagreement in bold. "
        f"**The proxy's word is the original's on {agreed} of {total} validations "
        f"({agreed / max(total, 1):.0%}).**",
        "",
    ]
    if "seeds_new" in result:  # cells added with --only, on their own seeds
        added = sorted(
            {_name(p["fault"]) for p in pairs if p["seed"] in result["seeds_new"]}
            - {_name(p["fault"]) for p in pairs if p["seed"] not in result["seeds_new"]}
        )
        new = [p for p in pairs if _name(p["fault"]) in added]
        lines += [
            f"The pairs of {', '.join(added)} were added with `--only` on seed(s) "
            f"{', '.join(map(str, result['seeds_new']))}: the proxy's word is the original's on "
            f"{agreement(new)[0]} of {len(new)} of them.",
            "",
        ]
    for model, proxy in result["proxies"].items():
        mine = [p for p in pairs if p["model"] == model]
        lines.append(f"- {model}: {agreement(mine)[0]} of {len(mine)} agree; proxy {proxy['capability']}")
    models = list(result["proxies"])
    lines += ["", "| fault | fix | " + " | ".join(f"{m}: proxy / original" for m in models) + " |"]
    lines.append("|---|---|" + "---|" * len(models))
    for fault, fix, overrides in PAIRS:
        cells = []
        for model in models:
            runs = [p for p in pairs if p["model"] == model and p["fix"] == fix and _same_fault(p, fault)]
            cells.append("; ".join(_words(p) for p in sorted(runs, key=lambda p: p["seed"])) or "–")
        precision = f" ({overrides['precision']})" if "precision" in overrides else ""
        name = fault.replace("MID", str(result["steps"] // 2))
        lines.append(f"| {name}{precision} | {fix} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Every validation",
        "",
        "Each finding the faulted or the fixed run raised, with its verdict; *own*: the model raises it in "
        "its run without the fault too, so the fix is not judged on it.",
        "",
        "| model | seed | fault | fix | proxy findings | original findings |",
    ]
    lines.append("|---|---|---|---|---|---|")
    for p in pairs:
        lines.append(
            f"| {p['model']} | {p['seed']} | {p['fault']} | {p['fix']} | {_verdicts(p['proxy_verdicts'])} | "
            f"{_verdicts(p['original_verdicts'])} |"
        )
    return "\n".join(lines) + "\n"


def _same_fault(record: dict[str, Any], fault: str) -> bool:
    return _name(record["fault"]) == _name(fault)


def _words(record: dict[str, Any]) -> str:
    words = f"{record['proxy']} / {record['original']}"
    return words if record["agrees"] else f"**{words}**"


def _verdicts(verdicts: dict[str, str]) -> str:
    return ", ".join(f"{kind} {verdict}" for kind, verdict in verdicts.items()) or "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--keep", default="1/4")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seeds", nargs="+", type=int, default=(0, 1))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument(
        "--work", type=Path, help="keep proxies and validations here (default: a temporary dir)"
    )
    parser.add_argument("--tables-only", action="store_true", help="rewrite the .md from OUT's .json")
    parser.add_argument(
        "--only", nargs="+", default=(), metavar="FAULT", help="run these faults' pairs, keep the others'"
    )
    parser.add_argument(
        "--rejudge", action="store_true", help="give the verdicts again from the traces kept in --work"
    )
    args = parser.parse_args()

    stem = args.out / "fault-fix"
    if args.tables_only:
        result = json.loads(stem.with_suffix(".json").read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="moescope-fault-fix-") as tmp:
            work = args.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            result = run(
                tuple(args.models),
                args.keep,
                args.steps,
                tuple(args.seeds),
                args.workers,
                work,
                args.rejudge,
                tuple(args.only),
            )
        if args.only:
            result = merged(json.loads(stem.with_suffix(".json").read_text()), result, set(args.only))
        args.out.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
