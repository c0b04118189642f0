"""``moescope export``: build a proxy, a flag per :class:`ExportConfig` field."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moescope._util.flags import add_flags
from moescope.cli.common import MODEL_HELP, command, export_config
from moescope.export.config import ExportConfig


def add(sub: argparse._SubParsersAction) -> None:
    """The flags are generated from the config's fields, so help and defaults never drift."""
    export = command(sub, "export", run, "build a proxy: keep the selected routed experts of every MoE layer")
    export.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    export.add_argument("--out", type=Path, required=True, metavar="DIR", help="proxy directory")
    add_flags(export, ExportConfig)
    export.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")


def run(args: argparse.Namespace) -> int:
    from moescope.export.pipeline import export_proxy

    config, progress = export_config(args), sys.stderr.isatty()
    result = export_proxy(args.model, config, out=args.out, overwrite=args.overwrite, progress=progress)
    print(result.text())
    return 0
