"""The ``moescope`` command line.

Each subcommand is a module of this package: ``add(sub)`` declares its parser and ``run(args)``
calls one library function and prints what the result's ``text()`` gives it. A user mistake
raises :class:`~moescope.errors.MoescopeError`; it is printed as one sentence on stderr with exit
status 2 and no traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from moescope._util.process import leave
from moescope._version import __version__
from moescope.cli import cost, diagnose, export, heal, inspect, replay, report, toy, validate
from moescope.cli.common import export_config, joined_number_lists, quiet, replay_config
from moescope.errors import MoescopeError

__all__ = ["build_parser", "export_config", "main", "replay_config", "script"]

COMMANDS = (toy, inspect, cost, export, replay, heal, diagnose, validate, report)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, every subcommand in it: ``main`` parses with it, and the reference
    documentation is generated from it."""
    parser = argparse.ArgumentParser(
        prog="moescope",
        description="Cheap proxy models of MoE LLMs for reproducing RL post-training failures.",
    )
    parser.add_argument("--version", action="version", version=f"moescope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``moescope`` script; returns the exit status."""
    args = build_parser().parse_args(joined_number_lists(sys.argv[1:] if argv is None else argv))
    quiet()
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
