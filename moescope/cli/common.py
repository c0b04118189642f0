"""What the commands share: declaring a subcommand, the configs read from flags, quiet libraries.

Each command imports its stage when it runs, not at the top: torch and transformers take
seconds to import, and ``moescope --help`` or ``moescope diagnose`` never need them.
"""

from __future__ import annotations

import argparse
import os
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from moescope._util.flags import flag_values
from moescope.export.config import ExportConfig
from moescope.replay.config import ReplayConfig

MODEL_HELP = "a local Hugging Face checkpoint directory, or 'toy' / 'toy-v3' (the embedded models)"


def command(
    sub: argparse._SubParsersAction, name: str, func: Callable[[argparse.Namespace], int], help_: str
) -> argparse.ArgumentParser:
    """A subcommand whose help is also its description, run by ``func``."""
    parser = sub.add_parser(name, help=help_, description=help_)
    parser.set_defaults(func=func)
    return parser


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


def quiet() -> None:
    """Library chatter (transformers warnings, progress bars of weight loading) is not for users."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")


_NUMBERS = re.compile(r"^-\d*\.?\d+(,-?\d*\.?\d+)+$")


def joined_number_lists(argv: Sequence[str]) -> list[str]:
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
