"""The ``moescope`` command line.

Each subcommand is a thin wrapper over one library call. A user mistake raises
:class:`~moescope.errors.MoescopeError`; it is printed as one sentence on stderr with exit
status 2 and no traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from moescope import schema as S
from moescope._util.flags import add_flags, config_field, flag_values, shown_default
from moescope._util.process import leave
from moescope._version import __version__
from moescope.errors import MoescopeError
from moescope.export.config import ExportConfig
from moescope.replay.config import ReplayConfig

if TYPE_CHECKING:
    from moescope.export.targeting import Targeting

DEMO_DIR = Path("moescope-demo")
MODEL_HELP = "a local Hugging Face checkpoint directory, or 'toy' / 'toy-v3' (the embedded models)"

# Each command imports its stage when it runs, not at the top: torch and transformers take
# seconds to import, and `moescope --help` or `moescope diagnose` never need them.


def cmd_toy(args: argparse.Namespace) -> int:
    from moescope.models.embedded import embedded_path, write_embedded

    path = (
        write_embedded(args.name, args.out, overwrite=args.overwrite)
        if args.out
        else embedded_path(args.name)
    )
    print(path)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from moescope.models.summary import summarize

    summary = summarize(args.model)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.text())
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    import pandas as pd

    from moescope.export.cost import DEFAULT_KEEPS, cost_json, cost_table, cost_text, reference_table
    from moescope.export.cost.assumptions import assumed

    if args.model is None and not args.reference:
        raise MoescopeError(
            "give a MODEL (checkpoint directory, config.json, 'toy' or 'toy-v3'), or --reference."
        )
    profile, workload, memory = assumed(args.device, args.assume, args.device_memory, args.usable_fraction)
    keeps = args.keep or DEFAULT_KEEPS
    options = {
        "memory": memory,
        "step_time_s": _measured_steps(args.step_time, keeps),
        "rounding": args.round,
    }
    options |= {"profile": profile, "workload": workload}
    given = _per_row(args.devices, "--devices", "KEEP=N", whole=True)
    tables = (
        [cost_table(args.model, keeps, strict=bool(args.keep), devices=given, **options)]
        if args.model
        else []
    )
    if args.reference:
        tables.append(reference_table(keeps, **options))
    table = pd.concat(tables, ignore_index=True)
    shown = (table, memory, args.round, profile, workload)
    print(json.dumps(cost_json(*shown), indent=2) if args.json else cost_text(*shown))
    return 0


def _measured_steps(pairs: list[str] | None, keeps: list[str]) -> float | dict[str, float | None] | None:
    """``--step-time``: one number for every row, or per row (``full=3000``), a bare number
    standing for the rows not named."""
    per_row = _per_row(pairs, "--step-time", "S or KEEP=S", whole=False)
    every = per_row.pop("*", None)
    if not per_row:
        return every
    return {label: per_row.get(label, every) for label in ("full", *map(str, keeps))}


def _per_row(pairs: list[str] | None, flag: str, example: str, whole: bool) -> dict[str, float]:
    """``--devices full=512 --devices 16=64`` as ``{"full": 512, "16": 64}``; a bare number
    (``--step-time 600``) is every row's, under the key ``"*"``."""
    given: dict[str, float] = {}
    for pair in pairs or []:
        label, _, value = pair.rpartition("=")
        try:
            number = int(value) if whole else float(value)
        except ValueError:
            number = 0
        if not number > 0 or (whole and not label):
            raise MoescopeError(
                f"{flag} {pair!r} is not {example}; write e.g. {flag} full=512 {flag} 1/8=64."
            )
        given[label.strip() or "*"] = number
    return given


def _print_method_choice(choice: dict | None) -> None:
    """What ``--method auto`` measured of each candidate, and what it kept."""
    if not choice:
        return
    if choice.get("why"):
        print(f"method auto: {choice['fallback']}, since nothing can be measured ({choice['why']})")
    for c in choice["choices"]:
        ratios = ", ".join(f"{m} {'n/a' if r is None else f'{r:.2f}'}" for m, r in c["ratios"].items())
        print(f"method auto, keep {c['keep']}: accuracy ratio {ratios} -> {c['chosen']}")


