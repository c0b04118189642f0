"""The fidelity study judged again with each proxy's healthy run as baseline.

A study row holds the comparison :func:`moescope.analyze.verdict.compare` made of one proxy run
with the original's. A proxy whose pruning left it raising a finding without any fault (entropy
collapsing in every run, every group's rewards equal from the first step) turns that finding
into a false alarm in each of its faulted runs, and into a reproduction wherever the original
raises it under the fault. :func:`baseline_frame` judges every faulted row again with the same
proxy and seed's healthy row as baseline (:func:`~moescope.analyze.verdict.against_healthy`), from
the stored matches alone: replays are deterministic, so this is what ``moescope diagnose
--healthy`` says of the same traces. :func:`baseline_summary` pools it per keep and method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moescope.analyze.verdict import Comparison, against_healthy, fault_names

if TYPE_CHECKING:
    import pandas as pd

AGREEING = ("reproduced", "both healthy")
HEALTHY = "healthy"  # the study's name of the run without a fault


def row_comparison(row: dict[str, Any]) -> Comparison:
    """A study row's comparison as ``compare`` returned it (the study keeps curves by metric)."""
    kept = {k: row[k] for k in ("verdict", "every_finding", "signature", "findings") if k in row}
    curves = list(row.get("curves", {}).values())
    return Comparison.from_dict({**kept, "curves": curves, "faults": fault_names(row["fault"])})


def baseline_frame(result: dict[str, Any]) -> pd.DataFrame:
    """One row per faulted run with a healthy run beside it: keep, method, seed, fault, the
    proxy's ``own`` finding types (from its healthy run), and without and with the baseline
    (``_based``): whether the verdict agrees, the original's findings reproduced on time
    (``hits``) and their number."""
    import pandas as pd

    healthy = {_proxy(r): row_comparison(r) for r in result["rows"] if r["fault"] == HEALTHY}
    rows = []
    for row in result["rows"]:
        if row["fault"] == HEALTHY or _proxy(row) not in healthy:
            continue
        plain = row_comparison(row)
        based = against_healthy(plain, healthy[_proxy(row)])
        ids = {"keep": row["keep"], "method": row["method"], "seed": row["seed"], "fault": row["fault"]}
        judged = {
            f"{k}{suffix}": v for suffix, c in (("", plain), ("_based", based)) for k, v in _judged(c).items()
        }
        rows.append({**ids, "own": sorted(based.own), **judged})
    columns = ["keep", "method", "seed", "fault", "own"] + [
        f"{k}{s}" for s in ("", "_based") for k in ("agrees", "hits", "findings")
    ]
    return pd.DataFrame(rows, columns=columns)


def baseline_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per keep and method: the proxies with own findings (``own``: seed → types), the share of
    faulted runs whose verdict agrees and the pooled share of findings reproduced on time,
    without and with the baseline."""
    import pandas as pd

    out = []
    for (keep, method), runs in frame.groupby(["keep", "method"], sort=False):
        own = {int(s): list(t) for s, t in zip(runs["seed"], runs["own"], strict=True) if t}
        row = {"keep": keep, "method": method, "own": own}
        for suffix in ("", "_based"):
            findings = runs[f"findings{suffix}"].sum()
            row[f"verdicts{suffix}"] = runs[f"agrees{suffix}"].mean()
            row[f"hit{suffix}"] = runs[f"hits{suffix}"].sum() / findings if findings else float("nan")
        out.append(row)
    return pd.DataFrame(
        out, columns=["keep", "method", "own", "verdicts", "verdicts_based", "hit", "hit_based"]
    )


def _proxy(row: dict[str, Any]) -> tuple[str, str, int]:
    return row["keep"], row["method"], row["seed"]


def _judged(c: Comparison) -> dict[str, Any]:
    originals = [m for m in c.findings if not m.false_alarm]
    return {
        "agrees": c.verdict in AGREEING,
        "hits": sum(m.hit for m in originals),
        "findings": len(originals),
    }
