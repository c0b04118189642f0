"""The fidelity study: do proxies of the toy reproduce what the toy does under RL faults?

For keep in {1/2, 1/4, 1/8} x selection in {cluster (multi-view), frequency, REAP, random} x
seed, a proxy of the toy is exported; then the toy and every proxy replay the same short GRPO
run — healthy, and under each injected fault — with the same data, sampling seeds and
precision. Each proxy trace is compared with the toy's trace of the same fault and seed
(:func:`moescope.analyze.verdict.compare`): which findings it reproduces and how close their onsets are,
and how well the loss, grad-norm, entropy, reward and KL curves agree. It also records each
proxy's capability (held-out greedy accuracy relative to the toy) and measured step time.

The hypothesis under test is the paper's: clustering-based proxies reproduce faults and preserve
dynamics at least as well as the baselines. The script reports what the data shows.

    .venv/bin/python bench/fidelity_study.py [--seeds 3] [--steps 12] [--workers 2] [--out docs]

writes ``OUT/fidelity-study.json`` (every comparison) and ``OUT/fidelity-study.md`` (tables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from moescope.export.study import (
    CURVE_METRICS,
    STUDY_FILE,
    healing_effect,
    mean_of,
    read_study,
    study_frame,
    study_summary,
)

KEEPS = ("1/2", "1/4", "1/8")
METHODS = ("cluster", "frequency", "reap", "random")
# name -> ReplayConfig overrides; point faults strike mid-run (MID), settings hold from step 0
FAULTS: dict[str, dict[str, Any]] = {
    "healthy": {},
    "lr_spike": {"faults": ("lr_spike@MID",)},
    "fp16_overflow": {"precision": "fp16", "faults": ("fp16_overflow@MID",)},
    "nan_op": {"faults": ("nan_op@MID",)},
    "update_omission": {"faults": ("update_omission@MID",)},
    "router_precision": {"faults": ("router_precision@0",)},
    "rollout_logprob_precision": {"faults": ("rollout_logprob_precision@0",)},
    "reward_scale": {"faults": ("reward_scale@MID",)},
    "no_grad_clip": {"faults": ("no_grad_clip@0",)},
    "aux_loss_off": {"aux_loss_coef": 0.01, "faults": ("aux_loss_off@MID",)},
    "entropy_control_off": {"token_entropy_flow_control": True, "faults": ("entropy_control_off@MID",)},
}
# the finding types a fault is expected to leave (faults without one are judged by their curves)
SIGNATURES = {
    "lr_spike": ("grad_spike", "kl_blowup"),
    "fp16_overflow": ("overflow",),
    "nan_op": ("nonfinite",),
}


def _config(fault: str, seed: int, steps: int):
    from moescope.replay import ReplayConfig

    base = {"steps": steps, "seed": seed, "prompts_per_step": 4, "group_size": 8, "tasks": ("add2", "add3")}
    overrides = dict(FAULTS[fault])
    overrides["faults"] = tuple(f.replace("MID", str(steps // 2)) for f in overrides.get("faults", ()))
    return ReplayConfig(**{**base, **overrides})


def _replay(job: tuple[str, str, str, int, int, str]) -> dict[str, Any]:
    """Worker: replay one model under one fault and seed; return the trace path and step time."""
    import torch

    torch.set_num_threads(1)
    import moescope

    label, model, fault, seed, steps, out = job
    trace = moescope.replay(model, _config(fault, seed, steps), out=Path(out))
    times = [s["time/step_s"] for s in trace.steps[1:]]
    return {"label": label, "fault": fault, "seed": seed, "trace": out, "step_s": statistics.median(times)}


def _export(job: tuple[str, str, int, str, int]) -> dict[str, Any]:
    """Worker: export one proxy of the toy (healed for ``heal_steps`` when not 0) and measure its
    accuracy ratio."""
    import torch

    torch.set_num_threads(1)
    from moescope.export.fidelity.validity import CAPABILITY
    from moescope.export.pipeline import export_proxy

    keep, method, seed, out, heal_steps = job
    result = export_proxy(
        "toy", out, keep=keep, method=method, seed=seed, n_tokens=4000, progress=False, overwrite=True,
        heal_steps=heal_steps,
        fidelity={"n_tokens": 2048, "seed": seed, "n_prompts": 50, "samples": 2},
    )  # fmt: skip
    capability = next(c for c in result.checklist if c.name == CAPABILITY)
    return {
        "keep": keep,
        "method": method,
        "seed": seed,
        "path": out,
        "kl": result.fidelity.kl,
        "capability": capability.figure,
        "capability_ratio": capability.details.get("ratio"),
    }


def run(
    seeds: int,
    steps: int,
    workers: int,
    keeps: tuple[str, ...] = KEEPS,
    methods: tuple[str, ...] = METHODS,
    faults: tuple[str, ...] = tuple(FAULTS),
    heal_steps: int = 0,
) -> dict[str, Any]:
    from moescope.analyze.verdict import compare
    from moescope.traces import read_trace

    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="moescope-study-"))
    exports = [(k, m, s, str(work / f"proxy-{k.replace('/', 'of')}-{m}-{s}"), heal_steps) for k in keeps
               for m in methods for s in range(seeds)]  # fmt: skip
    with ProcessPoolExecutor(workers) as pool:
        proxies = list(pool.map(_export, exports))
        jobs = [
            ("toy", "toy", f, s, steps, str(work / f"toy-{f}-{s}.jsonl"))
            for f in faults
            for s in range(seeds)
        ]
        for p in proxies:
            tag = f"{p['keep'].replace('/', 'of')}-{p['method']}-{p['seed']}"
            jobs += [(tag, p["path"], f, p["seed"], steps, str(work / f"{tag}-{f}.jsonl")) for f in faults]
        runs = list(pool.map(_replay, jobs))
    toy = {(r["fault"], r["seed"]): r for r in runs if r["label"] == "toy"}
    rows = []
    for p in proxies:
        tag = f"{p['keep'].replace('/', 'of')}-{p['method']}-{p['seed']}"
        for r in (r for r in runs if r["label"] == tag):
            original = toy[(r["fault"], r["seed"])]
            verdict = compare(read_trace(original["trace"]), read_trace(r["trace"]))
            rows.append(
                {
                    "keep": p["keep"],
                    "method": p["method"],
                    "seed": p["seed"],
                    "fault": r["fault"],
                    "verdict": verdict.verdict,
                    "findings": [vars(m) for m in verdict.findings],
                    "curves": {c.metric: {**vars(c), "trend_agrees": c.trend_agrees} for c in verdict.curves},
                    "step_ratio": r["step_s"] / original["step_s"],
                    "capability": p["capability"],
                    "kl": p["kl"],
                }
            )
    return {
        "command": f"python bench/fidelity_study.py --seeds {seeds} --steps {steps} --workers {workers}"
        + (f" --heal-steps {heal_steps}" if heal_steps else "")
        + ("" if (keeps, methods, faults) == (KEEPS, METHODS, tuple(FAULTS)) else " (a subset)"),
        "heal_steps": heal_steps,
        "steps": steps,
        "seeds": seeds,
        "faults": {f: FAULTS[f] for f in faults},
        "keeps": keeps,
        "methods": methods,
        "proxies": proxies,
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }


# --- the tables ----------------------------------------------------------------------------------


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "–" if value is None or value != value else pattern.format(value)  # None or NaN


def markdown(result: dict[str, Any], unhealed: dict[str, Any] | None = None) -> str:
    rows, keeps, methods, faults = result["rows"], result["keeps"], result["methods"], result["faults"]
    table = study_summary(study_frame(result))
    healed = f", every proxy healed for {result['heal_steps']} steps" if result.get("heal_steps") else ""
    lines = [
        f"# Fidelity study: proxies of the toy under RL faults{healed}",
        "",
        f"Regenerate with `{result['command']}` "
        f"({result['wall_s'] / 60:.0f} min on the machine that wrote it).",
        f"{len(result['proxies'])} proxies ({', '.join(keeps)} kept × {', '.join(methods)} × "
        f"{result['seeds']} seeds), each replaying {len(faults)} runs (healthy and {len(faults) - 1} "
        f"faults) of {result['steps']} GRPO steps, compared with the toy's run of the same fault and seed.",
        "",
        "## Reproduction of the toy's findings, and curve agreement",
        "",
        "*hit*: share of the toy's warnings and errors that the proxy raises too, with the onset within "
        "10 % of the run (n = findings); *alarms*: findings only the proxy raises, per run; *trend*: share "
        f"of ({', '.join(CURVE_METRICS)}) whose overall trend matches; *ρ*: mean Spearman correlation of "
        "those curves; *step*: proxy step time / toy step time (measured).",
        "",
        "| keep | method | hit | n | alarms | trend | ρ | step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table.itertuples():
        lines.append(
            f"| {row.keep} | {row.method} | {_fmt(row.hit)} | {row.findings} | {_fmt(row.alarms)} | "
            f"{_fmt(row.trend)} | {_fmt(row.rho)} | {_fmt(row.step_ratio)} |"
        )
    lines += ["", *cost_lines(table, keeps)]
    lines += ["", "## The faults' own signatures: share reproduced on time (all keeps and seeds)", ""]
    lines += ["| fault | signature | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for fault, types in SIGNATURES.items():
        if fault not in faults:
            continue
        cells = []
        for method in methods:
            hits = [
                float(f["reproduced"] and f["on_time"])
                for r in rows
                if r["fault"] == fault and r["method"] == method
                for f in r["findings"]
                if f["type"] in types and not f["false_alarm"]
            ]
            cells.append(_fmt(mean_of(hits)))
        lines.append(f"| {fault} | {', '.join(types)} | " + " | ".join(cells) + " |")
    lines += ["", "## Per fault: share of proxy runs whose verdict is *reproduced* or *both healthy*", ""]
    lines += ["| fault | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for fault in faults:
        cells = []
        for method in methods:
            picked = [r for r in rows if r["fault"] == fault and r["method"] == method]
            good = [r["verdict"] in ("reproduced", "both healthy") for r in picked]
            cells.append(_fmt(mean_of([float(g) for g in good])))
        lines.append(f"| {fault} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Proxy capability: task accuracy ratio proxy / toy (mean over seeds), and next-token KL",
        "",
    ]
    lines += ["| keep | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for keep in keeps:
        cells = []
        for method in methods:
            picked = [p for p in result["proxies"] if p["keep"] == keep and p["method"] == method]
            ratio = mean_of([p["capability_ratio"] for p in picked])
            kl = mean_of([p["kl"] for p in picked])
            cells.append(f"{_fmt(ratio)} (KL {_fmt(kl)})")
        lines.append(f"| {keep} | " + " | ".join(cells) + " |")
    if unhealed is not None:
        lines += ["", *healing_lines(unhealed, result)]
    return "\n".join(lines) + "\n"


def healing_lines(unhealed: dict[str, Any], healed: dict[str, Any]) -> list[str]:
    """What healing changes: hit share and capability of the same proxies without and with it."""
    lines = [
        f"## What healing changes ({healed['heal_steps']} steps of distillation toward the toy)",
        "",
        "The same exports without healing (`docs/fidelity-study.json`) and with it (this study): share of "
        "the toy's findings reproduced on time, and task accuracy relative to the toy.",
        "",
        "| keep | method | hit, unhealed | hit, healed | capability, unhealed | capability, healed |",
        "|---|---|---|---|---|---|",
    ]
    for row in healing_effect(unhealed, healed).itertuples():
        lines.append(
            f"| {row.keep} | {row.method} | {_fmt(row.hit_unhealed)} | {_fmt(row.hit_healed)} | "
            f"{_fmt(row.capability_unhealed)} | {_fmt(row.capability_healed)} |"
        )
    return lines


def cost_lines(table: Any, keeps: tuple[str, ...]) -> list[str]:
    """What each keep ratio costs: devices from the cost model for published models, and the
    proxies' measured step time on the toy (mean over methods)."""
    from moescope.export.cost import reference_table

    ref = reference_table()
    models = ("DeepSeek-V3", "Kimi-K2", "Qwen3-235B-A22B")
    lines = [
        "## What each keep ratio costs",
        "",
        "Accelerators to RL-train the model from the cost model (`moescope cost --reference`: 80 GB devices, "
        "90 % usable); step time measured on the toy's proxies, relative to the toy (the same top-k, so "
        "per-token compute stays).",
        "",
        "| keep | " + " | ".join(f"{m} devices" for m in models) + " | proxy step time / toy |",
        "|---|" + "---|" * (len(models) + 1),
    ]
    for keep in ("full", *keeps):
        cells = []
        for model in models:
            row = ref[(ref["model"] == model) & (ref["keep"] == keep)]
            cells.append("–" if row.empty else str(int(row["devices"].iloc[0])))
        step = "1.00" if keep == "full" else _fmt(table[table["keep"] == keep]["step_ratio"].mean())
        lines.append(f"| {keep} | " + " | ".join(cells) + f" | {step} |")
    return lines