def cmd_export(args: argparse.Namespace) -> int:
    from moescope.export.pipeline import export_proxy

    config, progress = export_config(args), sys.stderr.isatty()
    result = export_proxy(args.model, config, out=args.out, overwrite=args.overwrite, progress=progress)
    m = result.manifest
    print(
        f"proxy: {result.path} ({m['keep']} of {m['source']['num_experts']} routed experts per layer, "
        f"{m['keep_ratio']:.1%}, method {m['method']})"
    )
    original = m.get("original")
    if original is not None:
        figure = original.get("accuracy", {}).get("source")
        accuracy = f"; its accuracy {figure}" if figure else ""
        reads = original.get("checkpoint_reads")
        read = f"; its checkpoint read {reads} time{'' if reads == 1 else 's'}" if reads is not None else ""
        print(f"original: read {original['read']} ({original['why']}{read}){accuracy}")
        if "device" in original:
            print(f"compute: {original['device']}, {original['dtype']} ({original['compute_why']})")
    _print_method_choice(m.get("method_choice"))
    if result.healing is not None:
        h = result.healing
        print(f"healing: {h.steps} steps, held-out KL {h.kl_before:.4f} -> {h.kl_after:.4f}")
    c = m.get("calibration", {})
    if c.get("sampled"):
        print(f"calibration: rl, {c['prompts']} replay prompts + own samples ({c['tokens']} tokens)")
    elif c.get("source") == "rollouts":
        given = f"{c['prompts']} prompts ({c['tokens']} tokens)"
        print(f"calibration: rollouts of {c['file']}, {given}, none sampled")
    elif c.get("used", True) and c.get("source"):
        print(f"calibration: {c['source']}" + (f" ({c['data']})" if c.get("data") else ""))
    if result.targeting is not None:
        _print_targeting(result.targeting, m["source"]["num_experts"])
    if result.fidelity is not None:
        f = result.fidelity
        print(
            f"fidelity: KL {f.kl:.4f} nats, top-1 agreement {f.top1_agreement:.3f}, "
            f"perplexity ratio {f.perplexity_ratio:.3f}"
        )
    for check in result.checklist or ():
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.figure}")
    if result.checklist is None:
        print(f"capability: not measured: {_unmeasured(m)}")
    if result.targeting is not None and not result.targeting.passed:
        print(f"FAIL: the proxy misses its capability target: {result.targeting.reason}")
    return 0


def _unmeasured(manifest: dict[str, Any]) -> str:
    """Why an export measured no capability, from its manifest."""
    targeting = manifest.get("targeting") or {}
    if targeting.get("why"):
        return targeting["why"]
    if not manifest["config"].get("fidelity"):
        return "fidelity is off (--no-fidelity)"
    return manifest.get("calibration", {}).get("why", "no measurement was asked for")


def _print_targeting(t: Targeting, num_experts: int) -> None:
    """Each kept count tried: its accuracy ratio before and after healing, the curve, pass or fail."""
    head = f"capability target {t.min_capability:g} (healing up to {t.heal_budget} steps"
    print(f"{head}, {t.heal_round} per round{', keep auto' if t.searched else ''}):")
    for a in t.attempts:
        curve = ", ".join(f"{steps}: {ratio:.2f}" for steps, ratio in a.curve)
        verdict = "pass" if a.passed else "fail"
        print(
            f"  keep {a.keep} of {num_experts} ({a.keep_ratio:.1%}): accuracy ratio {a.before:.2f} -> "
            f"{a.after:.2f} after {a.steps} healing steps, {verdict} (steps: ratio {curve})"
        )
    if t.searched:
        print(f"  chose keep {t.keep} of {num_experts}")


