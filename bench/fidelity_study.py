"""The fidelity study: do proxies of an embedded model reproduce what it does under RL faults?

For keep in {1/2, 1/4, 1/8} x selection in {auto (the export's default), paper, cluster,
frequency, REAP, random} x seed
(plus the ``paper`` method's view ablations at the ``--ablation-keeps``), a proxy of the model
(``toy`` or ``toy-v3``) is exported, unhealed or capability-targeted (``--targeted``: healed in
rounds until it keeps the checklist's accuracy ratio or the budget is spent); then the model and
every proxy replay the same short GRPO run — healthy, and under each injected fault — with the
same data, sampling seeds and precision. Each export calibrates on that replay's own data (its
prompts, :data:`REPLAY_TASKS`, with the model's sampled completions), as a user calibrates on
the RL task they debug. Each proxy trace is compared with the original's trace
of the same fault and seed (:func:`moescope.analyze.verdict.compare`): which findings it
reproduces and how close their onsets are, and how well the loss, grad-norm, entropy, reward
and KL curves agree. Every run also keeps a summary (:func:`moescope.export.study.run_summary`)
from which the paper's two faults are judged the paper's way, and the share of GRPO groups
with no reward variance is read. Each proxy's capability (accuracy ratio to the original) and
measured step time are recorded.

The hypothesis under test is the paper's: its clustering-based proxies reproduce faults and
preserve dynamics at least as well as the baselines. The script reports what the data shows.

    .venv/bin/python bench/fidelity_study.py [--model toy] [--targeted] [--seeds 3] [--steps 12]

writes ``OUT/fidelity-study[-MODEL][-targeted].json`` (every comparison) and ``.md`` (tables).
``--tables-only`` rewrites the tables from that JSON; ``--rejudge`` judges its runs again from the
replays the study kept in its work directory (after a change to the diagnosis); ``--work DIR``
runs in DIR and takes the proxies an interrupted study already exported there as they are;
``--merge --methods M...`` runs only those methods (and the originals again) and adds them to
OUT's study of the model, refused unless the originals replay exactly as they did.
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

from moescope.export.fidelity import CAPABILITY_THRESHOLD
from moescope.export.study import (
    ALSO_REPORTED,
    CURVE_METRICS,
    PAPER_FAULTS,
    healing_effect,
    mean_of,
    no_signal_table,
    paper_fault_agreement,
    read_study,
    run_summary,
    study_file,
    study_frame,
    study_summary,
)
from moescope.replay.faults import KINDS

MODELS = ("toy", "toy-v3")
KEEPS = ("1/2", "1/4", "1/8")
REPLAY_TASKS = ("add2", "add3")
"""The replay's prompts: the addition families, which leave RL groups mixed rewards (the toy's
in-window tasks, and add2 of toy-v3)."""
METHODS = ("auto", "paper", "cluster", "frequency", "reap", "taylor", "random")
"""``auto`` is the export's default: the best of ``paper``, ``reap`` and ``taylor`` on the task, measured."""
# the paper method on one view, or two, instead of all three: METHOD/VIEW[+VIEW]
ABLATIONS = (
    "paper/router",
    "paper/coactivation",
    "paper/context",
    "paper/router+coactivation",
    "paper/router+context",
    "paper/coactivation+context",
)
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


def _config(fault: str, seed: int, steps: int):
    from moescope.replay import ReplayConfig

    base = {"steps": steps, "seed": seed, "prompts_per_step": 4, "group_size": 8, "tasks": REPLAY_TASKS}
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
    return {
        "label": label,
        "fault": fault,
        "seed": seed,
        "trace": out,
        "step_s": statistics.median(times),
        "summary": run_summary(trace.steps),
    }


def calibration_lines(result: dict[str, Any]) -> list[str]:
    """What the exports calibrated on (a study from before this was recorded says nothing)."""
    calibration = result.get("calibration")
    if not calibration:
        return []
    return [
        f"Every export calibrated on the replay's own data (`--calibration {calibration['source']}`): "
        f"its prompts ({', '.join(calibration['prompts'])}) with {_model(result)}'s sampled completions."
    ]


