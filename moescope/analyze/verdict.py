"""``compare(original, proxy)``: does the proxy reproduce what the original did?

The paper's standard is the same fault response and the same direction of change, not numeric
equality: a proxy has fewer experts, so its loss sits at another level, but a learning-rate
spike must still produce a grad-norm spike and a KL jump, at about the same step.

- **Findings.** For every finding type raised on either trace (warnings and errors; ``info``
  is context): reproduced when the proxy raises the same type, with the onset offset in steps
  and as a fraction of the run; "on time" when the offset is within ``ONSET_TOLERANCE`` of the
  run (at least ``MIN_TOLERANCE_STEPS`` steps). A type only the proxy raises is a false alarm.
- **Curves.** For each shared scalar metric: Spearman rank correlation of the two curves over
  the common steps (rank-based, so the level does not matter), agreement of the direction of
  change step to step (after a 3-step running mean) and of the overall trend (late third vs
  early third).
- **Verdict.** When both traces name the same injected faults (their headers' ``faults``, as
  ``moescope replay`` and the TRL callback write them), the verdict is judged on the faults'
  *signature* (:attr:`moescope.replay.faults.FaultKind.signature`): the findings that show the
  fault's own mechanism, among those the original raised. ``reproduced`` when each reappears on
  the proxy on time, ``partially reproduced`` when some reappear, ``not reproduced`` when none
  does. Everything else a run raised afterwards is reported, with its own verdict over every
  finding (``every_finding``), but does not decide: where a run goes once the fault has broken
  it is not a property of the model. Measured with TRL on the toy under ``lr_spike@4``, three
  seeds of the *original* compared with each other are every time only partially reproduced by
  that stricter rule (the broken policy drifts toward noise on one seed, into a repetition loop
  on another, and no-signal steps come early on a third), and every time reproduced on the
  signature (the reward collapses at step 5 on each). Without an injected fault, with faults that
  differ between the two traces, or when the original shows none of the signature, every
  finding is judged: ``reproduced`` when every original finding reappears on time and nothing
  new appears; ``partially reproduced`` when some do; ``not reproduced`` when none do;
  ``both healthy`` when neither trace raises anything. Reasons say why.
- **The healthy runs as baseline** (``healthy=compare(original_healthy, proxy_healthy)``): a
  proxy can raise a finding without any fault (one whose pruning left it collapsing its entropy
  in every run, or giving every group the same reward). Such a type, raised by the proxy's
  healthy run and not by the original's, is *the proxy's own*: in the faulted comparison it is
  set apart (``FindingMatch.own``), neither a false alarm nor evidence that the proxy reproduces
  the original's finding of that type, and the reasons say so: a proxy that raises a finding
  on its own cannot show whether a fault raises it.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from moescope import schema as S
from moescope.analyze.diagnosis import diagnose
from moescope.analyze.findings import Finding
from moescope.analyze.rules.series import running, series
from moescope.errors import MoescopeError
from moescope.replay.faults import KINDS
from moescope.traces import Trace

if TYPE_CHECKING:
    import pandas as pd

ONSET_TOLERANCE = 0.1
MIN_TOLERANCE_STEPS = 2
CURVES = (S.ACTOR_LOSS, S.GRAD_NORM, S.ENTROPY, S.REWARD_MEAN, S.KL, S.LOAD_CV)


@dataclass(frozen=True)
class FindingMatch:
    """One finding type on the two traces; ``own``: the proxy raises it in its healthy run and
    the original does not, so it is set apart (neither a false alarm nor a reproduction)."""

    type: str
    original_step: int | None
    proxy_step: int | None
    reproduced: bool
    on_time: bool
    offset_steps: int | None
    offset_fraction: float | None
    false_alarm: bool = False
    own: bool = False

    @property
    def hit(self) -> bool:
        """Reproduced on time, and not the proxy's own."""
        return self.reproduced and self.on_time and not self.own


@dataclass(frozen=True)
class CurveAgreement:
    metric: str
    steps: int
    spearman: float | None
    direction_agreement: float | None
    trend_original: str
    trend_proxy: str

    @property
    def trend_agrees(self) -> bool:
        return self.trend_original == self.trend_proxy


