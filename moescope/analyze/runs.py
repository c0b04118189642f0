"""Every run of a log diagnosed: what ``moescope diagnose`` shows for a file of several pasted runs.

A user comparing two attempts pastes both logs into one file, one after another. Each run is
read on its own (:func:`moescope.analyze.readers.read_runs`) and diagnosed on its own, so a NaN
in the first attempt is not hidden by a healthy second one, nor the reverse. The result renders
itself: :meth:`LogDiagnosis.text` for a terminal, :meth:`LogDiagnosis.to_dict` for ``--json``.

Examples
--------
>>> import tempfile, pathlib
>>> log = pathlib.Path(tempfile.mkdtemp()) / "two.log"
>>> _ = log.write_text("step:1 - actor/grad_norm:0.5\\nstep:2 - actor/grad_norm:nan\\n"
...                    "step:1 - actor/grad_norm:0.5\\nstep:2 - actor/grad_norm:0.4\\n")
>>> result = diagnose_runs(log)
>>> [[f.type for f in run.findings] for run in result.runs]
[['nonfinite'], []]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.findings import Finding
from moescope.analyze.readers import read_runs
from moescope.analyze.remedies import next_steps, next_steps_text
from moescope.traces import Trace

__all__ = ["LogDiagnosis", "RunDiagnosis", "diagnose_runs"]


@dataclass(frozen=True)
class RunDiagnosis:
    """One run of a log and its findings."""

    trace: Trace
    findings: list[Finding]

    def to_dict(self) -> dict[str, Any]:
        """What ``moescope diagnose --json`` prints for a log of one run."""
        return {
            "format": self.trace.header.get("format"),
            "steps": len(self.trace.steps),
            "findings": [{**f.to_dict(), "next": next_steps(f)} for f in self.findings],
            "notes": list(self.trace.notes),
        }

    def text(self, title: str) -> str:
        """The run for a terminal: ``title``, its notes, and each finding with what to try next."""
        lines = [title, *(f"  note: {note}" for note in self.trace.notes)]
        if not self.findings:
            lines.append("  no findings")
        for f in self.findings:
            where = f"step {f.step}" if f.step is not None else "step ?"
            layer = f" layer {f.layer}" if f.layer is not None else ""
            lines.append(f"  [{f.severity}] {where}{layer} {f.type}: {f.message}")
            if f.severity != "info":  # an info (the fp16 scaler settling) needs nothing fixed
                lines += [f"      {line}" for line in next_steps_text(f)]
        return "\n".join(lines)


@dataclass(frozen=True)
class LogDiagnosis:
    """Every run of one log, diagnosed on its own, in the order they were pasted."""

    source: str
    runs: list[RunDiagnosis]

    def to_dict(self) -> dict[str, Any]:
        """One run: as :meth:`RunDiagnosis.to_dict`; several: ``{"format", "runs": [...]}``,
        each run's dict with its index under ``"run"``."""
        if len(self.runs) == 1:
            return self.runs[0].to_dict()
        return {
            "format": self.runs[0].trace.header.get("format"),
            "runs": [{"run": i, **run.to_dict()} for i, run in enumerate(self.runs)],
        }

    def text(self) -> str:
        """The diagnosis for a terminal: one block per run, each headed by its number."""
        if len(self.runs) == 1:
            run = self.runs[0]
            return run.text(f"{self.source}: {run.trace.header.get('format')}, {len(run.trace.steps)} steps")
        head = (
            f"{self.source}: {self.runs[0].trace.header.get('format')}, {len(self.runs)} runs pasted one "
            "after another, each diagnosed on its own (--run N diagnoses run N alone)"
        )
        blocks = [run.text(f"run {i}: {len(run.trace.steps)} steps") for i, run in enumerate(self.runs)]
        return "\n".join([head, *blocks])


def diagnose_runs(
    path: str | Path, format: str | None = None, *, num_experts: int | None = None
) -> LogDiagnosis:
    """Read every run of the log at ``path`` and diagnose each (parameters as in
    :func:`moescope.analyze.readers.read_log`)."""
    traces = read_runs(path, format, num_experts=num_experts)
    return LogDiagnosis(str(path), [RunDiagnosis(trace, diagnose(trace)) for trace in traces])