def export_options(spec: str) -> dict[str, Any]:
    """``METHOD`` or ``METHOD/VIEW[+VIEW]`` (an ablation of ``paper``) as export options."""
    method, _, views = spec.partition("/")
    return {"method": method, "views": tuple(views.split("+"))} if views else {"method": method}


def _export(job: tuple[str, str, str, int, str, bool]) -> dict[str, Any]:
    """Worker: export one proxy (capability-targeted when ``targeted``, else unhealed) and
    read its accuracy ratio, healing spent and next-token KL from what the export measured."""
    import torch

    torch.set_num_threads(1)
    from moescope.export.pipeline import export_proxy

    model, keep, spec, seed, out, targeted = job
    manifest = Path(out) / "moescope.json"
    if not manifest.is_file():  # a proxy an interrupted study already wrote is taken as it is
        export_proxy(
            model, out, keep=keep, seed=seed, n_tokens=4000, progress=False, overwrite=True,
            tasks=REPLAY_TASKS, **export_options(spec), **({} if targeted else {"min_capability": 0.0}),
            fidelity={"n_tokens": 2048, "seed": seed, "n_prompts": 50, "samples": 2},
        )  # fmt: skip
    return export_record(json.loads(manifest.read_text()), keep, spec, seed, out)


def export_record(manifest: dict[str, Any], keep: str, spec: str, seed: int, out: str) -> dict[str, Any]:
    """What the study keeps of an export, read from the proxy's manifest: next-token KL, the
    capability check, and the healing it took."""
    from moescope.export.fidelity.validity import CAPABILITY

    capability = next(c for c in manifest["checklist"] if c["name"] == CAPABILITY)
    ratio = capability["details"].get("ratio")
    targeting = manifest.get("targeting") or {}
    attempt = next((a for a in targeting.get("attempts", []) if a["keep"] == targeting.get("keep")), None)
    return {
        "keep": keep,
        "method": spec,
        "seed": seed,
        "path": out,
        "kl": manifest["fidelity"]["kl"],
        "capability": capability["figure"],
        "capability_ratio": ratio,
        "capability_unhealed": attempt["curve"][0]["ratio"] if attempt else ratio,
        "selected_by": manifest["method"],  # what auto chose; the method itself otherwise
        "heal_steps": attempt["curve"][-1]["steps"] if attempt else 0,
        "passed": capability["passed"],
    }


def _tag(keep: str, spec: str, seed: int) -> str:
    return f"{keep.replace('/', 'of')}-{spec.replace('/', '-').replace('+', '-')}-{seed}"