@dataclass(frozen=True)
class Comparison:
    """The verdict and what it rests on.

    ``faults``: the injected fault kinds whose signature was looked for (by default those both
    traces name); ``signature``: the finding types the verdict was judged on (the faults'
    signature the original raised; empty when every finding was); ``every_finding``: the verdict
    over every finding, whichever decided; ``own``: the proxy's own finding types, from its
    healthy run, with their onset there (empty without a healthy baseline); ``note``: why every
    finding was judged although the traces name faults.
    """

    verdict: str
    reasons: list[str]
    findings: list[FindingMatch] = field(default_factory=list)
    curves: list[CurveAgreement] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    every_finding: str | None = None
    own: dict[str, int | None] = field(default_factory=dict)
    note: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Comparison:
        """The comparison :meth:`to_dict` wrote (a study row holds one), reasons and all.

        >>> c = Comparison("reproduced", [], [FindingMatch("grad_spike", 6, 7, True, True, 1, 0.05)])
        >>> Comparison.from_dict(c.to_dict()) == c
        True
        """
        known = {f.name for f in fields(cls)} - {"findings", "curves"}
        curve_fields = {f.name for f in fields(CurveAgreement)}
        return cls(
            **{k: v for k, v in d.items() if k in known and k != "reasons"},
            reasons=list(d.get("reasons", [])),
            findings=[FindingMatch(**m) for m in d.get("findings", [])],
            curves=[
                CurveAgreement(**{k: v for k, v in c.items() if k in curve_fields})
                for c in d.get("curves", [])
            ],
        )

    def text(self, label: str = "verdict") -> str:
        """The verdict after ``label`` (``moescope diagnose`` names the proxy's trace), then its
        reasons, one a line.

        >>> print(Comparison("not reproduced", ["grad_spike: not raised by the proxy"]).text())
        verdict: not reproduced
          - grad_spike: not raised by the proxy
        """
        return "\n".join([f"{label}: {self.verdict}", *(f"  - {reason}" for reason in self.reasons)])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for curve, row in zip(self.curves, d["curves"], strict=True):
            row["trend_agrees"] = curve.trend_agrees
        return d

    def findings_frame(self) -> pd.DataFrame:
        """One row per finding type: reproduced or not, on time or not, and the onset offset.

        Example
        -------
        >>> match = FindingMatch("grad_spike", 6, 7, True, True, 1, 0.05)
        >>> Comparison("reproduced", [], [match]).findings_frame()[["type", "offset_steps"]].values.tolist()
        [['grad_spike', 1]]
        """
        import pandas as pd

        return pd.DataFrame(self.to_dict()["findings"], columns=[f.name for f in fields(FindingMatch)])

    def curves_frame(self) -> pd.DataFrame:
        """One row per metric: rank correlation, direction agreement and both trends.

        Example
        -------
        >>> loss = CurveAgreement("actor/loss", 12, 0.9, 0.8, "down", "down")
        >>> Comparison("both healthy", [], curves=[loss]).curves_frame()["trend_agrees"].tolist()
        [True]
        """
        import pandas as pd

        columns = [*(f.name for f in fields(CurveAgreement)), "trend_agrees"]
        return pd.DataFrame(self.to_dict()["curves"], columns=columns)


def compare(
    original: Trace,
    proxy: Trace,
    *,
    original_findings: list[Finding] | None = None,
    proxy_findings: list[Finding] | None = None,
    faults: Sequence[str] | None = None,
    healthy: Comparison | None = None,
) -> Comparison:
    """The reproduction verdict of ``proxy`` against ``original`` (findings computed if not given).

    ``faults``: the injected faults to judge the signature of (``NAME[@STEP][:ARG]`` or names);
    by default those both traces' headers name; ``()`` judges every finding. ``healthy``: the
    comparison of the two models' runs without faults, whose proxy-only findings are set apart.
    """
    a = original_findings if original_findings is not None else diagnose(original)
    b = proxy_findings if proxy_findings is not None else diagnose(proxy)
    run_length = max(len(original.steps), 1)
    matches = _match(_onsets(a), _onsets(b), run_length)
    curves = [c for c in (_curve(original, proxy, m) for m in CURVES) if c is not None]
    names, signature, note = _signature(original, proxy, faults, matches)
    raw = Comparison("", [], matches, curves, names, signature, note=note)
    return against_healthy(raw, healthy) if healthy is not None else _conclude(raw)


