"""``diagnose_log(path)``: a trace or training log read, diagnosed, and compared with a proxy's.

What ``moescope diagnose`` does, as one result: the findings with their next steps, the notes of
the reading and, given the proxy's trace, the reproduction verdict (with the two models' healthy
runs as baseline, when given). :meth:`LogDiagnosis.text` is what the command prints and
:meth:`LogDiagnosis.to_dict` what it prints with ``--json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.findings import Finding
from moescope.analyze.readers import read_log
from moescope.analyze.remedies import next_steps, next_steps_text
from moescope.analyze.verdict import Comparison, compare, compare_healthy
from moescope.errors import MoescopeError
from moescope.replay.faults import parse_faults
from moescope.traces import Trace


@dataclass(frozen=True)
class LogDiagnosis:
    """A run's findings, and its comparison with a proxy's run when one was given.

    ``source``, ``against`` and ``healthy_sources`` name the files read, as the reader gave them;
    ``healthy`` is the comparison of the two models' runs without the fault.
    """

    source: str
    trace: Trace
    findings: list[Finding]
    against: str | None = None
    comparison: Comparison | None = None
    healthy_sources: tuple[str, str] | None = None
    healthy: Comparison | None = None

    def to_dict(self) -> dict[str, Any]:
        """``format``, ``steps``, ``findings`` (each with its ``next`` steps) and ``notes``; then
        ``healthy`` and ``comparison`` when compared."""
        out: dict[str, Any] = {
            "format": self.trace.header.get("format"),
            "steps": len(self.trace.steps),
            "findings": [{**f.to_dict(), "next": next_steps(f)} for f in self.findings],
            "notes": list(self.trace.notes),
        }
        if self.healthy is not None:
            out["healthy"] = self.healthy.to_dict()
        if self.comparison is not None:
            out["comparison"] = self.comparison.to_dict()
        return out

    def text(self) -> str:
        """The run, its notes, each finding with what to do next (an ``info`` needs nothing fixed),
        the proxy's own findings and the verdict with its reasons."""
        form = self.trace.header.get("format")
        lines = [f"{self.source}: {form}, {len(self.trace.steps)} steps"]
        lines += [f"  note: {note}" for note in self.trace.notes]
        if not self.findings:
            lines.append("  no findings")
        for f in self.findings:
            where = f"step {f.step}" if f.step is not None else "step ?"
            layer = f" layer {f.layer}" if f.layer is not None else ""
            lines.append(f"  [{f.severity}] {where}{layer} {f.type}: {f.message}")
            if f.severity != "info":  # the fp16 scaler settling, say
                lines += [f"      {line}" for line in next_steps_text(f)]
        if self.healthy_sources is not None and self.comparison is not None:
            own = ", ".join(f"{t} (step {s})" for t, s in self.comparison.own.items())
            original, proxy = self.healthy_sources
            raises = own or "nothing the original's does not"
            lines.append(f"healthy runs {original} and {proxy}: the proxy raises {raises}")
        if self.comparison is not None:
            lines.append(self.comparison.text(f"against {self.against}"))
        return "\n".join(lines)


def diagnose_log(
    path: str | Path,
    *,
    against: str | Path | None = None,
    healthy: Sequence[str | Path] | None = None,
    faults: Sequence[str] | None = None,
    format: str | None = None,
    run: int = -1,
) -> LogDiagnosis:
    """Read and diagnose ``path``; with ``against`` (the proxy's run), compare the two.

    ``healthy``: the original's and the proxy's runs without the fault, whose proxy-only
    findings are set apart from the verdict. ``faults``: as :func:`~moescope.analyze.verdict.compare`
    takes them (``()`` judges every finding); a name moescope does not know is refused before
    anything is read. ``format`` and ``run``: as :func:`~moescope.analyze.readers.read_log`.
    """
    if faults:
        parse_faults(list(faults))
    if healthy and against is None:
        raise MoescopeError("healthy runs judge a comparison: give the proxy's run (against=) as well.")
    trace = read_log(path, format=format, run=run)
    findings = diagnose(trace)
    result = LogDiagnosis(str(path), trace, findings)
    if against is None:
        return result
    baseline = compare_healthy(*(read_log(p, format=format) for p in healthy)) if healthy else None
    comparison = compare(
        trace, read_log(against, format=format), original_findings=findings, faults=faults, healthy=baseline
    )
    sources = (str(healthy[0]), str(healthy[1])) if healthy else None
    return LogDiagnosis(str(path), trace, findings, str(against), comparison, sources, baseline)