def cmd_replay(args: argparse.Namespace) -> int:
    from moescope.replay import replay

    if args.out.exists() and not (args.resume or args.overwrite):
        raise MoescopeError(f"{args.out} exists; pass --resume to continue it or --overwrite to replace it.")
    trace = replay(
        args.model,
        replay_config(args),
        out=args.out,
        resume=args.resume,
        checkpoint_every=args.checkpoint_every,
        progress=sys.stderr.isatty(),
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 reports
        return 0
    last = trace.steps[-1] if trace.steps else {}
    skipped = sum(int(s.get(S.SKIPPED, 0)) for s in trace.steps)
    bad = sum(1 for s in trace.steps if s.get(S.NONFINITE))
    print(
        f"trace: {args.out} ({len(trace.steps)} steps; "
        f"last reward {last.get(S.REWARD_MEAN, float('nan')):.3f}, "
        f"{skipped} skipped updates, {bad} steps with non-finite values)"
    )
    return 0


def cmd_heal(args: argparse.Namespace) -> int:
    from moescope.export.sharded_healing import heal_exported
    from moescope.replay.comm import Comm

    sharded = args.shard == "fsdp"
    with Comm.from_env(sharded=sharded) as comm:
        report = heal_exported(
            args.proxy,
            teacher=args.teacher,
            original=args.original,
            steps=args.steps,
            lr=args.lr,
            seed=args.seed,
            batch_size=args.batch_size,
            shard=sharded,
            min_capability=args.min_capability,
            heal_round=args.heal_round,
        )
    if comm.is_main:
        where = f"{comm.world} processes, sharded" if sharded else "one process"
        print(
            f"healed {args.proxy}: {report.steps} steps on {where}; KL to the original on the teacher "
            f"batches {report.kl_before:.4f} -> {report.kl_after:.4f}, top-1 agreement "
            f"{report.top1_before:.3f} -> {report.top1_after:.3f}; {report.frozen_verified} frozen "
            "tensors verified unchanged (fidelity and checklist dropped: measure them again)"
        )
        target = report.capability
        if target:
            curve = ", ".join(f"{r['steps']}: {r['ratio']:.2f}" for r in target["rounds"])
            verdict = "reached" if target["reached"] else "NOT reached"
            head = f"capability target {target['min_capability']:g} {verdict}"
            print(f"{head} (teacher-forced; steps: ratio {curve})")
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from moescope.analyze.diagnosis import diagnose
    from moescope.analyze.readers import read_log
    from moescope.analyze.remedies import next_steps, next_steps_text
    from moescope.analyze.runs import diagnose_runs
    from moescope.analyze.verdict import compare, compare_healthy
    from moescope.replay.faults import parse_faults
    from moescope.traces import json_value

    if args.fault:
        parse_faults(args.fault)  # a name moescope does not know is one sentence, before any reading
    if args.run is None and not (args.healthy or args.against):  # every pasted run, each on its own
        done = diagnose_runs(args.trace, format=args.format)
        print(json.dumps(done.to_dict(), indent=1, default=json_value) if args.json else done.text())
        return 0
    trace = read_log(args.trace, format=args.format, run=-1 if args.run is None else args.run)
    findings = diagnose(trace)
    result: dict = {
        "format": trace.header.get("format"),
        "steps": len(trace.steps),
        "findings": [{**f.to_dict(), "next": next_steps(f)} for f in findings],
        "notes": list(trace.notes),
    }
    comparison = healthy = None
    if args.healthy and not args.against:
        raise MoescopeError("--healthy judges a comparison; pass the proxy's trace with --against as well.")
    if args.healthy:
        healthy = compare_healthy(*(read_log(p, format=args.format) for p in args.healthy))
        result["healthy"] = healthy.to_dict()
    if args.against:
        other = read_log(args.against, format=args.format)
        faults = () if args.every_finding else args.fault
        comparison = compare(trace, other, original_findings=findings, faults=faults, healthy=healthy)
        result["comparison"] = comparison.to_dict()
    if args.json:
        print(json.dumps(result, indent=1, default=json_value))
        return 0
    print(f"{args.trace}: {result['format']}, {result['steps']} steps")
    for note in trace.notes:
        print(f"  note: {note}")
    if not findings:
        print("  no findings")
    for f in findings:
        where = f"step {f.step}" if f.step is not None else "step ?"
        layer = f" layer {f.layer}" if f.layer is not None else ""
        print(f"  [{f.severity}] {where}{layer} {f.type}: {f.message}")
        if f.severity != "info":  # an info (the fp16 scaler settling) needs nothing fixed
            print("\n".join(f"      {line}" for line in next_steps_text(f)))
    if healthy is not None:
        own = (
            ", ".join(f"{t} (step {s})" for t, s in comparison.own.items())
            or "nothing the original's does not"
        )
        print(f"healthy runs {args.healthy[0]} and {args.healthy[1]}: the proxy raises {own}")
    if comparison is not None:
        print(f"against {args.against}: {comparison.verdict}")
        for reason in comparison.reasons:
            print(f"  - {reason}")
    return 0


def _against_original(agreement: dict[str, bool | None] | None, kind: str, theirs: dict[str, str]) -> str:
    """What the original's validation says of one finding type, for a line of the proxy's."""
    if agreement is None:
        return ""
    verdict = theirs.get(kind, "not raised")
    if agreement[kind] is None:
        return f"  (the original: {verdict}; not compared, a model's own finding)"
    return "  (the original: the same)" if agreement[kind] else f"  (the original: {verdict})"


def cmd_validate(args: argparse.Namespace) -> int:
    from moescope.analyze.validation import validate

    result = validate(
        args.model,
        args.validate_fault,
        args.fix,
        config=replay_config(args),
        original=args.original,
        out=args.out,
        overwrite=args.overwrite,
        healthy=not args.no_healthy,
    )
    agreement = result.agreement()
    print(f"{args.model} under {result.fault}, fixed with {', '.join(result.fixes)}:")
    for note in result.notes:
        print(f"  note: {note}")
    if not result.outcomes:
        print("  the fault raises no warning or error, with or without the fix")
    theirs = result.original.verdicts if result.original else {}
    for o in result.outcomes:
        why = " (raised without the fault too: the model's own, not judged)" if o.verdict == "own" else ""
        print(f"  {o.type}: {o.verdict}{why}{_against_original(agreement, o.type, theirs)}")
    for t in sorted(theirs.keys() - result.verdicts.keys()):
        print(f"  {t}: not raised{_against_original(agreement, t, theirs)}")
    c = result.cost
    print(
        f"  cost: step time x{c['step_time_ratio']:.2f}, "
        f"mean reward {c['reward_fault']:.3f} -> {c['reward_fixed']:.3f}"
    )
    print(
        f"  in one word: {result.summary}"
        + (f" (the original: {result.original.summary})" if result.original else "")
    )
    print(f"validation: {args.out / 'validation.json'}")
    try:
        from moescope.display.charts.validation import save_validation_charts

        charts = save_validation_charts(args.out)
    except (ImportError, MoescopeError):  # the notebook extra (altair, vl-convert) is missing
        print("charts: none (install moescope[notebook] to draw them)")
    else:
        print(f"charts: {', '.join(str(p) for p in charts)}")
    return 0


def export_config(args: argparse.Namespace) -> ExportConfig:
    """The export's config: the defaults, with the flags given on the command line put in."""
    return ExportConfig.from_dict(flag_values(args, ExportConfig))


def replay_config(args: argparse.Namespace) -> ReplayConfig:
    """The replay's config: the defaults, or a ``--config`` file's fields, with the flags given put in."""
    options = _read_replay_config(args.config) if args.config else {}
    options.update(flag_values(args, ReplayConfig))
    if args.fault:
        options["faults"] = tuple(args.fault)
    if args.entropy_floor is not None:
        options["token_entropy_flow_control"], options["min_entropy_floor"] = True, args.entropy_floor
    return ReplayConfig.from_dict(options)


def _read_replay_config(path: Path) -> dict:
    from moescope._util.io import read_json_object

    return read_json_object(path, 'pass a JSON object of ReplayConfig fields, e.g. {"steps": 10}')


def cmd_report(args: argparse.Namespace) -> int:
    from moescope.report.pipeline import run_report

    report = run_report(args.model, args.out, overwrite=args.overwrite, progress=sys.stderr.isatty())
    print(f"report: {report.index_html}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from moescope.report.pipeline import run_report

    report = run_report("toy", args.out, overwrite=True, progress=sys.stderr.isatty())
    print(f"demo report: {report.index_html.resolve()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moescope",
        description="Cheap proxy models of MoE LLMs for reproducing RL post-training failures.",
    )
    parser.add_argument("--version", action="version", version=f"moescope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_toy,
        _add_inspect,
        _add_cost,
        _add_export,
        _add_replay,
        _add_heal,
        _add_diagnose,
        _add_validate,
        _add_report,
    ):
        add(sub)
    return parser


def _command(
    sub: argparse._SubParsersAction, name: str, func: Callable[[argparse.Namespace], int], help_: str
) -> argparse.ArgumentParser:
    command = sub.add_parser(name, help=help_, description=help_)
    command.set_defaults(func=func)
    return command


def _add_toy(sub: argparse._SubParsersAction) -> None:
    from moescope.models.embedded import EMBEDDED

    toy = _command(sub, "toy", cmd_toy, "write an embedded model (default: the toy); print its path")
    toy.add_argument(
        "--name", choices=list(EMBEDDED), default="toy", help="which embedded model (default: toy)"
    )
    toy.add_argument("--out", type=Path, help="copy the checkpoint here (default: print the packaged copy)")
    toy.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    inspect = _command(
        sub, "inspect", cmd_inspect, "architecture summary: layers, experts, top-k, router, params"
    )
    inspect.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")


def _add_cost(sub: argparse._SubParsersAction) -> None:
    from moescope.export.cost import ROUNDINGS

    cost = _command(
        sub, "cost", cmd_cost, "accelerators to RL-train the full model vs its proxies, and the reduction"
    )
    cost.add_argument("model", nargs="?", metavar="MODEL|CONFIG.json", help=MODEL_HELP + ", or a config.json")
    cost.add_argument(
        "--keep",
        action="append",
        metavar="K",
        help="routed experts kept: 0.25, 1/4 or a count; repeat for several (default: 1/2, 1/4, 1/8)",
    )
    cost.add_argument(
        "--device",
        default="h100",
        metavar="NAME|JSON",
        help="accelerator to predict step time on: h100, h200, h20, ascend-910b or a JSON profile "
        "(default h100)",
    )
    cost.add_argument(
        "--assume",
        action="append",
        metavar="KEY=VALUE",
        help="override a device or workload assumption (prompts=256, mfu=0.4, inter_node_gb_s=50)",
    )
    cost.add_argument(
        "--devices",
        action="append",
        metavar="KEEP=N",
        help="cost N devices for a row instead of the memory model's",
    )
    cost.add_argument(
        "--device-memory", type=float, metavar="GB", help="accelerator memory (default: the device's)"
    )
    cost.add_argument("--usable-fraction", type=float, metavar="F", help="usable share (default 0.9)")
    cost.add_argument(
        "--step-time",
        action="append",
        metavar="S|KEEP=S",
        help="measured seconds per RL step instead of predicted: every row's, or one row's (full=3000)",
    )
    cost.add_argument("--round", choices=ROUNDINGS, default="device", help="round device counts up to this")
    cost.add_argument("--reference", action="store_true", help="also cost the published MoE models")
    cost.add_argument("--json", action="store_true", help="print the table as JSON")


def _add_export(sub: argparse._SubParsersAction) -> None:
    """``moescope export``: a flag per :class:`ExportConfig` field, generated from the field."""
    export = _command(
        sub, "export", cmd_export, "build a proxy: keep the selected routed experts of every MoE layer"
    )
    export.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="proxy directory")
    add_flags(export, ExportConfig)
    export.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")


def _add_heal(sub: argparse._SubParsersAction) -> None:
    """``moescope heal``: distil an exported proxy toward its original's cached distributions."""
    heal = _command(
        sub,
        "heal",
        cmd_heal,
        "heal an exported proxy against its original's cached next-token distributions "
        "(the original read a layer at a time; under torchrun, --shard fsdp shards the proxy)",
    )
    heal.add_argument("proxy", metavar="PROXY", type=Path, help="an exported proxy directory (rewritten)")
    heal.add_argument("--steps", type=int, default=50, metavar="N", help="healing steps (default: 50)")
    heal.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default: 0.001)")
    heal.add_argument("--seed", type=int, default=0, help="seed of the healing batches (default: 0)")
    heal.add_argument("--batch-size", type=int, default=32, metavar="B", help="rows per step (default: 32)")
    heal.add_argument(
        "--teacher", type=Path, metavar="FILE", help="a teacher cache (default: built once and kept)"
    )
    heal.add_argument(
        "--original", metavar="MODEL", help="the original checkpoint (default: the manifest's source)"
    )
    heal.add_argument(
        "--min-capability",
        type=float,
        default=0.0,
        metavar="X",
        help="heal in rounds until the proxy keeps this share of the original's accuracy (default: 0, off)",
    )
    heal.add_argument(
        "--heal-round", type=int, default=10, metavar="STEPS", help="steps between measurements (default: 10)"
    )
    heal.add_argument(
        "--shard",
        choices=("none", "fsdp"),
        default="none",
        help="fsdp: shard the proxy over the torchrun processes (FSDP2) (default: none)",
    )