def write_chart(result: dict[str, Any], path: Path) -> None:
    """The study chart as a standalone SVG (vl-convert, offline)."""
    import vl_convert

    from moescope.display.charts import study_chart

    path.write_text(vl_convert.vegalite_to_svg(study_chart(study_summary(study_frame(result))).to_dict()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--keeps", nargs="+", default=KEEPS, help="a subset, for a quick look")
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--faults", nargs="+", default=tuple(FAULTS), choices=tuple(FAULTS))
    parser.add_argument(
        "--heal-steps", type=int, default=0, help="heal every proxy first; writes fidelity-study-healed.*"
    )
    parser.add_argument("--tables-only", action="store_true", help="rewrite the .md from OUT's .json")
    args = parser.parse_args()
    stem = args.out / ("fidelity-study-healed" if args.heal_steps else "fidelity-study")
    if args.tables_only:
        result = read_study(stem.with_suffix(".json"))
    else:
        result = run(
            args.seeds, args.steps, args.workers, tuple(args.keeps), tuple(args.methods), tuple(args.faults),
            args.heal_steps,
        )  # fmt: skip
        args.out.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    text = markdown(result, _unhealed(args.out) if args.heal_steps else None)
    stem.with_suffix(".md").write_text(text)
    write_chart(result, stem.with_suffix(".svg"))
    print(text)
    print(f"wrote {stem}.md, .json and .svg", file=sys.stderr)


def _unhealed(out: Path) -> dict[str, Any] | None:
    """The study without healing, when OUT holds it: the baseline healing is compared with."""
    return read_study(out) if (out / STUDY_FILE).is_file() else None


if __name__ == "__main__":
    main()
