"""``diagnose_log(path)``: a trace or training log read, diagnosed, and compared with a proxy's.

What ``moescope diagnose`` does, as one result: the findings with their next steps, the notes of
the reading and, given the proxy's trace, the reproduction verdict (with the two models' healthy
runs as baseline, when given). :meth:`LogDiagnosis.text` is what the command prints and
:meth:`LogDiagnosis.to_dict` what it prints with ``--json``.

A user comparing two attempts pastes both logs into one file, one after another. Unless one run
is asked for, each is read on its own (:func:`moescope.analyze.readers.read_runs`) and diagnosed
on its own, so a NaN in the first attempt is not hidden by a healthy second one, nor the reverse.

Examples
--------
>>> import tempfile, pathlib
>>> log = pathlib.Path(tempfile.mkdtemp()) / "two.log"
>>> _ = log.write_text("step:1 - actor/grad_norm:0.5\\nstep:2 - actor/grad_norm:nan\\n"
...                    "step:1 - actor/grad_norm:0.5\\nstep:2 - actor/grad_norm:0.4\\n")
>>> result = diagnose_log(log)
>>> [[f.type for f in run.findings] for run in result.runs]
[['nonfinite'], []]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.findings import Finding
from moescope.analyze.readers import read_log, read_runs
from moescope.analyze.remedies import next_steps, next_steps_text
from moescope.analyze.rules.thresholds import WINDOW
from moescope.analyze.verdict import Comparison, compare, compare_healthy
from moescope.errors import MoescopeError
from moescope.replay.faults import parse_faults
from moescope.traces import Trace

__all__ = ["LogDiagnosis", "RunDiagnosis", "diagnose_log"]


@dataclass(frozen=True)
class RunDiagnosis:
    """One run of a log and its findings."""

    trace: Trace
    findings: list[Finding]

    @property
    def notes(self) -> list[str]:
        """The reading's notes, and one saying so where the run is too short for a trend: "no
        findings" on three records says less than on three hundred."""
        steps = len(self.trace.steps)
        if steps >= WINDOW:
            return list(self.trace.notes)
        short = (
            f"{steps} record(s): too few for the rules that judge a trend (a rise, a collapse, a spike "
            f"against a running median need {WINDOW} or so); what a single record shows was judged"
        )
        return [*self.trace.notes, short]

    def to_dict(self) -> dict[str, Any]:
        """``format``, ``steps``, ``findings`` (each with its ``next`` steps) and ``notes``."""
        return {
            "format": self.trace.header.get("format"),
            "steps": len(self.trace.steps),
            "findings": [{**f.to_dict(), "next": next_steps(f)} for f in self.findings],
            "notes": self.notes,
        }

    def text(self, title: str) -> str:
        """``title``, the run's notes, and each finding with what to try next (an ``info``, the
        fp16 scaler settling say, needs nothing fixed)."""
        lines = [title, *(f"  note: {note}" for note in self.notes)]
        if not self.findings:
            lines.append("  no findings")
        for f in self.findings:
            where = f"step {f.step}" if f.step is not None else "step ?"
            layer = f" layer {f.layer}" if f.layer is not None else ""
            lines.append(f"  [{f.severity}] {where}{layer} {f.type}: {f.message}")
            if f.severity != "info":
                lines += [f"      {line}" for line in next_steps_text(f)]
        return "\n".join(lines)


@dataclass(frozen=True)
class LogDiagnosis:
    """The runs of one log, each diagnosed on its own, in the order they were pasted (one run
    when a run was asked for or a proxy's run is compared), and the comparison with the proxy's.

    ``source``, ``against`` and ``healthy_sources`` name the files read, as the reader gave them;
    ``healthy`` is the comparison of the two models' runs without the fault.
    """

    source: str
    runs: list[RunDiagnosis]
    against: str | None = None
    comparison: Comparison | None = None
    healthy_sources: tuple[str, str] | None = None
    healthy: Comparison | None = None

    @property
    def trace(self) -> Trace:
        """The last run's trace (the one a comparison judges)."""
        return self.runs[-1].trace

    @property
    def findings(self) -> list[Finding]:
        """The last run's findings."""
        return self.runs[-1].findings

    def to_dict(self) -> dict[str, Any]:
        """One run: as :meth:`RunDiagnosis.to_dict`, then ``healthy`` and ``comparison`` when
        compared; several: ``{"format", "runs": [...]}``, each run's dict with its index."""
        if len(self.runs) > 1:
            return {
                "format": self.runs[0].trace.header.get("format"),
                "runs": [{"run": i, **run.to_dict()} for i, run in enumerate(self.runs)],
            }
        out = self.runs[0].to_dict()
        if self.healthy is not None:
            out["healthy"] = self.healthy.to_dict()
        if self.comparison is not None:
            out["comparison"] = self.comparison.to_dict()
        return out

    def text(self) -> str:
        """The diagnosis for a terminal: each run's block (headed by its number where there are
        several), then the proxy's own findings and the verdict with its reasons."""
        form = self.runs[0].trace.header.get("format")
        if len(self.runs) > 1:
            head = (
                f"{self.source}: {form}, {len(self.runs)} runs pasted one after another, each "
                "diagnosed on its own (--run N diagnoses run N alone)"
            )
            blocks = [run.text(f"run {i}: {len(run.trace.steps)} steps") for i, run in enumerate(self.runs)]
            return "\n".join([head, *blocks])
        lines = [self.runs[0].text(f"{self.source}: {form}, {len(self.trace.steps)} steps")]
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
    run: int | None = None,
    num_experts: int | None = None,
) -> LogDiagnosis:
    """Read and diagnose ``path``; with ``against`` (the proxy's run), compare the two.

    ``run``: of several runs pasted in one log, diagnose run ``run`` alone (``-1`` the last);
    by default each run on its own, or, when compared, the last. ``healthy``: the original's
    and the proxy's runs without the fault, whose proxy-only findings are set apart from the
    verdict. ``faults``: as :func:`~moescope.analyze.verdict.compare` takes them (``()`` judges
    every finding); a name moescope does not know is refused before anything is read.
    ``format`` and ``num_experts``: as :func:`~moescope.analyze.readers.read_log`.
    """
    if faults:
        parse_faults(list(faults))
    if healthy and against is None:
        raise MoescopeError("healthy runs judge a comparison: give the proxy's run (against=) as well.")
    if run is None and against is None:
        traces = read_runs(path, format, num_experts=num_experts)
        return LogDiagnosis(str(path), [RunDiagnosis(trace, diagnose(trace)) for trace in traces])
    trace = read_log(path, format=format, run=-1 if run is None else run, num_experts=num_experts)
    findings = diagnose(trace)
    result = [RunDiagnosis(trace, findings)]
    if against is None:
        return LogDiagnosis(str(path), result)
    baseline = compare_healthy(*(read_log(p, format=format) for p in healthy)) if healthy else None
    comparison = compare(
        trace, read_log(against, format=format), original_findings=findings, faults=faults, healthy=baseline
    )
    sources = (str(healthy[0]), str(healthy[1])) if healthy else None
    return LogDiagnosis(str(path), result, str(against), comparison, sources, baseline)