def _add_replay(sub: argparse._SubParsersAction) -> None:
    """``moescope replay``: the flagged :class:`ReplayConfig` fields, generated from the fields, and
    the flags that set several fields or none (their defaults still read from the config)."""
    rp = _command(
        sub, "replay", cmd_replay, "replay short RL post-training (GRPO/GEPO) with faults; write a trace"
    )
    rp.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    rp.add_argument("--out", type=Path, required=True, metavar="TRACE", help="trace file (JSON Lines)")
    add_flags(rp, ReplayConfig)
    entropy = shown_default(config_field(ReplayConfig, "token_entropy_flow_control"))
    rp.add_argument(
        "--entropy-floor",
        type=float,
        metavar="X",
        help=f"OPEFO entropy flow control with floor X (default: {entropy})",
    )
    faults = shown_default(config_field(ReplayConfig, "faults"))
    rp.add_argument(
        "--fault",
        action="append",
        metavar="NAME[@STEP][:ARG]",
        help=f"inject a fault (repeatable; see docs) (default: {faults})",
    )
    rp.add_argument(
        "--config", type=Path, metavar="JSON", help="ReplayConfig fields as JSON (flags override)"
    )
    rp.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="checkpoint every N steps (default: never)",
    )
    rp.add_argument("--resume", action="store_true", help="continue --out from its last checkpoint")
    rp.add_argument("--overwrite", action="store_true", help="replace an existing trace")


