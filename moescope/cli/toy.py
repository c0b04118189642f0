"""``moescope toy``: write an embedded model and print its path."""

from __future__ import annotations

import argparse
from pathlib import Path

from moescope.cli.common import command


def add(sub: argparse._SubParsersAction) -> None:
    from moescope.models.embedded import EMBEDDED

    toy = command(sub, "toy", run, "write an embedded model (default: the toy); print its path")
    toy.add_argument(
        "--name", choices=list(EMBEDDED), default="toy", help="which embedded model (default: toy)"
    )
    toy.add_argument("--out", type=Path, help="copy the checkpoint here (default: print the packaged copy)")
    toy.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")


def run(args: argparse.Namespace) -> int:
    from moescope.models.embedded import embedded_path, write_embedded

    path = (
        write_embedded(args.name, args.out, overwrite=args.overwrite)
        if args.out
        else embedded_path(args.name)
    )
    print(path)
    return 0