def compare_healthy(
    original: Trace,
    proxy: Trace,
    *,
    original_findings: list[Finding] | None = None,
    proxy_findings: list[Finding] | None = None,
) -> Comparison:
    """The two models' runs without faults compared, every finding judged: the baseline that
    :func:`compare` takes as ``healthy``. A run whose header names a fault is refused, since
    what a fault raises would then count as the proxy's own."""
    for role, trace in (("original", original), ("proxy", proxy)):
        named = [str(f) for f in (trace.header.get("faults") or []) if str(f).strip()]
        if named:
            where = f" ({trace.path})" if trace.path else ""
            raise MoescopeError(
                f"the {role}'s healthy run{where} injected {', '.join(named)}; "
                "give the two runs of the same config without faults as the baseline."
            )
    kwargs = {"original_findings": original_findings, "proxy_findings": proxy_findings}
    return compare(original, proxy, faults=(), **kwargs)


def against_healthy(comparison: Comparison, healthy: Comparison) -> Comparison:
    """``comparison`` judged again with the proxy's own findings set apart: the types the
    ``healthy`` comparison (the two models without faults) found only on the proxy.

    Works on a comparison read back with :meth:`Comparison.from_dict`, so a study's stored rows
    can be judged against their healthy runs without replaying anything.
    """
    own = proxy_only(healthy)
    matches = [replace(m, own=m.type in own) for m in comparison.findings]
    return _conclude(replace(comparison, findings=matches, own=own))


def proxy_only(healthy: Comparison) -> dict[str, int | None]:
    """The finding types a comparison found only on the proxy, with their onset there: on two
    healthy runs, what the proxy raises without any fault."""
    return {m.type: m.proxy_step for m in healthy.findings if m.false_alarm}


def _conclude(c: Comparison) -> Comparison:
    """The verdict and reasons of a comparison whose matches, curves and signature are known."""
    every, reasons = _verdict(c.findings, c.curves, c.own)
    if not c.signature:
        return replace(
            c, verdict=every, reasons=[c.note, *reasons] if c.note else reasons, every_finding=every
        )
    verdict, head = _signature_verdict(c.findings, c.signature, c.faults, every)
    return replace(c, verdict=verdict, reasons=[head, *reasons], every_finding=every)


def _signature(
    original: Trace, proxy: Trace, faults: Sequence[str] | None, matches: list[FindingMatch]
) -> tuple[list[str], list[str], str | None]:
    """The injected fault kinds, their signature among the original's findings, and a note when
    there are faults but every finding has to be judged."""
    names, note = (fault_names(faults), None) if faults is not None else _shared_faults(original, proxy)
    defined = sorted({t for n in names for t in KINDS[n].signature})
    signature = sorted(set(defined) & {m.type for m in matches if not m.false_alarm})
    if names and not signature and note is None:
        note = (
            f"the original shows none of the signature of {', '.join(names)} "
            f"({', '.join(defined) or 'none defined'}), so every finding is judged"
        )
    return names, signature, note


def fault_names(texts: Sequence[str] | str | None) -> list[str]:
    """The kinds of the faults in ``texts`` (``NAME[@STEP][:ARG]``, a list or one comma-separated
    string, as trace headers hold them), unknown names left out.

    >>> fault_names(["lr_spike@4", "no_grad_clip@0", "lr_spike@9:10"]), fault_names("nan_op@6:model.norm")
    (['lr_spike', 'no_grad_clip'], ['nan_op'])
    """
    parts = texts.split(",") if isinstance(texts, str) else (texts or [])
    names = {t.partition(":")[0].partition("@")[0].strip() for t in parts}
    return sorted(names & KINDS.keys())


def _shared_faults(original: Trace, proxy: Trace) -> tuple[list[str], str | None]:
    """The fault kinds both headers name, or none with a note when they name different ones."""
    if "faults" not in original.header or "faults" not in proxy.header:
        return [], None  # a log that does not say (another framework's)
    a, b = fault_names(original.header["faults"]), fault_names(proxy.header["faults"])
    if a != b:
        return [], (
            f"the traces name different faults ({', '.join(a) or 'none'} against {', '.join(b) or 'none'}), "
            "so every finding is judged"
        )
    return a, None


def _signature_verdict(
    matches: list[FindingMatch], signature: list[str], names: list[str], every: str
) -> tuple[str, str]:
    judged = [m for m in matches if m.type in signature and not m.false_alarm]
    head = (
        f"judged on the signature of {', '.join(names)}: {', '.join(signature)} "
        f"({sum(m.hit for m in judged)} of {len(judged)} on time); every finding: {every}"
    )
    return _grade(judged, []), head


def _onsets(findings: list[Finding]) -> dict[str, int | None]:
    """First onset per finding type (warnings and errors only)."""
    out: dict[str, int | None] = {}
    for f in findings:
        if f.severity == "info":
            continue
        if f.type not in out or (f.step is not None and (out[f.type] is None or f.step < out[f.type])):
            out[f.type] = f.step
    return out


