"""``moescope validate``: a fault with and without candidate fixes; the replay flags set both runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from moescope._util.flags import add_flags
from moescope.cli.common import MODEL_HELP, command, replay_config
from moescope.errors import MoescopeError
from moescope.replay.config import ReplayConfig


def add(sub: argparse._SubParsersAction) -> None:
    from moescope.analyze.fixes import FIXES

    va = command(
        sub, "validate", run, "replay a fault with and without a fix: does the fix remove its findings?"
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
    va.set_defaults(fault=None, entropy_floor=None)  # read by replay_config; the fault is validate_fault


def run(args: argparse.Namespace) -> int:
    from moescope.analyze.validation import RESULT, validate

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
    print(result.text())
    print(f"validation: {args.out / RESULT}")
    try:
        from moescope.display.charts.validation import save_validation_charts

        charts = save_validation_charts(args.out)
    except (ImportError, MoescopeError):  # the notebook extra (altair, vl-convert) is missing
        print("charts: none (install moescope[notebook] to draw them)")
    else:
        print(f"charts: {', '.join(str(p) for p in charts)}")
    return 0
