"""Targeted validation: does a candidate fix make a fault's findings go away?

The paper's second use of a proxy, and the most expensive loop on the full model. The model
replays the fault alone and the fault with the fix (:mod:`moescope.analyze.fixes`), with the same
seeds, prompts and samples until the fix changes them; both traces are diagnosed, and every
finding type the fault raises (warnings and errors) gets a verdict:

- ``removed``: the fixed run does not raise it;
- ``reduced``: it still does, but at a lower severity, or at most half as much by one of its
  measures: its reported magnitude (a spike's value, a held level's median), the steps it names,
  or the time the run spends failing (from its first step to the run's last);
- ``unchanged``: otherwise;

plus ``introduced`` for a type only the fixed run raises, and ``own`` for a type the model raises
in a third run without the fault (``healthy=True``, the default): a finding the model shows
anyway is not the fault's, so no fix can be judged on it (a proxy that collapses its entropy in
every run would otherwise read *reduced* where its original reads *removed*). The fix's cost: the
fixed run's step time over the faulted run's (measured) and both runs' mean reward. With
``original``, the same runs on the proxy's source model say whether the proxy's verdicts are the
original's.

One word sums a validation up (:attr:`Validation.summary`): ``removed`` when the fix removes
every finding the fault raised, ``unchanged`` when it removes or reduces none, ``reduced``
between, and ``no finding`` when the fault raised none; what the fix introduces is reported
beside it, not in it, and the model's own findings are left out of it. A proxy agrees with its
original on a fault × fix pair when the two summaries are the same word.

The output directory::

    OUT/
      validation.json            the verdicts, cost and notes (the original's under "original")
      fault.jsonl                the faulted run's trace
      fault+fix.jsonl            the fixed run's trace
      healthy.jsonl              the run without the fault (unless healthy=False)
      original-fault.jsonl       with an original: its runs
      original-fault+fix.jsonl
      original-healthy.jsonl
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from moescope import schema as S
from moescope._util.io import read_json_object, replace_dir, write_atomic
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.findings import Finding
from moescope.analyze.fixes import fix_fields
from moescope.errors import MoescopeError
from moescope.replay.config import ReplayConfig
from moescope.replay.faults import FaultPrecondition
from moescope.traces import Trace, read_trace

OUTCOMES = ("removed", "reduced", "unchanged", "introduced", "own")
SUMMARIES = ("removed", "reduced", "unchanged", "no finding")
RESULT = "validation.json"
FAULT_TRACE = "fault.jsonl"
FIXED_TRACE = "fault+fix.jsonl"
HEALTHY_TRACE = "healthy.jsonl"
ORIGINAL_PREFIX = "original-"
REDUCED = 0.5  # a finding whose reported magnitude the fix at least halves is reduced
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


@dataclass(frozen=True)
class Outcome:
    """What the fix did to one finding type: its verdict, and the finding on each side."""

    type: str
    verdict: str
    fault_step: int | None
    fixed_step: int | None
    fault_severity: str | None
    fixed_severity: str | None


@dataclass
class Validation:
    """A fault, the fixes tried, the verdict per finding, the cost; the original's, when run."""

    model: str
    fault: str
    fixes: tuple[str, ...]
    outcomes: list[Outcome]
    cost: dict[str, float]
    notes: list[str] = field(default_factory=list)
    original: Validation | None = None

    @property
    def verdicts(self) -> dict[str, str]:
        """Finding type → removed / reduced / unchanged / introduced."""
        return {o.type: o.verdict for o in self.outcomes}

    @property
    def summary(self) -> str:
        """One word for the fix against the fault's findings (the module docstring's rule)."""
        mine = [o.verdict for o in self.outcomes if o.verdict not in ("introduced", "own")]
        if not mine:
            return "no finding"
        if all(v == "removed" for v in mine):
            return "removed"
        return "unchanged" if all(v == "unchanged" for v in mine) else "reduced"

    def agrees(self) -> bool | None:
        """Whether the proxy's summary is the original's (``None`` without an original)."""
        return None if self.original is None else self.summary == self.original.summary

    def agreement(self) -> dict[str, bool | None] | None:
        """Per finding type either run raised, whether the proxy's verdict is the original's;
        ``None`` for a type either model raises without the fault (``own``): no fix is judged on
        it, so it neither agrees nor disagrees (as the one-word summaries leave it out)."""
        if self.original is None:
            return None
        mine, theirs = self.verdicts, self.original.verdicts
        return {
            t: None if "own" in (mine.get(t), theirs.get(t)) else mine.get(t) == theirs.get(t)
            for t in sorted(mine.keys() | theirs.keys())
        }

    def text(self) -> str:
        """What ``moescope validate`` prints: the verdict per finding type (beside the original's,
        when run), the fix's cost, and the one word."""
        agreement = self.agreement()
        theirs = self.original.verdicts if self.original else {}
        lines = [f"{self.model} under {self.fault}, fixed with {', '.join(self.fixes)}:"]
        lines += [f"  note: {note}" for note in self.notes]
        if not self.outcomes:
            lines.append("  the fault raises no warning or error, with or without the fix")
        for o in self.outcomes:
            why = " (raised without the fault too: the model's own, not judged)" if o.verdict == "own" else ""
            lines.append(f"  {o.type}: {o.verdict}{why}{_against_original(agreement, o.type, theirs)}")
        for t in sorted(theirs.keys() - self.verdicts.keys()):
            lines.append(f"  {t}: not raised{_against_original(agreement, t, theirs)}")
        c = self.cost
        lines.append(
            f"  cost: step time x{c['step_time_ratio']:.2f}, "
            f"mean reward {c['reward_fault']:.3f} -> {c['reward_fixed']:.3f}"
        )
        original = f" (the original: {self.original.summary})" if self.original else ""
        lines.append(f"  in one word: {self.summary}{original}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary
        d["agreement"] = self.agreement()
        d["agrees"] = self.agrees()
        if self.original is not None:
            d["original"]["summary"] = self.original.summary
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Validation:
        """The inverse of :meth:`to_dict` (derived fields ignored)."""
        original = d.get("original")
        return cls(
            model=d["model"],
            fault=d["fault"],
            fixes=tuple(d["fixes"]),
            outcomes=[Outcome(**o) for o in d["outcomes"]],
            cost=dict(d["cost"]),
            notes=list(d.get("notes", [])),
            original=cls.from_dict(original) if original else None,
        )


def _against_original(agreement: dict[str, bool | None] | None, kind: str, theirs: dict[str, str]) -> str:
    """What the original's validation says of one finding type, for a line of the proxy's."""
    if agreement is None:
        return ""
    verdict = theirs.get(kind, "not raised")
    if agreement[kind] is None:
        return f"  (the original: {verdict}; not compared, a model's own finding)"
    return "  (the original: the same)" if agreement[kind] else f"  (the original: {verdict})"


def read_validation(directory: str | Path) -> Validation:
    """A validation written by :func:`validate`, read back from its directory."""
    fix = "run moescope validate (or moescope.validate) to write one"
    return Validation.from_dict(read_json_object(Path(directory) / RESULT, fix))


def validate(
    model: Any,
    fault: str,
    fixes: list[str] | tuple[str, ...],
    *,
    config: ReplayConfig | None = None,
    original: Any = None,
    out: str | Path,
    overwrite: bool = False,
    healthy: bool = True,
) -> Validation:
    """Replay ``fault`` with and without ``fixes`` on ``model`` (and on ``original``), and, with
    ``healthy``, without the fault, whose findings are each model's own; the verdicts, written
    with the traces to ``out`` (``validation.json``)."""
    base = replace(config or ReplayConfig(), faults=(fault,))
    fixed, notes = _fixed_config(base, fixes, fault)
    if original is not None:
        check_source(model, original)

    runs = (base, fixed, replace(base, faults=()) if healthy else None)

    def fill(work: Path) -> None:
        result = _runs(model, runs, work, "", fault, fixes, notes)
        if original is not None:
            result.original = _runs(original, runs, work, ORIGINAL_PREFIX, fault, fixes, notes)
        (work / RESULT).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
        holder.append(result)

    holder: list[Validation] = []
    replace_dir(out, fill, overwrite=overwrite)
    return holder[0]


def rejudge(directory: str | Path) -> Validation:
    """The verdicts of a validation directory given again from its kept traces by this version's
    diagnosis (after an upgrade, say); ``validation.json`` is rewritten in place, atomically."""
    directory = Path(directory)
    result = read_validation(directory)
    runs = [("", result)] + ([(ORIGINAL_PREFIX, result.original)] if result.original else [])
    for prefix, validation in runs:
        faulted = read_trace(directory / f"{prefix}{FAULT_TRACE}")
        fixed = read_trace(directory / f"{prefix}{FIXED_TRACE}")
        healthy = directory / f"{prefix}{HEALTHY_TRACE}"
        own = diagnose(read_trace(healthy)) if healthy.is_file() else []
        validation.outcomes = outcomes(
            diagnose(faulted), diagnose(fixed), last_step=_last_step(faulted), own=own
        )
    write_atomic(directory / RESULT, (json.dumps(result.to_dict(), indent=1) + "\n").encode())
    return result


def _fixed_config(
    base: ReplayConfig, fixes: list[str] | tuple[str, ...], fault: str
) -> tuple[ReplayConfig, list[str]]:
    fields = fix_fields(base, fixes)
    try:
        return replace(base, **fields), []
    except FaultPrecondition as err:  # a fix that removes the fault's precondition (bf16 against fp16)
        need = str(err).partition(" needs ")[2].partition(";")[0].rstrip(".")
        note = (
            f"with {', '.join(fixes)} the fault {fault} cannot happen (it needs {need}): "
            "the fixed run has none"
        )
        return replace(base, **fields, faults=()), [note]


def _runs(
    model: Any,
    runs: tuple[ReplayConfig, ReplayConfig, ReplayConfig | None],
    work: Path,
    prefix: str,
    fault: str,
    fixes: list[str] | tuple[str, ...],
    notes: list[str],
) -> Validation:
    """One model's runs: the fault, the fault with the fix, and (when given) no fault."""
    from moescope.replay.run import replay

    base, fixed, healthy = runs
    faulted = replay(model, base, out=work / f"{prefix}{FAULT_TRACE}")
    repaired = replay(model, fixed, out=work / f"{prefix}{FIXED_TRACE}")
    own = diagnose(replay(model, healthy, out=work / f"{prefix}{HEALTHY_TRACE}")) if healthy else []
    found = outcomes(diagnose(faulted), diagnose(repaired), last_step=_last_step(faulted), own=own)
    return Validation(
        model=str(model) if isinstance(model, str | Path) else type(model).__name__,
        fault=fault,
        fixes=tuple(fixes),
        outcomes=found,
        cost=cost(faulted, repaired),
        notes=list(notes),
    )


def outcomes(
    faulted: list[Finding], fixed: list[Finding], *, last_step: int, own: Sequence[Finding] = ()
) -> list[Outcome]:
    """The verdict per finding type (warnings and errors) of two runs ending at ``last_step``,
    in the order of the module docstring; a type the run without the fault raised (``own``)
    reads ``own``."""
    before, after, mine = _worst(faulted), _worst(fixed), _worst(own)
    out = []
    for kind, f in before.items():
        g = after.get(kind)
        verdict = "own" if kind in mine else _verdict(f, g, last_step)
        out.append(
            Outcome(kind, verdict, f.step, g.step if g else None, f.severity, g.severity if g else None)
        )
    for kind, g in after.items():
        if kind not in before:
            out.append(Outcome(kind, "own" if kind in mine else "introduced", None, g.step, None, g.severity))
    return out


def _last_step(trace: Trace) -> int:
    return int(trace.steps[-1][S.STEP]) if trace.steps else 0


def _worst(findings: Sequence[Finding]) -> dict[str, Finding]:
    """The most severe (then earliest) finding of each type, info left out."""
    out: dict[str, Finding] = {}
    for f in findings:
        if f.severity == "info":
            continue
        kept = out.get(f.type)
        if kept is None or SEVERITY_RANK[f.severity] > SEVERITY_RANK[kept.severity]:
            out[f.type] = f
    return out


def _verdict(before: Finding, after: Finding | None, last_step: int) -> str:
    if after is None:
        return "removed"
    later = (
        before.step is not None
        and after.step is not None
        and last_step - after.step + 1 <= REDUCED * (last_step - before.step + 1)
    )
    milder = SEVERITY_RANK[after.severity] < SEVERITY_RANK[before.severity]
    size, was = _size(after), _size(before)
    smaller = size is not None and was is not None and size <= REDUCED * was
    shorter = _extent(before) > 0 and _extent(after) <= REDUCED * _extent(before)
    return "reduced" if milder or later or smaller or shorter else "unchanged"


def _size(f: Finding) -> float | None:
    """The magnitude a finding reports, when it does: a held level's median (a mean over a
    heavy-tailed per-step metric moves twofold with one step's outlier), else its ``value``."""
    value = f.evidence.get("median", f.evidence.get("value"))
    return float(value) if isinstance(value, int | float) else None


def _extent(f: Finding) -> int:
    """How many steps a finding names (its evidence's ``steps`` or ``skipped_steps``)."""
    steps = f.evidence.get("steps") or f.evidence.get("skipped_steps") or []
    return len(steps) if isinstance(steps, list) else 0


def cost(faulted: Trace, fixed: Trace) -> dict[str, float]:
    """The fixed run's median step time over the faulted run's (first step left out: warm-up),
    and both runs' mean reward."""

    def median_time(trace: Trace) -> float:
        times = [s[S.TIME_STEP] for s in trace.steps[1:] or trace.steps if S.TIME_STEP in s]
        return statistics.median(times) if times else float("nan")

    def reward(trace: Trace) -> float:
        values = [s[S.REWARD_MEAN] for s in trace.steps if isinstance(s.get(S.REWARD_MEAN), int | float)]
        return statistics.fmean(values) if values else float("nan")

    return {
        "step_time_ratio": median_time(fixed) / median_time(faulted),
        "reward_fault": reward(faulted),
        "reward_fixed": reward(fixed),
    }


def check_source(proxy: Any, original: Any) -> None:
    """Refuse an ``original`` that is not the source the proxy was cut from (config hash)."""
    from moescope.models.loading import load_config
    from moescope.provenance import config_hash

    manifest = Path(str(proxy)) / "moescope.json"
    if not isinstance(proxy, str | Path) or not manifest.is_file():
        raise MoescopeError(
            f"{proxy} is not a proxy directory (no moescope.json); pass an exported proxy as MODEL."
        )
    source = json.loads(manifest.read_text())["source"]["config_hash"]
    if config_hash(load_config(original)) != source:
        raise MoescopeError(
            f"{original} is not the model {proxy} was cut from (its config differs); "
            "pass that model as --original."
        )
