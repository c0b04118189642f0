"""The natural-mismatch table: GRPO, GRPO + routing replay and GSPO with a low-precision rollout
engine and an fp32 trainer, no fault injected, on an embedded model and its proxy.

The published claim (R3, arXiv 2510.11370; GSPO, arXiv 2507.18071): GRPO on an MoE whose rollout
engine runs in lower precision than the trainer collapses, while GRPO with routing replay and
GSPO keep learning. Here the only source of mismatch is the replay's own ``rollout_precision``:
the rollout engine samples under bf16 (or fp16) autocast while the trainer recomputes the old
log-probs and trains in fp32 (verl's default: old log-probs recomputed by the actor); under
routing replay the trainer's passes reuse the experts the rollout engine chose. Every step logs
the mismatch (``rollout/logprob_mismatch``, ``rollout/k3_kl``).

Each run is classified mechanically (:func:`classify`, on the reward curve):

- *collapses*: the mean reward of the last ``W`` steps is below ``COLLAPSE_FRACTION`` of the
  peak of the ``W``-step running mean, or a step in the last ``W`` is non-finite;
- *learns*: not collapsed, and the mean reward of the last ``W`` steps exceeds that of the first
  ``W`` by at least ``LEARN_MARGIN``;
- *holds*: neither.

A cell (model × algorithm) takes the verdict most of its seeds give (collapses, else learns,
else holds); the proxy agrees when its cell's verdict is the original's.

The grid runs at one condition (``--lr``, ``--rollout-precision``, ``--group-size``, ...) with
a GRPO run whose rollout is fp32 as control (``grpo-fp32``: no mismatch at all); ``--search``
instead runs conditions of :data:`SEARCH` on the original alone (GRPO with the low-precision
rollout and its fp32 control, seed 0) to find where GRPO collapses, and adds them to the JSON.

    .venv/bin/python bench/natural_mismatch.py [--models toy-v3] [--keep 1/4] [--seeds 0 1 2]
        [--steps 80] [--lr 3e-4] [--rollout-precision bf16] [--work DIR] [--quick] [--search]

writes ``OUT/natural-mismatch.json`` (every run's curves and verdict), ``.md`` (the table, the
agreement, the search) and ``.svg`` (reward and mismatch curves); ``--name`` gives another stem.
``--work DIR`` (default ``.scratch/natural-mismatch``) keeps the proxy and every trace: a rerun
takes finished traces as they are and resumes interrupted ones from their last checkpoint.
``--tables-only`` rewrites the .md and .svg from the .json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

MODELS = ("toy", "toy-v3")
ALGOS: dict[str, dict[str, Any]] = {
    "grpo": {"algo": "grpo"},
    "grpo+r3": {"algo": "grpo", "routing_replay": True},
    "gspo": {"algo": "gspo"},
    "grpo-fp32": {"algo": "grpo", "rollout_precision": "fp32"},  # control: no mismatch
}
PUBLISHED = {"grpo": "collapses", "grpo+r3": "learns", "gspo": "learns"}
BASE = {"prompts_per_step": 4, "group_size": 8, "tasks": ("add2", "add3"), "precision": "fp32"}
SEARCH: tuple[dict[str, Any], ...] = (
    {"lr": 1e-5},
    {"lr": 1e-4},
    {"lr": 3e-4},
    {"lr": 5e-4},
    {"lr": 1e-3},
    {"lr": 1e-4, "rollout_precision": "fp16"},
    {"lr": 1e-4, "group_size": 4},
    {"lr": 1e-4, "steps": 160},  # a longer horizon at the lr where 40 steps held
)
WINDOW = 10
COLLAPSE_FRACTION = 0.5
LEARN_MARGIN = 0.05
THRESHOLDS = (0.4, 0.5, 0.6, 0.7)  # collapse fractions the report also counts
CHECKPOINT_EVERY = 25
SERIES = {
    "reward": "reward/mean",
    "mismatch": "rollout/logprob_mismatch",
    "k3_kl": "rollout/k3_kl",
    "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm",
    "loss": "actor/loss",
}


def classify(
    rewards: list[float],
    window: int = WINDOW,
    collapse_fraction: float = COLLAPSE_FRACTION,
    learn_margin: float = LEARN_MARGIN,
) -> str:
    """``collapses``, ``learns`` or ``holds`` for one run's per-step mean rewards (NaN allowed).

    Collapses: a non-finite reward among the last ``window`` steps, or their mean below
    ``collapse_fraction`` of the peak of the ``window``-step running mean. Learns: not collapsed
    and the last ``window`` steps' mean at least ``learn_margin`` above the first ``window``'s.
    """
    if len(rewards) < 2 * window:
        raise ValueError(f"{len(rewards)} steps are too few to judge with a window of {window}")
    tail = rewards[-window:]
    if not all(math.isfinite(r) for r in tail):
        return "collapses"
    running = [sum(rewards[i : i + window]) / window for i in range(len(rewards) - window + 1)]
    peak = max((r for r in running if math.isfinite(r)), default=0.0)
    end, start = sum(tail) / window, sum(rewards[:window]) / window
    if end < collapse_fraction * peak:
        return "collapses"
    if math.isfinite(start) and end >= start + learn_margin:
        return "learns"
    return "holds"


def cell_verdict(verdicts: list[str]) -> str:
    """The verdict most seeds give: collapses if more than half collapse, else learns if more
    than half learn, else holds."""
    for word in ("collapses", "learns"):
        if 2 * verdicts.count(word) > len(verdicts):
            return word
    return "holds"


def condition_tag(condition: dict[str, Any]) -> str:
    """A directory name for a condition (``lr1e-04-bf16-g8-p4-n0``)."""
    c = {**BASE, **condition}
    return (
        f"lr{c['lr']:.0e}-{c.get('rollout_precision', 'bf16')}-g{c['group_size']}-p{c['prompts_per_step']}"
        f"-n{c.get('max_new_tokens') or 0}" + (f"-s{c['steps']}" if "steps" in c else "")
    )


def replay_config(condition: dict[str, Any], algo: str, seed: int, steps: int) -> Any:
    """The replay config of one run: BASE, the condition, then the algorithm's settings."""
    import moescope

    setting = {k: v for k, v in condition.items() if k != "steps"}  # a search condition's own length
    settings = {**BASE, "rollout_precision": "bf16", **setting, **ALGOS[algo]}
    return moescope.ReplayConfig(steps=steps, seed=seed, **settings)


