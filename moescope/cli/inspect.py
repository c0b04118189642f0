"""``moescope inspect``: a model's architecture summary, as text or JSON."""

from __future__ import annotations

import argparse
import json

from moescope.cli.common import MODEL_HELP, command


def add(sub: argparse._SubParsersAction) -> None:
    inspect = command(sub, "inspect", run, "architecture summary: layers, experts, top-k, router, params")
    inspect.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from moescope.models.summary import summarize

    summary = summarize(args.model)
    print(json.dumps(summary.to_dict(), indent=2) if args.json else summary.text())
    return 0
