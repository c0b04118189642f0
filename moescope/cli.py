"""The ``moescope`` command line.

Each subcommand is a thin wrapper over one library call. A user mistake raises
:class:`~moescope.errors.MoescopeError`; it is printed as one sentence on stderr with exit
status 2 and no traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from moescope._version import __version__
from moescope.errors import MoescopeError

DEMO_DIR = Path("moescope-demo")


def cmd_toy(args: argparse.Namespace) -> int:
    from moescope.models.toy import toy_path, write_toy

    path = write_toy(args.out, overwrite=args.overwrite) if args.out else toy_path()
    print(path)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from moescope.models.summary import summarize

    summary = summarize(args.model)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.text())
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    import pandas as pd

    from moescope.export.cost.model import (
        DEFAULT_KEEPS,
        TrainingMemory,
        cost_json,
        cost_table,
        cost_text,
        reference_table,
    )

    if args.model is None and not args.reference:
        raise MoescopeError("give a MODEL (checkpoint directory, config.json or 'toy'), or --reference.")
    given = {"device_memory_gb": args.device_memory, "usable_fraction": args.usable_fraction}
    memory = TrainingMemory(**{key: value for key, value in given.items() if value is not None})
    options = {"memory": memory, "step_time_s": args.step_time, "rounding": args.round}
    keeps = args.keep or DEFAULT_KEEPS
    tables = [cost_table(args.model, keeps, strict=bool(args.keep), **options)] if args.model else []
    if args.reference:
        tables.append(reference_table(keeps, **options))
    table = pd.concat(tables, ignore_index=True)
    if args.json:
        print(json.dumps(cost_json(table, memory, args.round), indent=2))
    else:
        print(cost_text(table, memory, args.round))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from moescope.export.pipeline import export_proxy

    result = export_proxy(
        args.model,
        args.out,
        keep=args.keep,
        selection=args.selection,
        method=args.method,
        seed=args.seed,
        calibration=args.calibration,
        n_tokens=args.n_tokens,
        allow_top_k=args.allow_top_k,
        overwrite=args.overwrite,
        progress=sys.stderr.isatty(),
        streaming=args.streaming,
        heal_steps=args.heal_steps,
        heal_lr=args.heal_lr,
        fidelity=not args.no_fidelity,
        tasks=args.prompts,
    )
    m = result.manifest
    print(
        f"proxy: {result.path} ({m['keep']} of {m['source']['num_experts']} routed experts per layer, "
        f"{m['keep_ratio']:.1%}, method {m['method']})"
    )
    if result.healing is not None:
        h = result.healing
        print(f"healing: {h.steps} steps, held-out KL {h.kl_before:.4f} -> {h.kl_after:.4f}")
    if result.fidelity is not None:
        f = result.fidelity
        print(
            f"fidelity: KL {f.kl:.4f} nats, top-1 agreement {f.top1_agreement:.3f}, "
            f"perplexity ratio {f.perplexity_ratio:.3f}"
        )
    for check in result.checklist or ():
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.figure}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from moescope.replay import replay
    from moescope.replay.config import ReplayConfig

    if args.out.exists() and not (args.resume or args.overwrite):
        raise MoescopeError(f"{args.out} exists; pass --resume to continue it or --overwrite to replace it.")
    options = _read_replay_config(args.config) if args.config else {}
    flags = {
        "steps": args.steps,
        "seed": args.seed,
        "algo": args.algo,
        "pivot": args.pivot or None,
        "precision": args.precision,
        "rollout_precision": args.rollout_precision,
        "prompts": str(args.prompts) if args.prompts else None,
        "reward": args.reward,
        "group_size": args.group_size,
        "prompts_per_step": args.prompts_per_step,
        "lr": args.lr,
        "kl_beta": args.kl_beta,
        "loop_times": args.loop_times,
        "faults": tuple(args.fault) if args.fault else None,
    }
    if args.entropy_floor is not None:
        flags["token_entropy_flow_control"], flags["min_entropy_floor"] = True, args.entropy_floor
    options.update({k: v for k, v in flags.items() if v is not None})
    config = ReplayConfig.from_dict(options)
    trace = replay(
        args.model,
        config,
        out=args.out,
        resume=args.resume,
        checkpoint_every=args.checkpoint_every,
        progress=sys.stderr.isatty(),
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 reports
        return 0
    last = trace.steps[-1] if trace.steps else {}
    skipped = sum(int(s.get("optim/skipped", 0)) for s in trace.steps)
    bad = sum(1 for s in trace.steps if s.get("health/nonfinite"))
    print(
        f"trace: {args.out} ({len(trace.steps)} steps; "
        f"last reward {last.get('reward/mean', float('nan')):.3f}, "
        f"{skipped} skipped updates, {bad} steps with non-finite values)"
    )
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    from moescope.analyze.diagnosis import diagnose
    from moescope.analyze.readers import read_log
    from moescope.analyze.verdict import compare
    from moescope.traces import json_value

    trace = read_log(args.trace, format=args.format)
    findings = diagnose(trace)
    result: dict = {
        "format": trace.header.get("format"),
        "steps": len(trace.steps),
        "findings": [f.to_dict() for f in findings],
        "notes": list(trace.notes),
    }
    comparison = None
    if args.against:
        other = read_log(args.against, format=args.format)
        comparison = compare(trace, other, original_findings=findings)
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
    if comparison is not None:
        print(f"against {args.against}: {comparison.verdict}")
        for reason in comparison.reasons:
            print(f"  - {reason}")
    return 0


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

    def add(name: str, func: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_, description=help_)
        command.set_defaults(func=func)
        return command

    model_help = "a local Hugging Face checkpoint directory, or 'toy' (the embedded model)"

    toy = add("toy", cmd_toy, "write the embedded toy model; print its path")
    toy.add_argument("--out", type=Path, help="copy the checkpoint here (default: print the packaged copy)")
    toy.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")

    inspect = add("inspect", cmd_inspect, "architecture summary: layers, experts, top-k, router, params")
    inspect.add_argument("model", metavar="MODEL", help=model_help)
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")

    from moescope.export.cost.model import ROUNDINGS

    cost = add("cost", cmd_cost, "accelerators to RL-train the full model vs its proxies, and the reduction")
    cost.add_argument("model", nargs="?", metavar="MODEL|CONFIG.json", help=model_help + ", or a config.json")
    cost.add_argument(
        "--keep",
        action="append",
        metavar="K",
        help="routed experts kept: 0.25, 1/4 or a count; repeat for several (default: 1/2, 1/4, 1/8)",
    )
    cost.add_argument("--device-memory", type=float, metavar="GB", help="accelerator memory (default 80)")
    cost.add_argument("--usable-fraction", type=float, metavar="F", help="usable share (default 0.9)")
    cost.add_argument("--step-time", type=float, metavar="S", help="seconds per RL step: adds device-hours")
    cost.add_argument("--round", choices=ROUNDINGS, default="device", help="round device counts up to this")
    cost.add_argument("--reference", action="store_true", help="also cost the published MoE models")
    cost.add_argument("--json", action="store_true", help="print the table as JSON")

    export = add("export", cmd_export, "build a proxy: keep the selected routed experts of every MoE layer")
    export.add_argument("model", metavar="MODEL", help=model_help)
    export.add_argument("--keep", metavar="K", help="experts kept per layer: 0.25, 1/4 or a count like 8")
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="proxy directory")
    export.add_argument(
        "--method",
        default="cluster",
        choices=("cluster", "frequency", "reap", "random"),
        help="selection method",
    )
    export.add_argument(
        "--selection", type=Path, metavar="FILE", help="a selection.json (e.g. notebook 01's)"
    )
    export.add_argument("--seed", type=int, default=0, help="seed of the selection (default 0)")
    export.add_argument(
        "--calibration",
        default="tasks",
        metavar="SRC",
        help="'tasks' or a .txt/.jsonl file for routing statistics",
    )
    export.add_argument("--n-tokens", type=int, default=20_000, metavar="N", help="calibration tokens")
    export.add_argument("--allow-top-k", action="store_true", help="allow keeping exactly top-k experts")
    export.add_argument(
        "--streaming",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="cut the safetensors shards without loading the model (default: when it would not fit)",
    )
    export.add_argument("--heal-steps", type=int, default=0, metavar="N", help="distil the proxy N steps")
    export.add_argument("--heal-lr", type=float, default=1e-3, metavar="LR", help="healing learning rate")
    export.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help='.jsonl of {"prompt", "answer"} for task accuracy (default: the toy\'s tasks, none for others)',
    )
    export.add_argument("--no-fidelity", action="store_true", help="skip fidelity and the validity checklist")
    export.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")

    rp = add("replay", cmd_replay, "replay short RL post-training (GRPO/GEPO) with faults; write a trace")
    rp.add_argument("model", metavar="MODEL", help=model_help)
    rp.add_argument("--out", type=Path, required=True, metavar="TRACE", help="trace file (JSON Lines)")
    rp.add_argument("--steps", type=int, metavar="N", help="RL steps (default 20)")
    rp.add_argument("--algo", choices=("grpo", "gepo"), help="advantages (default grpo)")
    rp.add_argument("--pivot", action="store_true", help="PivotRL: learn from pivots of reference answers")
    rp.add_argument(
        "--entropy-floor", type=float, metavar="X", help="OPEFO entropy flow control with floor X"
    )
    rp.add_argument("--precision", choices=("fp32", "bf16", "fp16"), help="training precision (default fp32)")
    rp.add_argument("--rollout-precision", choices=("fp32", "bf16", "fp16"), help="rollout engine precision")
    rp.add_argument(
        "--fault", action="append", metavar="NAME[@STEP][:ARG]", help="inject a fault (repeatable; see docs)"
    )
    rp.add_argument(
        "--prompts", type=Path, metavar="FILE", help='.jsonl of {"prompt", "answer"} (default: toy tasks)'
    )
    rp.add_argument("--reward", choices=("exact", "numeric", "regex"), help="reward function (default exact)")
    rp.add_argument("--group-size", type=int, metavar="G", help="samples per prompt (default 8)")
    rp.add_argument("--prompts-per-step", type=int, metavar="P", help="prompts per step (default 8)")
    rp.add_argument("--lr", type=float, help="learning rate (default 1e-5)")
    rp.add_argument("--kl-beta", type=float, metavar="B", help="KL-to-reference weight (default 0.01)")
    rp.add_argument(
        "--loop-times", type=int, metavar="N", help="apply the decoder stack N times (looped MoE)"
    )
    rp.add_argument(
        "--config", type=Path, metavar="JSON", help="ReplayConfig fields as JSON (flags override)"
    )
    rp.add_argument("--seed", type=int, help="seed (default 0)")
    rp.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="checkpoint every N steps")
    rp.add_argument("--resume", action="store_true", help="continue --out from its last checkpoint")
    rp.add_argument("--overwrite", action="store_true", help="replace an existing trace")

    dg = add("diagnose", cmd_diagnose, "findings of a trace or training log, and the reproduction verdict")
    dg.add_argument(
        "trace", type=Path, metavar="TRACE", help="a moescope trace or a training log (verl, TRL, ...)"
    )
    dg.add_argument(
        "--against", type=Path, metavar="TRACE", help="the proxy's trace: compare and give a verdict"
    )
    dg.add_argument("--format", metavar="NAME", help="the log format, when auto-detection guesses wrong")
    dg.add_argument(
        "--json", action="store_true", help='print one object: {"format", "steps", "findings", ...}'
    )

    report = add("report", cmd_report, "run the notebooks with papermill; write notebooks + offline HTML")
    report.add_argument("--model", default="toy", metavar="MODEL", help=model_help + " (default: toy)")
    report.add_argument("--out", type=Path, required=True, metavar="DIR", help="report directory")
    report.add_argument("--overwrite", action="store_true", help="replace an existing report directory")

    demo = add("demo", cmd_demo, "the report on the toy model, into ./moescope-demo")
    demo.add_argument("--out", type=Path, default=DEMO_DIR, help=argparse.SUPPRESS)
    return parser


def _quiet() -> None:
    """Library chatter (transformers warnings, progress bars of weight loading) is not for users."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``moescope`` script; returns the exit status."""
    args = build_parser().parse_args(argv)
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
    """Entry point of the ``moescope`` script and of ``python -m moescope``: exit with ``main``'s status.

    A ``torchrun`` worker leaves through ``os._exit`` once its output is flushed. Its work is done
    and written by then, and the interpreter's own teardown is where gloo aborts a finished worker
    now and then ("terminate called without an active exception", SIGABRT), which fails the run.
    """
    status = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    script()