def _add_diagnose(sub: argparse._SubParsersAction) -> None:
    dg = _command(
        sub, "diagnose", cmd_diagnose, "findings of a trace or training log, and the reproduction verdict"
    )
    dg.add_argument(
        "trace", type=Path, metavar="TRACE", help="a moescope trace or a training log (verl, TRL, ...)"
    )
    dg.add_argument(
        "--against", type=Path, metavar="TRACE", help="the proxy's trace: compare and give a verdict"
    )
    judge = dg.add_mutually_exclusive_group()
    judge.add_argument(
        "--every-finding",
        action="store_true",
        help="with --against: judge every finding, not only the injected fault's signature",
    )
    judge.add_argument(
        "--fault",
        action="append",
        metavar="NAME",
        help="with --against: the fault both runs injected, for logs whose header does not say (verl, ...)",
    )
    dg.add_argument(
        "--healthy",
        nargs=2,
        type=Path,
        metavar=("ORIGINAL", "PROXY"),
        help="with --against: both models' runs without the fault; findings the proxy raises there "
        "and the original does not are the proxy's own, set apart from the verdict",
    )
    dg.add_argument("--format", metavar="NAME", help="the log format, when auto-detection guesses wrong")
    dg.add_argument(
        "--run",
        type=int,
        default=None,
        metavar="N",
        help="of several runs pasted in one log, diagnose run N alone (0 the first, -1 the last; "
        "default: each run on its own; with --against or --healthy: the last)",
    )
    dg.add_argument(
        "--json", action="store_true", help='print one object: {"format", "steps", "findings", ...}'
    )