def _finished(path: Path, digest: str, steps: int) -> bool:
    from moescope.errors import MoescopeError
    from moescope.traces import read_trace

    try:
        trace = read_trace(path)
    except MoescopeError:
        return False
    return trace.header.get("config_digest") == digest and len(trace.steps) == steps


def _run(job: tuple[str, str, str, dict[str, Any], int, int, str]) -> dict[str, Any]:
    """Worker: one replay (resumed from its checkpoint, or taken as it is when finished)."""
    import torch

    torch.set_num_threads(1)
    import moescope
    from moescope.replay.checkpoint import read_state
    from moescope.traces import read_trace

    role, model, algo, condition, seed, steps, out = job
    config = replay_config(condition, algo, seed, steps)
    path = Path(out) / "trace.jsonl"
    started = time.perf_counter()
    if not _finished(path, config.digest(), steps):
        state = read_state(path) if path.exists() else None
        resume = state is not None and state.get("config_digest") == config.digest()
        if not resume:
            shutil.rmtree(path.parent, ignore_errors=True)
        moescope.replay(model, config, out=path, resume=resume, checkpoint_every=CHECKPOINT_EVERY)
    trace = read_trace(path)
    series = {name: [_round(s.get(key)) for s in trace.steps] for name, key in SERIES.items()}
    times = [s.get("time/step_s") for s in trace.steps]
    return {
        "role": role,
        "model": model,
        "algo": algo,
        "condition": condition,
        "seed": seed,
        "steps": steps,
        "verdict": classify(_rewards({"series": series})),
        "nonfinite_steps": sum(bool(s.get("health/nonfinite")) for s in trace.steps),
        "seconds_per_step": _round(sum(t for t in times if t) / max(len(times), 1)),
        "wall": round(time.perf_counter() - started, 1),
        "series": series,
    }


