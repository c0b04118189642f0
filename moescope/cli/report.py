"""``moescope report`` and ``moescope demo``, the report on the toy model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moescope.cli.common import MODEL_HELP, command

DEMO_DIR = Path("moescope-demo")


def add(sub: argparse._SubParsersAction) -> None:
    report = command(sub, "report", run, "run the notebooks with papermill; write notebooks + offline HTML")
    report.add_argument("--model", default="toy", metavar="MODEL", help=MODEL_HELP + " (default: toy)")
    report.add_argument("--out", type=Path, required=True, metavar="DIR", help="report directory")
    report.add_argument("--overwrite", action="store_true", help="replace an existing report directory")

    demo = command(sub, "demo", run_demo, "the report on the toy model, into ./moescope-demo")
    demo.add_argument("--out", type=Path, default=DEMO_DIR, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from moescope.report.pipeline import run_report

    report = run_report(args.model, args.out, overwrite=args.overwrite, progress=sys.stderr.isatty())
    print(f"report: {report.index_html}")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from moescope.report.pipeline import run_report

    report = run_report("toy", args.out, overwrite=True, progress=sys.stderr.isatty())
    print(f"demo report: {report.index_html.resolve()}")
    return 0