def _add_validate(sub: argparse._SubParsersAction) -> None:
    """``moescope validate``: a fault with and without candidate fixes; the replay flags set both runs."""
    from moescope.analyze.fixes import FIXES

    va = _command(
        sub,
        "validate",
        cmd_validate,
        "replay a fault with and without a fix: does the fix remove its findings?",
    )
    va.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    va.add_argument(
        "--fault", dest="validate_fault", required=True, metavar="NAME[@STEP][:ARG]", help="the fault"
    )
    va.add_argument(
        "--fix",
        action="append",
        required=True,
        metavar="NAME[:ARG]",
        help=f"a fix (repeatable): {', '.join(FIXES)}",
    )
    va.add_argument(
        "--original", metavar="MODEL", help="the proxy's source: run it too and compare the verdicts"
    )
    va.add_argument("--out", type=Path, required=True, metavar="DIR", help="traces and validation.json")
    va.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    va.add_argument(
        "--no-healthy",
        action="store_true",
        help="skip the run without the fault (its findings are the model's own, left out of the verdict)",
    )
    va.add_argument(
        "--config", type=Path, metavar="JSON", help="ReplayConfig fields as JSON (flags override)"
    )
    add_flags(va, ReplayConfig)
    va.set_defaults(fault=None, entropy_floor=None)