def _round(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return float(f"{value:.4g}")
    return value


def run_jobs(jobs: list[tuple], workers: int) -> list[dict[str, Any]]:
    records = []
    with ProcessPoolExecutor(workers) as pool:
        for record in pool.map(_run, jobs):
            print(
                f"{record['role']} {record['algo']} seed {record['seed']} "
                f"{condition_tag(record['condition'])}: {record['verdict']} "
                f"({record['seconds_per_step']} s/step, {record['wall']} s)",
                file=sys.stderr,
                flush=True,
            )
            records.append(record)
    return records


def grid(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every model's original and proxy × algorithm × seed at the chosen condition."""
    from fault_fix import _export as export_proxy  # bench/fault_fix.py: the default proxy, kept in work

    condition = _condition(args)
    proxies, jobs = {}, []
    for model in args.models:
        proxies[model] = export_proxy(model, args.keep, work / f"{model}-proxy")
        for role, path in (("original", model), ("proxy", proxies[model]["proxy"])):
            algos = [a for a in args.algos if role == "original" or a != "grpo-fp32" or args.proxy_control]
            for algo in algos:
                for seed in args.seeds:
                    out = work / condition_tag(condition) / f"{model}-{role}" / algo / f"seed{seed}"
                    jobs.append((f"{model} {role}", path, algo, condition, seed, args.steps, str(out)))
    jobs.sort(key=lambda job: (job[4], list(ALGOS).index(job[2])))  # seed by seed: every cell fills early
    return {
        "condition": condition,
        "steps": args.steps,
        "proxies": proxies,
        "runs": run_jobs(jobs, args.workers),
    }


def search(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """GRPO with the low-precision rollout and its fp32 control on the original, per condition."""
    jobs = []
    for model in args.models:
        for condition in SEARCH:
            for algo in ("grpo", "grpo-fp32"):
                out = work / "search" / condition_tag(condition) / model / algo / "seed0"
                steps = condition.get("steps", args.search_steps)
                jobs.append((f"{model} original", model, algo, condition, 0, steps, str(out)))
    return run_jobs(jobs, args.workers)


def _condition(args: argparse.Namespace) -> dict[str, Any]:
    condition = {"lr": args.lr, "rollout_precision": args.rollout_precision}
    if args.group_size is not None:
        condition["group_size"] = args.group_size
    if args.max_new_tokens is not None:
        condition["max_new_tokens"] = args.max_new_tokens
    return condition


# --- report -------------------------------------------------------------------------------------


def cells(runs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(model role, algorithm) → seeds' verdicts, collapse count and the cell's verdict."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        cell = out.setdefault((run["role"], run["algo"]), {"verdicts": []})
        cell["verdicts"].append(run["verdict"])
    for cell in out.values():
        cell["collapsed"] = cell["verdicts"].count("collapses")
        cell["verdict"] = cell_verdict(cell["verdicts"])
    return out


def agreement(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and algorithm: the original's verdict, the proxy's, and whether they agree
    (the three words, and collapses vs not)."""
    table = cells(runs)
    rows = []
    for (role, algo), cell in table.items():
        if not role.endswith(" original") or (role.replace("original", "proxy"), algo) not in table:
            continue
        proxy = table[(role.replace("original", "proxy"), algo)]
        rows.append(
            {
                "model": role.removesuffix(" original"),
                "algo": algo,
                "original": cell["verdict"],
                "proxy": proxy["verdict"],
                "agrees": cell["verdict"] == proxy["verdict"],
                "agrees_on_collapse": (cell["verdict"] == "collapses") == (proxy["verdict"] == "collapses"),
            }
        )
    return rows


def _mean(values: list[Any]) -> float | None:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def trough(rewards: list[float], window: int = WINDOW) -> float | None:
    """The lowest ``window``-step running mean of the reward over the highest (1: never fell)."""
    running = [_mean(rewards[i : i + window]) for i in range(len(rewards) - window + 1)]
    finite = [r for r in running if r is not None]
    return min(finite) / max(finite) if finite and max(finite) > 0 else None


def _window_means(run: dict[str, Any], key: str) -> tuple[float | None, float | None]:
    values = run["series"][key]
    return _mean(values[:WINDOW]), _mean(values[-WINDOW:])


def run_rows(runs: list[dict[str, Any]], conditions: bool = False) -> list[str]:
    """One row per run: verdict, and the first and last ``WINDOW`` steps' means."""
    lines = [
        f"| {'condition | ' if conditions else ''}model | algorithm | seed | verdict | "
        "reward first / last 10 | lowest / highest running mean | mismatch first / last 10 | "
        "k3 KL first / last 10 | entropy last 10 | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if conditions else ""),
    ]
    for r in runs:
        rew, mis, kl = (_window_means(r, k) for k in ("reward", "mismatch", "k3_kl"))
        where = f"{_condition_text(r['condition'], r['algo'])} | " if conditions else ""
        lines.append(
            f"| {where}{r['role']} | {r['algo']} | {r['seed']} | {r['verdict']} | "
            f"{_fmt(rew[0])} / {_fmt(rew[1])} | {_fmt(trough(r['series']['reward']))} | "
            f"{_fmt(mis[0])} / {_fmt(mis[1])} | "
            f"{_fmt(kl[0])} / {_fmt(kl[1])} | "
            f"{_fmt(_window_means(r, 'entropy')[1])} | {_fmt(r['seconds_per_step'])} |"
        )
    return lines


def _condition_text(condition: dict[str, Any], algo: str) -> str:
    """``lr 3e-04, bf16 rollout, G 4``: what a search condition changes from BASE."""
    c = {**condition, **ALGOS[algo]}
    words = [f"lr {c['lr']:.0e}", f"{c.get('rollout_precision', 'bf16')} rollout"]
    if "group_size" in c:
        words.append(f"G {c['group_size']}")
    if "max_new_tokens" in c:
        words.append(f"{c['max_new_tokens']} new tokens")
    if "steps" in c:
        words.append(f"{c['steps']} steps")
    return ", ".join(words)


def command(result: dict[str, Any]) -> str:
    g = result["grid"]
    c = g["condition"]
    models = sorted({r["role"].split()[0] for r in g["runs"]})
    seeds = sorted({r["seed"] for r in g["runs"]})
    algos = sorted({r["algo"] for r in g["runs"]}, key=list(ALGOS).index)
    parts = [
        "python bench/natural_mismatch.py",
        f"--models {' '.join(models)}",
        f"--keep {result['keep']}",
        f"--algos {' '.join(algos)}",
        f"--seeds {' '.join(map(str, seeds))}",
        f"--steps {g['steps']}",
        f"--lr {c['lr']:g}",
        f"--rollout-precision {c['rollout_precision']}",
    ]
    if "group_size" in c:
        parts.append(f"--group-size {c['group_size']}")
    if "max_new_tokens" in c:
        parts.append(f"--max-new-tokens {c['max_new_tokens']}")
    if result.get("name", "natural-mismatch") != "natural-mismatch":
        parts.append(f"--name {result['name']}")
    return " ".join(parts) + " --work WORK"


def markdown(result: dict[str, Any]) -> str:
    g = result["grid"]
    c = {**BASE, **g["condition"]}
    rows = agreement(g["runs"])
    agreed = sum(r["agrees"] for r in rows)
    on_collapse = sum(r["agrees_on_collapse"] for r in rows)
    table = cells(g["runs"])
    lines = [
        "# Natural mismatch: low-precision rollout engine vs fp32 trainer, no fault injected",
        "",
        f"`{command(result)}`: its {len(g['runs'])} replays' steps took {_compute(g['runs']):.0f} s in all "
        f"({result.get('workers', 2)} at a time, one torch thread each, on a shared 2-core CPU; the last "
        f"invocation's wall time {result.get('wall', '?')} s, finished replays taken as they were).",
        "",
        f"Rollout engine in **{c['rollout_precision']}** (autocast), trainer in **fp32**; "
        f"{c['prompts_per_step']} prompts × {c['group_size']} samples per step on {', '.join(c['tasks'])}, "
        f"lr {c['lr']:g}, {g['steps']} steps, KL β 0.01, 2 minibatches; no `--fault`. Samples come from the "
        "rollout engine; old log-probs are recomputed by the trainer (the actor's recompute, as in verl); "
        "`grpo+r3`: the trainer's passes reuse the rollout's top-k experts; `gspo`: sequence-level ratio "
        "clipped to (3e-4, 4e-4); `grpo-fp32`: GRPO with the rollout in fp32 too (control, no mismatch).",
        "",
        f"Verdict of a run, on its reward curve: **collapses** if the mean reward of the last {WINDOW} steps "
        f"is below {COLLAPSE_FRACTION:.0%} of the peak of the {WINDOW}-step running mean (or a reward there "
        f"is not finite); **learns** if not, and that mean is ≥ {LEARN_MARGIN} above the first {WINDOW} "
        "steps'; **holds** otherwise. A cell's verdict is the seeds' majority.",
        "",
        f"**The proxy's verdict is the original's in {agreed} of {len(rows)} cells; on collapses-or-not in "
        f"{on_collapse} of {len(rows)}.**",
        "",
        "| model | algorithm | published | original: collapsed / seeds (verdicts) | proxy: collapsed / seeds "
        "(verdicts) | agree |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        o = table[(f"{r['model']} original", r["algo"])]
        p = table[(f"{r['model']} proxy", r["algo"])]
        lines.append(
            f"| {r['model']} | {r['algo']} | {PUBLISHED.get(r['algo'], 'control')} | {_cell_text(o)} | "
            f"{_cell_text(p)} | {'yes' if r['agrees'] else '**no**'} |"
        )
    unpaired = [
        key for key in table if not any(f"{r['model']} " in key[0] and r["algo"] == key[1] for r in rows)
    ]
    for role, algo in unpaired:
        lines.append(f"| {role} | {algo} | control | {_cell_text(table[(role, algo)])} | – | – |")
    proxies = ", ".join(
        f"{m}: WORK/{Path(p['proxy']).name} ({p['capability']})" for m, p in g["proxies"].items()
    )
    lines += ["", f"Proxies: {proxies}.", "", *reading(table, g["runs"], c["rollout_precision"]), ""]
    lines += [*mismatch_lines(g["runs"]), "", *threshold_lines(g["runs"]), "", "## Every run", ""]
    lines += run_rows(g["runs"])
    if result.get("search"):
        lines += [
            "",
            "## Search for a collapse (the original alone, GRPO, seed 0)",
            "",
            f"`python bench/natural_mismatch.py --search --search-steps {result['search'][0]['steps']} "
            "--work WORK`: each condition with the low-precision rollout (`grpo`) and with an fp32 rollout "
            "(`grpo-fp32`), "
            f"{result['search'][0]['steps']} steps; what is not stated is the grid's base "
            f"({BASE['prompts_per_step']} × {BASE['group_size']}, bf16 rollout). One seed each: a borderline "
            "verdict here can differ from a three-seed grid's at the same condition.",
            "",
            *run_rows(result["search"], conditions=True),
            "",
            *search_lines(result["search"]),
        ]
    return "\n".join(lines) + "\n"


def search_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Per searched condition: GRPO's verdict with the low-precision rollout and with fp32."""
    verdicts: dict[str, dict[str, str]] = {}
    for run in runs:
        verdicts.setdefault(_condition_text(run["condition"], "grpo"), {})[run["algo"]] = run["verdict"]
    collapsed = {tag: v for tag, v in verdicts.items() if "collapses" in v.values()}
    if not collapsed:
        return ["GRPO collapsed under no searched condition, with either rollout."]
    return ["Conditions where GRPO collapsed (seed 0):", ""] + [
        f"- {where}: {v.get('grpo', '–')}; with an fp32 rollout instead: {v.get('grpo-fp32', '–')}"
        for where, v in collapsed.items()
    ]


def reading(
    table: dict[tuple[str, str], dict[str, Any]], runs: list[dict[str, Any]], precision: str
) -> list[str]:
    """What the verdicts say, one line per model: against the published table and the control."""
    lines = ["## Reading", ""]
    for role in sorted({role for role, _ in table}):
        verdict = {algo: cell["verdict"] for (r, algo), cell in table.items() if r == role}
        published = [a for a in PUBLISHED if a in verdict]
        matches = sum(verdict[a] == PUBLISHED[a] for a in published)
        line = (
            f"- {role}: "
            + ", ".join(f"{a} {verdict[a]}" for a in published)
            + f" ({matches} of {len(published)} as published)"
        )
        if "grpo" in verdict and "grpo-fp32" in verdict:
            line += f"; GRPO {verdict['grpo']} with the {precision} rollout"
            line += f" and {verdict['grpo-fp32']} with an fp32 one"
            if verdict["grpo-fp32"] == verdict["grpo"]:
                line += ": the mismatch does not decide the outcome at this condition"
            elif verdict["grpo"] == "collapses":
                line += ": the collapse comes with the mismatch"
        lines.append(line + ".")
    return lines + replay_lines(runs)


def replay_lines(runs: list[dict[str, Any]]) -> list[str]:
    """What routing replay does to the mismatch: mean over steps and seeds, without and with."""
    cells_ = _by_cell(runs)
    lines = []
    for role in sorted({role for role, _ in cells_}):
        if (role, "grpo") in cells_ and (role, "grpo+r3") in cells_:
            without, with_ = (
                _mean([_mean(r["series"]["mismatch"]) for r in cells_[(role, algo)]])
                for algo in ("grpo", "grpo+r3")
            )
            lines.append(
                f"- {role}: routing replay takes the mean mismatch from {_fmt(without)} (grpo) "
                f"to {_fmt(with_)}."
            )
    return lines


def mismatch_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Per model and algorithm, means over seeds: the mismatch and the reward, early and late."""
    lines = [
        "## Mismatch and reward per cell (means over seeds)",
        "",
        f"|rollout − training log-prob| per token and k3 KL(rollout ‖ training), over the first {WINDOW} "
        f"steps, the last {WINDOW} and all; reward at step 0 and over the first and last {WINDOW}; the "
        f"lowest {WINDOW}-step running mean of the reward over its highest (a dip the run may have recovered "
        "from; not a verdict).",
        "",
        "| model | algorithm | mismatch first / last / all | k3 KL first / last / all | "
        "reward step 0 / first / last | lowest / highest running mean |",
        "|---|---|---|---|---|---|",
    ]
    for (role, algo), members in _by_cell(runs).items():
        cells_ = []
        for key in ("mismatch", "k3_kl", "reward"):
            first = _mean([_window_means(r, key)[0] for r in members])
            last = _mean([_window_means(r, key)[1] for r in members])
            every = _mean([_mean(r["series"][key]) for r in members])
            start = _mean([r["series"][key][0] for r in members])
            parts = (start, first, last) if key == "reward" else (first, last, every)
            cells_.append(" / ".join(_fmt(v) for v in parts))
        cells_.append(_fmt(_mean([trough(r["series"]["reward"]) for r in members])))
        lines.append(f"| {role} | {algo} | " + " | ".join(cells_) + " |")
    return lines


def threshold_lines(runs: list[dict[str, Any]], fractions: tuple[float, ...] = THRESHOLDS) -> list[str]:
    """Seeds that collapse per cell at other collapse thresholds than the verdict's."""
    lines = [
        "## How the verdict moves with the collapse threshold",
        "",
        "Seeds judged *collapses* per cell when the last 10 steps' mean must fall below each fraction of the "
        f"peak running mean (the verdict above uses {COLLAPSE_FRACTION}).",
        "",
        "| model | algorithm | " + " | ".join(f"< {f:.0%} of peak" for f in fractions) + " |",
        "|---|---|" + "---|" * len(fractions),
    ]
    for (role, algo), members in _by_cell(runs).items():
        counts = []
        for fraction in fractions:
            words = [classify(_rewards(r), collapse_fraction=fraction) for r in members]
            counts.append(f"{words.count('collapses')}/{len(words)}")
        lines.append(f"| {role} | {algo} | " + " | ".join(counts) + " |")
    return lines


def _by_cell(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["role"], run["algo"]), []).append(run)
    return groups


def _rewards(run: dict[str, Any]) -> list[float]:
    return [math.nan if r is None else r for r in run["series"]["reward"]]


def _compute(runs: list[dict[str, Any]]) -> float:
    """Seconds the replays' steps took (mean step time × steps, from the traces)."""
    return sum((r["seconds_per_step"] or 0) * r["steps"] for r in runs)


def _cell_text(cell: dict[str, Any]) -> str:
    """``collapsed/seeds: **verdict** (each seed's)``."""
    return (
        f"{cell['collapsed']}/{len(cell['verdicts'])}: **{cell['verdict']}** ({', '.join(cell['verdicts'])})"
    )


def chart(result: dict[str, Any]) -> Any:
    """Reward and log-prob mismatch per step, one column per model, one line per run."""
    import altair as alt
    import pandas as pd

    rows = [
        {"model": r["role"], "algorithm": r["algo"], "run": n, "step": i, key: value}
        for n, r in enumerate(result["grid"]["runs"])
        for key in ("reward", "mismatch")
        for i, value in enumerate(r["series"][key])
        if isinstance(value, (int, float)) and math.isfinite(value) and (key == "reward" or value > 0)
    ]
    frame = pd.DataFrame(rows)
    color = alt.Color("algorithm:N", sort=list(ALGOS))

    def panel(key: str, title: str, scale: Any) -> Any:
        data = frame.dropna(subset=[key])
        smooth = (
            alt.Chart(data)
            .transform_window(
                value=f"mean({key})", frame=[-(WINDOW - 1), 0], groupby=["run"], sort=[{"field": "step"}]
            )
            .mark_line(opacity=0.7, strokeWidth=1.2)
            .encode(
                x=alt.X("step:Q"),
                y=alt.Y("value:Q", title=f"{title} ({WINDOW}-step mean)", scale=scale),
                color=color,
                detail="run:N",
            )
            .properties(width=260, height=170)
        )
        return smooth.facet(column=alt.Column("model:N", title=None))

    return alt.vconcat(
        panel("reward", "reward", alt.Scale(domain=[0, 1])),
        panel("mismatch", "|rollout − training log-prob|", alt.Scale(type="log")),
    ).properties(title="Natural mismatch: reward and rollout/training log-prob mismatch per run")


def write_outputs(result: dict[str, Any], stem: Path) -> str:
    import vl_convert

    text = markdown(result)
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".svg").write_text(vl_convert.vegalite_to_svg(chart(result).to_dict()))
    return text


def _dumps(result: dict[str, Any]) -> str:
    """Indented JSON with each list of numbers on one line (the per-step curves)."""
    text = json.dumps(result, indent=1)
    flat = re.sub(
        r"\[\s+([^\[\]{}\"]*?)\s+\]",
        lambda m: "[" + " ".join(m.group(1).split()) + "]",
        text,
    )
    return flat + "\n"


def _relative(text: str, work: Path) -> str:
    """``text`` with the work directory's paths written ``WORK/...``, as the tables and the
    regenerate command name them: the JSON is published, the machine's paths are not."""
    for root in sorted({str(work.resolve()), str(work)}, key=len, reverse=True):
        text = text.replace(json.dumps(root)[1:-1] + "/", "WORK/")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=("toy-v3",), choices=MODELS)
    parser.add_argument("--keep", default="1/4")
    parser.add_argument("--algos", nargs="+", default=tuple(ALGOS), choices=tuple(ALGOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=(0, 1, 2))
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--rollout-precision", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--group-size", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--proxy-control", action="store_true", help="run grpo-fp32 on the proxy too")
    parser.add_argument(
        "--search", action="store_true", help="run the SEARCH conditions, add them to the JSON"
    )
    parser.add_argument("--search-steps", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="one seed, 20 steps, grpo and gspo: a smoke run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--name", default="natural-mismatch", help="OUT/NAME.json, .md, .svg")
    parser.add_argument(
        "--work", type=Path, default=Path(".scratch/natural-mismatch"), help="proxy and traces"
    )
    parser.add_argument("--tables-only", action="store_true", help="rewrite the .md and .svg from the .json")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.algos, args.search_steps = (0,), 2 * WINDOW, ("grpo", "gspo"), 2 * WINDOW
    stem = args.out / (f"{args.name}-quick" if args.quick else args.name)
    previous = (
        json.loads(stem.with_suffix(".json").read_text()) if stem.with_suffix(".json").is_file() else {}
    )
    started = time.perf_counter()
    if args.tables_only:
        result = previous
    elif args.search:
        result = {**previous, "search": search(args, args.work)}
    else:
        result = {**previous, "keep": args.keep, "grid": grid(args, args.work), "workers": args.workers}
        result["name"] = stem.name
        result["wall"] = round(time.perf_counter() - started)
    args.out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(_relative(_dumps(result), args.work))
    if "grid" in result:
        print(write_outputs(result, stem))
        print("regenerate:", command(result).replace("WORK", shlex.quote(str(args.work))))
    print(f"{time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
