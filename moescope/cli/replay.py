"""``moescope replay``: short RL post-training with faults, written as a trace."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from moescope import schema as S
from moescope._util.flags import add_flags, config_field, shown_default
from moescope.cli.common import MODEL_HELP, command, replay_config
from moescope.errors import MoescopeError
from moescope.replay.config import ReplayConfig


def add(sub: argparse._SubParsersAction) -> None:
    """The flagged :class:`ReplayConfig` fields, generated from the fields, and the flags that set
    several fields or none (their defaults still read from the config)."""
    rp = command(sub, "replay", run, "replay short RL post-training (GRPO/GEPO) with faults; write a trace")
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


def run(args: argparse.Namespace) -> int:
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
