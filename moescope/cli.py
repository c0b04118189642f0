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

from moescope import __version__
from moescope.errors import MoescopeError

DEMO_DIR = Path("moescope-demo")


def cmd_toy(args: argparse.Namespace) -> int:
    from moescope.toy import toy_path, write_toy

    path = write_toy(args.out, overwrite=args.overwrite) if args.out else toy_path()
    print(path)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from moescope.summary import summarize

    summary = summarize(args.model)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.text())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from moescope.report import run_report

    report = run_report(args.model, args.out, overwrite=args.overwrite)
    print(f"report: {report.index_html}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from moescope.report import run_report

    report = run_report("toy", args.out, overwrite=True)
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


if __name__ == "__main__":
    sys.exit(main())
