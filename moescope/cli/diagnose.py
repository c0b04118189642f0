"""``moescope diagnose``: the findings of a trace or training log, and the reproduction verdict."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moescope.cli.common import command
from moescope.errors import MoescopeError


def add(sub: argparse._SubParsersAction) -> None:
    dg = command(sub, "diagnose", run, "findings of a trace or training log, and the reproduction verdict")
    dg.add_argument(
        "trace", type=Path, metavar="TRACE", help="a moescope trace or a training log (verl, TRL, ...)"
    )
    dg.add_argument(
        "--against", type=Path, metavar="TRACE", help="the proxy's trace: compare and give a verdict"
    )
    judge = dg.add_mutually_exclusive_group()
    judge.add_argument(
        "--every-finding",
        action="store_true",
        help="with --against: judge every finding, not only the injected fault's signature",
    )
    judge.add_argument(
        "--fault",
        action="append",
        metavar="NAME",
        help="with --against: the fault both runs injected, for logs whose header does not say (verl, ...)",
    )
    dg.add_argument(
        "--healthy",
        nargs=2,
        type=Path,
        metavar=("ORIGINAL", "PROXY"),
        help="with --against: both models' runs without the fault; findings the proxy raises there "
        "and the original does not are the proxy's own, set apart from the verdict",
    )
    dg.add_argument("--format", metavar="NAME", help="the log format, when auto-detection guesses wrong")
    dg.add_argument(
        "--run",
        type=int,
        default=None,
        metavar="N",
        help="of several runs pasted in one log, diagnose run N alone (0 the first, -1 the last; "
        "default: each run on its own; with --against or --healthy: the last)",
    )
    dg.add_argument(
        "--json", action="store_true", help='print one object: {"format", "steps", "findings", ...}'
    )


def run(args: argparse.Namespace) -> int:
    from moescope.analyze.log_diagnosis import diagnose_log
    from moescope.traces import json_value

    if args.healthy and not args.against:
        raise MoescopeError("--healthy judges a comparison; pass the proxy's trace with --against as well.")
    result = diagnose_log(
        args.trace,
        against=args.against,
        healthy=args.healthy,
        faults=() if args.every_finding else args.fault,
        format=args.format,
        run=args.run,
    )
    print(json.dumps(result.to_dict(), indent=1, default=json_value) if args.json else result.text())
    return 0