def _match(a: dict[str, int | None], b: dict[str, int | None], run_length: int) -> list[FindingMatch]:
    tolerance = max(MIN_TOLERANCE_STEPS, round(ONSET_TOLERANCE * run_length))
    rows = []
    for kind in sorted(set(a) | set(b)):
        if kind not in a:
            rows.append(FindingMatch(kind, None, b[kind], False, False, None, None, false_alarm=True))
            continue
        if kind not in b:
            rows.append(FindingMatch(kind, a[kind], None, False, False, None, None))
            continue
        offset = None if a[kind] is None or b[kind] is None else b[kind] - a[kind]
        on_time = offset is None or abs(offset) <= tolerance
        fraction = None if offset is None else offset / run_length
        rows.append(FindingMatch(kind, a[kind], b[kind], True, on_time, offset, fraction))
    return rows


def _trend(values: list[float]) -> str:
    third = max(1, len(values) // 3)
    early, late = statistics.fmean(values[:third]), statistics.fmean(values[-third:])
    scale = max(abs(early), abs(late), 1e-12)
    if abs(late - early) / scale < 0.05:
        return "flat"
    return "up" if late > early else "down"


def _curve(original: Trace, proxy: Trace, metric: str) -> CurveAgreement | None:
    a, b = dict(series(original, metric)), dict(series(proxy, metric))
    steps = sorted(set(a) & set(b))
    if len(steps) < 3:
        return None
    x, y = [a[s] for s in steps], [b[s] for s in steps]
    smooth_x, smooth_y = running(x, 3, statistics.fmean), running(y, 3, statistics.fmean)
    return CurveAgreement(
        metric, len(steps), _spearman(x, y), _direction(smooth_x, smooth_y), _trend(x), _trend(y)
    )


def _spearman(x: list[float], y: list[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(set(x)) < 2 or len(set(y)) < 2:
        return None
    rho = float(spearmanr(x, y).statistic)
    return rho if math.isfinite(rho) else None


def _direction(x: list[float], y: list[float]) -> float | None:
    pairs = [
        (math.copysign(1, x1 - x0), math.copysign(1, y1 - y0))
        for (x0, x1), (y0, y1) in zip(itertools.pairwise(x), itertools.pairwise(y), strict=True)
        if x1 != x0 and y1 != y0
    ]
    return sum(p == q for p, q in pairs) / len(pairs) if pairs else None


def _verdict(
    matches: list[FindingMatch], curves: list[CurveAgreement], own: dict[str, int | None]
) -> tuple[str, list[str]]:
    originals = [m for m in matches if not m.false_alarm]
    alarms = [m for m in matches if m.false_alarm and not m.own]
    reasons = []
    for m in originals:
        if m.own and m.reproduced:
            reasons.append(
                f"{m.type} raised on both (onset {m.original_step} vs {m.proxy_step}), but the proxy "
                f"raises it without a fault (healthy run, step {own[m.type]}): not counted as reproduced"
            )
        elif m.reproduced and m.on_time:
            reasons.append(f"{m.type} reproduced (onset {m.original_step} vs {m.proxy_step})")
        elif m.reproduced:
            reasons.append(f"{m.type} reproduced late or early (onset {m.original_step} vs {m.proxy_step})")
        else:
            reasons.append(f"{m.type} at step {m.original_step} not reproduced")
    reasons += [f"{m.type} only on the proxy (step {m.proxy_step})" for m in alarms]
    reasons += [
        f"{m.type} only on the proxy (step {m.proxy_step}), as in its healthy run (step {own[m.type]}): "
        "the proxy's own, set apart"
        for m in matches
        if m.false_alarm and m.own
    ]
    agreeing = [c for c in curves if c.trend_agrees]
    if curves:
        reasons.append(
            f"curve trends agree on {len(agreeing)} of {len(curves)} metrics "
            f"({', '.join(c.metric for c in curves if not c.trend_agrees) or 'all agree'})"
        )
    return _grade(originals, alarms), reasons


def _grade(judged: list[FindingMatch], alarms: list[FindingMatch]) -> str:
    """The verdict on the ``judged`` findings of the original, with the proxy's false ``alarms``;
    a finding that is the proxy's own is neither reproduced nor an alarm."""
    if not judged and not alarms:
        return "both healthy"
    if judged and all(m.hit for m in judged) and not alarms:
        return "reproduced"
    return "partially reproduced" if any(m.reproduced and not m.own for m in judged) else "not reproduced"