def run(
    model: str,
    seeds: int,
    steps: int,
    workers: int,
    keeps: tuple[str, ...] = KEEPS,
    methods: tuple[str, ...] = METHODS,
    faults: tuple[str, ...] = tuple(FAULTS),
    targeted: bool = False,
    ablation_keeps: tuple[str, ...] = ("1/4",),
    work: Path | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    work = work or Path(tempfile.mkdtemp(prefix="moescope-study-"))
    specs = [(k, m) for k in keeps for m in methods if "/" not in m or k in ablation_keeps]
    exports = [(model, k, m, s, str(work / f"proxy-{_tag(k, m, s)}"), targeted) for k, m in specs
               for s in range(seeds)]  # fmt: skip
    with ProcessPoolExecutor(workers) as pool:
        proxies = list(pool.map(_export, exports))
        jobs = [
            ("original", model, f, s, steps, str(work / f"original-{f}-{s}.jsonl"))
            for f in faults
            for s in range(seeds)
        ]
        for p in proxies:
            tag = _tag(p["keep"], p["method"], p["seed"])
            jobs += [(tag, p["path"], f, p["seed"], steps, str(work / f"{tag}-{f}.jsonl")) for f in faults]
        runs = list(pool.map(_replay, jobs))
    originals = {(r["fault"], r["seed"]): r for r in runs if r["label"] == "original"}
    rows = []
    for p in proxies:
        tag = _tag(p["keep"], p["method"], p["seed"])
        for r in (r for r in runs if r["label"] == tag):
            original = originals[(r["fault"], r["seed"])]
            rows.append(
                {
                    "keep": p["keep"],
                    "method": p["method"],
                    "seed": p["seed"],
                    "fault": r["fault"],
                    **judgment(Path(original["trace"]), Path(r["trace"])),
                    "step_ratio": r["step_s"] / original["step_s"],
                    "capability": p["capability"],
                    "kl": p["kl"],
                    "summary": r["summary"],
                }
            )
    options = {"keeps": keeps, "methods": methods, "faults": faults}
    return {
        "command": f"python bench/fidelity_study.py --model {model} --seeds {seeds} --steps {steps} "
        f"--workers {workers}" + (" --targeted" if targeted else "") + _subset_flags(options),
        "model": model,
        "targeted": targeted,
        "heal_steps": 0,
        "calibration": {"source": "rl", "prompts": list(REPLAY_TASKS)},
        "steps": steps,
        "seeds": seeds,
        "faults": {f: FAULTS[f] for f in faults},
        "keeps": keeps,
        "methods": methods,
        "proxies": proxies,
        "originals": [
            {"fault": f, "seed": seed, "summary": r["summary"]} for (f, seed), r in originals.items()
        ],
        "rows": rows,
        "wall_s": time.perf_counter() - started,
    }


def judgment(original: Path, proxy: Path) -> dict[str, Any]:
    """A proxy run judged against the original's: verdict, findings and curve agreement."""
    from moescope.analyze.verdict import compare
    from moescope.traces import read_trace

    verdict = compare(read_trace(original), read_trace(proxy))
    return {
        "verdict": verdict.verdict,
        "every_finding": verdict.every_finding,  # the verdict judged on every finding, not the signature
        "signature": verdict.signature,
        "findings": [vars(m) for m in verdict.findings],
        "curves": {c.metric: {**vars(c), "trend_agrees": c.trend_agrees} for c in verdict.curves},
    }


def rejudge(result: dict[str, Any]) -> dict[str, Any]:
    """The study's judgments again, from the replays it saved in its work directory, by this
    checkout's diagnosis. Replays are deterministic, so this is what a fresh run of the same
    command judges; exports, capabilities, summaries and step times stay as measured."""
    works = {(p["keep"], p["method"], p["seed"]): Path(p["path"]).parent for p in result["proxies"]}
    for work in set(works.values()):  # one, or one per study merged into this one
        if not work.is_dir():
            raise SystemExit(f"the study's replays in {work} are gone; run the study again instead.")
    for row in result["rows"]:
        tag, fault, seed = _tag(row["keep"], row["method"], row["seed"]), row["fault"], row["seed"]
        work = works[(row["keep"], row["method"], row["seed"])]
        row.update(judgment(work / f"original-{fault}-{seed}.jsonl", work / f"{tag}-{fault}.jsonl"))
    return result


MERGED_ALIKE = ("model", "targeted", "calibration", "steps", "seeds", "faults", "keeps")
"""What two studies must share for one's methods to be added to the other's (:func:`merged`)."""


def merged(previous: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``previous`` with ``new``'s methods added (replacing its own runs of them).

    Only sound when both compare with the same original runs: replays are deterministic, so the
    originals ``new`` replayed again must summarise exactly as ``previous``'s did, else the
    merge is refused. The result's command is ``previous``'s, which now runs every method."""
    new = json.loads(json.dumps(new, default=str))  # as the JSON file holds it: lists, not tuples
    differing = [key for key in MERGED_ALIKE if previous.get(key) != new.get(key)]
    if differing:
        raise SystemExit(f"the two studies differ in {', '.join(differing)}; run the whole study instead.")
    if json.loads(json.dumps(new["originals"], default=str)) != previous["originals"]:
        raise SystemExit(
            "the originals replayed differently from the earlier study's (another machine or "
            "version?); run the whole study instead."
        )
    added = set(new["methods"])
    methods = [m for m in METHODS + ABLATIONS if m in added or m in previous["methods"]]

    def ordered(items: list[dict[str, Any]]) -> list[dict[str, Any]]:  # as one run lists them
        return sorted(items, key=lambda i: (previous["keeps"].index(i["keep"]), methods.index(i["method"])))

    return {
        **previous,
        "methods": methods,
        "proxies": ordered([p for p in previous["proxies"] if p["method"] not in added] + new["proxies"]),
        "rows": ordered([r for r in previous["rows"] if r["method"] not in added] + new["rows"]),
        "wall_s": previous["wall_s"] + new["wall_s"],
        "merged": [*previous.get("merged", []), new["command"]],
    }


def _subset_flags(given: dict[str, tuple[str, ...]]) -> str:
    """The ``--keeps`` / ``--methods`` / ``--faults`` flags of a run that did not use their defaults."""
    defaults = {"keeps": KEEPS, "methods": METHODS + ABLATIONS, "faults": tuple(FAULTS)}
    return "".join(
        f" --{name} {' '.join(values)}" for name, values in given.items() if tuple(values) != defaults[name]
    )


# --- the tables ----------------------------------------------------------------------------------


def _fmt(value: float | None, pattern: str = "{:.2f}") -> str:
    return "–" if value is None or value != value else pattern.format(value)  # None or NaN


def _model(result: dict[str, Any]) -> str:
    return result.get("model", "toy")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the header, its rule, one line per row of cells."""
    return [_row(header), "|" + "---|" * len(header), *(_row(cells) for cells in rows)]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _curves(faults: dict[str, tuple[str, ...]]) -> str:
    return "; ".join(f"{fault}: {', '.join(metrics)}" for fault, metrics in faults.items())


def markdown(result: dict[str, Any], unhealed: dict[str, Any] | None = None) -> str:
    model, keeps, methods, faults = _model(result), result["keeps"], result["methods"], result["faults"]
    table = study_summary(study_frame(result))
    summary_rows = [
        [r.keep, r.method, _fmt(r.hit), str(r.findings), *map(_fmt, (r.alarms, r.trend, r.rho, r.step_ratio))]
        for r in table.itertuples()
    ]
    how = ", capability-targeted proxies" if result.get("targeted") else ""
    how += f", every proxy healed for {result['heal_steps']} steps" if result.get("heal_steps") else ""
    lines = [
        f"# Fidelity study: proxies of {model} under RL faults{how}",
        "",
        f"Regenerate with `{result['command']}` "
        f"({result['wall_s'] / 60:.0f} min on the machine that wrote it).",
        f"{len(result['proxies'])} proxies ({', '.join(keeps)} kept × {', '.join(methods)} × "
        f"{result['seeds']} seeds), each replaying {len(faults)} runs (healthy and {len(faults) - 1} "
        f"faults) of {result['steps']} GRPO steps, compared with {model}'s run of the same fault and seed.",
        *calibration_lines(result),
        "",
        "## Reproduction of the original's findings, and curve agreement",
        "",
        "*hit*: share of the original's warnings and errors that the proxy raises too, with the onset "
        "within 10 % of the run (n = findings); *alarms*: findings only the proxy raises, per run; "
        f"*trend*: share of ({', '.join(CURVE_METRICS)}) whose overall trend matches; *ρ*: mean Spearman "
        "correlation of those curves; *step*: proxy step time / original step time (measured).",
        "",
        *_table(["keep", "method", "hit", "n", "alarms", "trend", "ρ", "step"], summary_rows),
    ]
    lines += ["", *capability_lines(result), "", *no_signal_lines(result), "", *paper_fault_lines(result)]
    lines += ["", *healthy_curve_lines(result), "", *cost_lines(table, keeps, model)]
    lines += ["", *signature_lines(result), "", *verdict_lines(result), "", *healthy_baseline_lines(result)]
    if unhealed is not None:
        lines += ["", *healing_lines(unhealed, result)]
    return "\n".join(lines) + "\n"


def capability_lines(result: dict[str, Any]) -> list[str]:
    """Accuracy ratio to the original (mean over seeds) and next-token KL, per keep and method;
    for targeted proxies also the ratio before healing and the healing steps spent."""
    targeted = result.get("targeted")
    lines = [
        f"## Proxy capability: accuracy ratio proxy / {_model(result)} (mean over seeds), next-token KL",
        "",
        "Each cell: accuracy ratio (KL)"
        + ("; from: the ratio before healing, and the mean healing steps spent" if targeted else "")
        + f". The validity checklist's capability check passes at {CAPABILITY_THRESHOLD:g}.",
        "",
    ]
    rows = []
    for keep in result["keeps"]:
        cells = [keep]
        for method in result["methods"]:
            picked = [p for p in result["proxies"] if p["keep"] == keep and p["method"] == method]
            if not picked:
                cells.append("–")
                continue
            ratio, kl = (mean_of([p[key] for p in picked]) for key in ("capability_ratio", "kl"))
            cell = f"{_fmt(ratio)} (KL {_fmt(kl)})"
            if targeted:
                before = mean_of([p.get("capability_unhealed") for p in picked])
                steps = mean_of([p.get("heal_steps") for p in picked])
                cell += f", from {_fmt(before)} in {_fmt(steps, '{:.0f}')} steps"
            cells.append(cell)
        rows.append(cells)
    return lines + _table(["keep", *result["methods"]], rows) + auto_lines(result)


def auto_lines(result: dict[str, Any]) -> list[str]:
    """Which method ``auto`` kept, per keep, seed after seed (a study without it says nothing)."""
    auto = [p for p in result["proxies"] if p["method"] == "auto" and "selected_by" in p]
    if not auto:
        return []
    kept = {keep: ", ".join(p["selected_by"] for p in auto if p["keep"] == keep) for keep in result["keeps"]}
    return ["", "`auto` kept, seed by seed: " + "; ".join(f"{k}: {v}" for k, v in kept.items() if v) + "."]


def no_signal_lines(result: dict[str, Any]) -> list[str]:
    """The share of GRPO groups with no reward variance in the healthy runs."""
    table = no_signal_table(result)
    if table.empty:
        return []
    cell = {(r.keep, r.method): r.no_signal for r in table.itertuples()}
    return [
        "## GRPO groups with no learning signal (healthy runs)",
        "",
        f"Mean share of groups whose rewards were all equal; {_model(result)} itself: "
        f"{_fmt(table['original'].iloc[0])}. A proxy at 1.00 gives RL nothing to learn from.",
        "",
        *_table(
            ["keep", *result["methods"]],
            [[keep, *(_fmt(cell.get((keep, m))) for m in result["methods"])] for keep in result["keeps"]],
        ),
    ]


def paper_fault_lines(result: dict[str, Any]) -> list[str]:
    """The paper's two faults judged the paper's way: does each fault move its curves in the same
    direction on the proxy as on the original (each against its own healthy run)?"""
    agrees = paper_fault_agreement(result)
    if agrees.empty:
        return []
    return [
        "## The paper's two faults: the same effect, in the same direction",
        "",
        "Share of proxy runs where the fault moves every one of its curves (second-half mean, against the "
        f"same model's healthy run of the same seed) in the direction it moves them on the original: "
        f"{_curves(PAPER_FAULTS)}.",
        "",
        *_share_table(agrees, result),
        "",
        "Outside the criterion, the same share for curves that over a 12-step run move by less than "
        f"the original's own noise (their sign is chance): {_curves(ALSO_REPORTED)}.",
        "",
        *_share_table(paper_fault_agreement(result, "also agrees"), result),
    ]


def _share_table(shares: Any, result: dict[str, Any]) -> list[str]:
    methods = result["methods"]
    rows = [[fault, keep, *(_fmt(row.get(m)) for m in methods)] for (fault, keep), row in shares.iterrows()]
    return _table(["fault", "keep", *methods], rows)


def healthy_curve_lines(result: dict[str, Any]) -> list[str]:
    """Curve agreement on healthy runs, per curve: how the proxy's training dynamics follow."""
    metrics = (CURVE_METRICS[0], CURVE_METRICS[1], CURVE_METRICS[2])
    rows = []
    for keep in result["keeps"]:
        for method in result["methods"]:
            runs = [
                r
                for r in result["rows"]
                if r["fault"] == "healthy" and (r["keep"], r["method"]) == (keep, method)
            ]
            if not runs:
                continue
            cells = [_fmt(mean_of([r["curves"].get(m, {}).get("spearman") for r in runs])) for m in metrics]
            rows.append([keep, method, *cells])
    heading = "## Healthy runs: curve agreement per curve (mean Spearman ρ over seeds)"
    return [heading, "", *_table(["keep", "method", *metrics], rows)]


def signature_lines(result: dict[str, Any]) -> list[str]:
    """The faults' own finding types, reproduced on time, per method."""
    methods, rows = result["methods"], result["rows"]
    table = []
    for fault in result["faults"]:
        types = KINDS[fault].signature if fault in KINDS else ()  # the finding types the fault leaves
        if not types:
            continue  # judged by its curves
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
        table.append([fault, ", ".join(types), *cells])
    heading = "## The faults' own signatures: share reproduced on time (all keeps and seeds)"
    return [heading, "", *_table(["fault", "signature", *methods], table)]


def verdict_lines(result: dict[str, Any]) -> list[str]:
    """The share of proxy runs whose verdict agrees with the original's: per keep over the faulted
    runs, and per fault over every keep."""
    methods, rows = result["methods"], result["rows"]

    def agreeing(picked: list[dict[str, Any]]) -> str:
        return _fmt(mean_of([float(r["verdict"] in ("reproduced", "both healthy")) for r in picked]))

    faulted = [r for r in rows if r["fault"] != "healthy"]
    per_keep = [
        [keep, *(agreeing([r for r in faulted if r["keep"] == keep and r["method"] == m]) for m in methods)]
        for keep in result["keeps"]
    ]
    per_fault = [
        [fault, *(agreeing([r for r in rows if r["fault"] == fault and r["method"] == m]) for m in methods)]
        for fault in result["faults"]
    ]
    rule = (
        "The verdict of `moescope diagnose --against`: judged on the injected fault's signature when it "
        "has one, on every finding otherwise."
        if any("signature" in r for r in rows)
        else "These verdicts were judged on every finding: the study was written before verdicts were "
        "judged on the fault's signature; run it again to judge them so."
    )
    return [
        "## Per keep: share of faulted runs whose verdict is *reproduced* or *both healthy*",
        "",
        rule,
        "",
        *_table(["keep", *methods], per_keep),
        "",
        "## Per fault: share of proxy runs whose verdict is *reproduced* or *both healthy*",
        "",
        *_table(["fault", *methods], per_fault),
    ]


def healthy_baseline_lines(result: dict[str, Any]) -> list[str]:
    """Which proxies raise findings without a fault, and the verdicts with those set apart."""
    from moescope.analyze.baseline import baseline_frame, baseline_summary

    frame = baseline_frame(result)
    if frame.empty:
        return []
    rows = [
        [r.keep, r.method, "; ".join(f"{s}: {', '.join(t)}" for s, t in r.own.items()) or "–",
         *map(_fmt, (r.verdicts, r.verdicts_based, r.hit, r.hit_based))]
        for r in baseline_summary(frame).itertuples()
    ]  # fmt: skip
    proxies = frame.drop_duplicates(["keep", "method", "seed"])
    return [
        "## With each proxy's healthy run as baseline (`moescope diagnose --healthy`)",
        "",
        f"{sum(map(bool, proxies['own']))} of {len(proxies)} proxies raise, in their healthy run, a finding "
        f"{_model(result)}'s healthy run of the same seed does not (*own*, seed: types). With that run as "
        "baseline, such a finding is set apart in the proxy's faulted runs: neither a false alarm nor a "
        "reproduction of the original's finding of the same type. Faulted runs only: share whose verdict "
        "is *reproduced* or *both healthy*, and share of the original's findings reproduced on time, "
        "without and with.",
        "",
        *_table(["keep", "method", "own", "verdicts", "with baseline", "hit", "hit, with baseline"], rows),
    ]


def healing_lines(unhealed: dict[str, Any], healed: dict[str, Any]) -> list[str]:
    """What healing changes: hit share and capability of the same proxies without and with it."""
    what = "capability targeting" if healed.get("targeted") else f"{healed['heal_steps']} steps of healing"
    lines = [
        f"## What {what} changes",
        "",
        "The same exports unhealed (the study beside this one) and here: share of the original's findings "
        "reproduced on time, and task accuracy relative to the original.",
        "",
    ]
    header = ["keep", "method", "hit, unhealed", "hit, healed", "capability, unhealed", "capability, healed"]
    rows = [
        [row.keep, row.method, _fmt(row.hit_unhealed), _fmt(row.hit_healed),
         _fmt(row.capability_unhealed), _fmt(row.capability_healed)]
        for row in healing_effect(unhealed, healed).itertuples()
    ]  # fmt: skip
    return lines + _table(header, rows)


def cost_lines(table: Any, keeps: tuple[str, ...], model: str = "toy") -> list[str]:
    """What each keep ratio costs: devices from the cost model for published models, and the
    proxies' measured step time (mean over methods)."""
    from moescope.export.cost import reference_table

    ref = reference_table()
    models = ("DeepSeek-V3", "Kimi-K2", "Qwen3-235B-A22B")
    lines = [
        "## What each keep ratio costs",
        "",
        "Accelerators to RL-train the model from the cost model (`moescope cost --reference`: 80 GB devices, "
        f"90 % usable); step time measured on {model}'s proxies, relative to {model} (the same top-k, so "
        "per-token compute stays).",
        "",
    ]
    rows = []
    for keep in ("full", *keeps):
        cells = [keep]
        for name in models:
            row = ref[(ref["model"] == name) & (ref["keep"] == keep)]
            cells.append("–" if row.empty else str(int(row["devices"].iloc[0])))
        step = "1.00" if keep == "full" else _fmt(table[table["keep"] == keep]["step_ratio"].mean())
        rows.append([*cells, step])
    return lines + _table(["keep", *(f"{m} devices" for m in models), f"proxy step time / {model}"], rows)


def write_chart(result: dict[str, Any], path: Path) -> None:
    """The study chart as a standalone SVG (vl-convert, offline)."""
    import vl_convert

    from moescope.display.charts import study_chart

    path.write_text(vl_convert.vegalite_to_svg(study_chart(study_summary(study_frame(result))).to_dict()))


def stem_for(out: Path, model: str, targeted: bool = False) -> Path:
    """``OUT/fidelity-study[-MODEL][-targeted]`` (:func:`moescope.export.study.study_file`)."""
    return out / Path(study_file(model, targeted)).stem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy", choices=MODELS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--keeps", nargs="+", default=KEEPS, help="a subset, for a quick look")
    parser.add_argument("--methods", nargs="+", default=METHODS + ABLATIONS, choices=METHODS + ABLATIONS)
    parser.add_argument(
        "--ablation-keeps", nargs="+", default=("1/4",), help="keeps the view ablations run at"
    )
    parser.add_argument("--faults", nargs="+", default=tuple(FAULTS), choices=tuple(FAULTS))
    parser.add_argument(
        "--targeted", action="store_true", help="capability-targeted proxies; writes ...-targeted.*"
    )
    parser.add_argument("--tables-only", action="store_true", help="rewrite the .md from OUT's .json")
    parser.add_argument(
        "--rejudge", action="store_true", help="judge OUT's study again from the replays it saved"
    )
    parser.add_argument(
        "--work", type=Path, help="the work directory; an interrupted study's proxies there are reused"
    )
    parser.add_argument(
        "--merge", action="store_true", help="add the --methods run now to OUT's study of the model"
    )
    args = parser.parse_args()
    stem = stem_for(args.out, args.model, args.targeted)
    if args.tables_only or args.rejudge:
        result = read_study(stem.with_suffix(".json"))
        if args.rejudge:
            result = rejudge(result)
            stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    else:
        result = run(
            args.model, args.seeds, args.steps, args.workers, tuple(args.keeps), tuple(args.methods),
            tuple(args.faults), args.targeted, tuple(args.ablation_keeps), args.work,
        )  # fmt: skip
        if args.merge:
            result = merged(read_study(stem.with_suffix(".json")), result)
        args.out.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    unhealed = stem_for(args.out, args.model).with_suffix(".json")
    text = markdown(result, read_study(unhealed) if args.targeted and unhealed.is_file() else None)
    stem.with_suffix(".md").write_text(text)
    write_chart(result, stem.with_suffix(".svg"))
    print(text)
    print(f"wrote {stem}.md, .json and .svg", file=sys.stderr)


if __name__ == "__main__":
    main()