def _add_report(sub: argparse._SubParsersAction) -> None:
    """``moescope report`` and ``moescope demo``, the report on the toy model."""
    report = _command(
        sub, "report", cmd_report, "run the notebooks with papermill; write notebooks + offline HTML"
    )
    report.add_argument("--model", default="toy", metavar="MODEL", help=MODEL_HELP + " (default: toy)")
    report.add_argument("--out", type=Path, required=True, metavar="DIR", help="report directory")
    report.add_argument("--overwrite", action="store_true", help="replace an existing report directory")

    demo = _command(sub, "demo", cmd_demo, "the report on the toy model, into ./moescope-demo")
    demo.add_argument("--out", type=Path, default=DEMO_DIR, help=argparse.SUPPRESS)


def _quiet() -> None:
    """Library chatter (transformers warnings, progress bars of weight loading) is not for users."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")


_NUMBERS = re.compile(r"^-\d*\.?\d+(,-?\d*\.?\d+)+$")


def _joined_number_lists(argv: Sequence[str]) -> list[str]:
    """``--view-weights -1,1`` read as ``--view-weights=-1,1``: argparse takes a value that starts
    with a minus for an option unless it is one number, so a list would fail as "expected one
    argument" instead of reaching the check that names the problem."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NUMBERS.match(token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``moescope`` script; returns the exit status."""
    args = build_parser().parse_args(_joined_number_lists(sys.argv[1:] if argv is None else argv))
    _quiet()
    try:
        return args.func(args)
    except MoescopeError as exc:
        print(f"moescope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("moescope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def script() -> NoReturn:
    """Entry point of the ``moescope`` script and of ``python -m moescope``: exit with ``main``'s
    status (a ``torchrun`` worker without the interpreter's teardown: :mod:`moescope._util.process`)."""
    leave(main())


if __name__ == "__main__":
    script()
