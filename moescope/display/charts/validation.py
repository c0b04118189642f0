"""A targeted validation drawn: the faulted run and the fixed run on one step axis, findings marked.

The board is :func:`~moescope.display.charts.traces.trace_board` with the two runs of one model
(``fault`` and ``fault + fix``) in place of original and proxy, and the panels chosen for the
fault: first the metrics its findings concern, then the reward (what the fix costs) and the
usual health metrics, six panels in all. The title carries the verdict per finding type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from moescope._util.io import write_atomic
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.validation import FAULT_TRACE, FIXED_TRACE, ORIGINAL_PREFIX, read_validation
from moescope.display.charts._common import alt
from moescope.display.charts._series import FINDING_PANELS
from moescope.display.charts.traces import DEFAULT_METRICS, trace_board
from moescope.schema import REWARD_MEAN
from moescope.traces import read_trace

if TYPE_CHECKING:
    from moescope.analyze.findings import Finding
    from moescope.traces import Trace

__all__ = [
    "RUN_LABELS",
    "save_validation_charts",
    "validation_board",
    "validation_boards",
    "validation_metrics",
]

RUN_LABELS = ("fault", "fault + fix")
PANELS = 6


def validation_metrics(findings: Sequence[Finding], panels: int = PANELS) -> list[str]:
    """The panels of a validation board: the metrics the findings concern, the reward, then the
    default health metrics, ``panels`` in all and none twice."""
    wanted = [FINDING_PANELS[f.type] for f in findings if f.type in FINDING_PANELS]
    ordered = dict.fromkeys([*wanted, REWARD_MEAN, *DEFAULT_METRICS])
    return list(ordered)[:panels]


def validation_board(
    faulted: Trace,
    fixed: Trace,
    *,
    findings: Sequence[Finding] = (),
    fixed_findings: Sequence[Finding] = (),
    verdicts: Mapping[str, str] | None = None,
    title: str = "Targeted validation",
) -> alt.ConcatChart:
    """The faulted and the fixed run of one model overlaid, the findings of each as rules
    (the fixed run's dashed); ``verdicts`` (finding type → removed / reduced / unchanged /
    introduced) go in the subtitle.

    Examples
    --------
    >>> validation_board(read_trace("v/fault.jsonl"), read_trace("v/fault+fix.jsonl"))  # doctest: +SKIP
    """
    chart = trace_board(
        faulted,
        fixed,
        findings=findings,
        proxy_findings=fixed_findings,
        metrics=validation_metrics([*findings, *fixed_findings]),
        labels=RUN_LABELS,
    )
    said = [f"{kind}: {verdict}" for kind, verdict in (verdicts or {}).items()]
    board_said = [line.replace("the proxy's", "the fixed run's") for line in chart.title.subtitle]
    subtitle = ["; ".join(said) if said else "neither run raised a warning or an error", *board_said]
    chart.title = alt.Title(f"{title} · {' vs '.join(RUN_LABELS)}", subtitle=subtitle, anchor="start")
    return chart


def validation_boards(directory: str | Path) -> dict[str, alt.ConcatChart]:
    """The boards of a validation directory written by ``moescope validate``: ``model`` (the model
    validated) and, when the validation ran on the proxy's source too, ``original``."""
    directory = Path(directory)
    result = read_validation(directory)
    runs = {"model": ("", result)}
    if result.original is not None:
        runs["original"] = (ORIGINAL_PREFIX, result.original)
    boards = {}
    for role, (prefix, validation) in runs.items():
        faulted = read_trace(directory / f"{prefix}{FAULT_TRACE}")
        fixed = read_trace(directory / f"{prefix}{FIXED_TRACE}")
        boards[role] = validation_board(
            faulted,
            fixed,
            findings=diagnose(faulted),
            fixed_findings=diagnose(fixed),
            verdicts=validation.verdicts,
            title=f"{Path(validation.model).name} · {validation.fault} with {', '.join(validation.fixes)}",
        )
    return boards


def save_validation_charts(directory: str | Path) -> list[Path]:
    """Each board of :func:`validation_boards` as an SVG beside the traces (``validation.svg``,
    ``original-validation.svg``), drawn offline by vl-convert."""
    import vl_convert

    directory = Path(directory)
    written = []
    for role, board in validation_boards(directory).items():
        name = f"{ORIGINAL_PREFIX if role == 'original' else ''}validation.svg"
        svg = vl_convert.vegalite_to_svg(board.to_dict())
        written.append(write_atomic(directory / name, svg.encode()))
    return written
