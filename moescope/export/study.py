"""Results of the fidelity study (``bench/fidelity_study.py``) as tables.

The study replays the toy and its proxies (keep ratio × selection method × seed) under each
fault and compares every proxy trace with the toy's (:func:`moescope.analyze.verdict.compare`). Its JSON
holds one row per comparison; :func:`study_frame` turns that into one table row per proxy run,
and :func:`study_summary` pools them per keep ratio and method: the share of the toy's findings
reproduced on time (pooled over findings, not averaged over runs), false alarms per run, the
share of curve trends that agree, the mean rank correlation and the measured step-time ratio.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope import schema as S
from moescope._util.io import read_json_object
from moescope.errors import MoescopeError

if TYPE_CHECKING:
    import pandas as pd

CURVE_METRICS = (S.ACTOR_LOSS, S.GRAD_NORM, S.ENTROPY, S.REWARD_MEAN, S.KL)
STUDY_FILE = "fidelity-study.json"  # the toy's study; other models' carry their name
TARGETED = "-targeted"  # the same study with capability-targeted proxies (healed to the target)
DOCS = Path(__file__).resolve().parents[2] / "docs"  # where a checkout keeps the committed study
AGREEING_VERDICTS = ("reproduced", "both healthy")
# The two faults the paper injected, each with the curves whose effect must agree in sign on proxy
# and original, as the paper shows them: old log-probs from a low-precision rollout ("rollout–
# training log-prob drift and rising KL": the mean |Δ log-prob| and the k3 KL between rollout and
# training) and the actor update skipped (the policy stops moving away from the reference, so its
# KL stops growing).
PAPER_FAULTS = {
    "rollout_logprob_precision": (S.LOGPROB_MISMATCH, S.MISMATCH_KL),
    "update_omission": (S.KL,),
}
# Effects reported beside them but not required: over a 12-step replay they move by less than the
# noise on the original itself (measured on the toy: the PPO ratio's KL +0.0003 under the
# rollout fault, the reward's second-half mean +0.005 under omission), so their sign is chance.
ALSO_REPORTED = {
    "rollout_logprob_precision": (S.PPO_KL,),
    "update_omission": (S.REWARD_MEAN,),
}
# Logged only where a separate rollout engine computes log-probs: a run without it has none.
_ZERO_WHEN_ABSENT = (S.LOGPROB_MISMATCH, S.MISMATCH_KL)
EFFECT_METRICS = tuple(
    dict.fromkeys(m for d in (PAPER_FAULTS, ALSO_REPORTED) for ms in d.values() for m in ms)
)


def read_study(path: str | Path) -> dict[str, Any]:
    """The study's JSON (a file, or a directory holding ``fidelity-study.json``)."""
    path = Path(path)
    path = path / STUDY_FILE if path.is_dir() else path
    if not path.is_file():
        raise MoescopeError(
            f"No study results at {path}; run `python bench/fidelity_study.py --out DIR` first."
        )
    result = read_json_object(path, "run the study again")
    if "rows" not in result or "proxies" not in result:
        raise MoescopeError(f"{path} is not a fidelity-study result; run the study again.")
    return result


def mean_of(values: list[float | None]) -> float:
    """Mean of the values that are there (``None`` and NaN left out); NaN when none are."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else math.nan


def study_frame(result: dict[str, Any]) -> pd.DataFrame:
    """One row per proxy run: keep, method, seed, fault, verdict, findings reproduced on time
    (``hits`` of ``findings``), false ``alarms``, curve ``trend`` agreement and mean ``rho``,
    ``step_ratio`` and the proxy's ``capability`` (accuracy ratio to the original)."""
    import pandas as pd

    capability = {(p["keep"], p["method"], p["seed"]): p.get("capability_ratio") for p in result["proxies"]}
    rows = []
    for r in result["rows"]:
        originals = [f for f in r["findings"] if not f["false_alarm"]]
        curves = [r["curves"][m] for m in CURVE_METRICS if m in r["curves"]]
        rows.append(
            {
                "keep": r["keep"],
                "method": r["method"],
                "seed": r["seed"],
                "fault": r["fault"],
                "verdict": r["verdict"],
                "hits": sum(bool(f["reproduced"] and f["on_time"]) for f in originals),
                "findings": len(originals),
                "alarms": sum(bool(f["false_alarm"]) for f in r["findings"]),
                "trend": mean_of([float(c["trend_agrees"]) for c in curves]),
                "rho": mean_of([c["spearman"] for c in curves]),
                "step_ratio": r["step_ratio"],
                "capability": capability.get((r["keep"], r["method"], r["seed"])),
            }
        )
    return pd.DataFrame(rows)


def study_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per keep ratio and method: ``hit`` (pooled share of findings reproduced on time),
    ``alarms`` per run, mean ``trend``, ``rho``, ``step_ratio`` and ``capability``."""
    groups = frame.groupby(["keep", "method"], sort=False)
    summary = groups.agg(
        hits=("hits", "sum"),
        findings=("findings", "sum"),
        alarms=("alarms", "mean"),
        trend=("trend", "mean"),
        rho=("rho", "mean"),
        step_ratio=("step_ratio", "mean"),
        capability=("capability", "mean"),
    )
    summary.insert(0, "hit", summary["hits"] / summary["findings"].where(summary["findings"] > 0))
    return summary.reset_index()


def healing_effect(unhealed: dict[str, Any], healed: dict[str, Any]) -> pd.DataFrame:
    """Per keep ratio and method, ``hit`` and ``capability`` of the study without healing and
    of the one whose proxies were healed first (the same exports otherwise), side by side."""
    columns = ["hit", "capability"]
    before, after = (
        study_summary(study_frame(result)).set_index(["keep", "method"])[columns]
        for result in (unhealed, healed)
    )
    joined = before.join(after, suffixes=("_unhealed", "_healed"), how="inner")
    return joined[[f"{c}_{when}" for c in columns for when in ("unhealed", "healed")]].reset_index()


def study_file(model: str = "toy", targeted: bool = False) -> str:
    """The file name of a model's study: ``fidelity-study[-MODEL][-targeted].json``.

    >>> study_file(), study_file("toy-v3", targeted=True)
    ('fidelity-study.json', 'fidelity-study-toy-v3-targeted.json')
    """
    stem = Path(STUDY_FILE).stem + ("" if model == "toy" else f"-{model}")
    return stem + (TARGETED if targeted else "") + ".json"


def study_paths(
    study: str | Path = "auto", healed: str | Path = "auto", model: str = "toy"
) -> tuple[Path | None, Path | None]:
    """The study JSON and the capability-targeted study JSON to read, each ``None`` where there is none.

    ``study``: ``"auto"`` (this checkout's ``docs/``), a study JSON or its directory; a directory
    holds one study per ``model`` (:func:`study_file`). ``healed``: ``"auto"`` (the targeted study
    beside the study), a JSON, or ``""`` for none. It is only looked for beside a study that was found.

    Example
    -------
    >>> study_paths("no/such/dir")
    (None, None)
    """
    source = DOCS if str(study) == "auto" else Path(study)
    found = source / study_file(model) if source.is_dir() else source
    if not found.is_file():
        return None, None
    beside = found.with_name(found.stem + TARGETED + found.suffix)
    healed_path = beside if str(healed) == "auto" else Path(healed)
    return found, healed_path if str(healed) and healed_path.is_file() else None


def fault_agreement(frame: pd.DataFrame) -> pd.DataFrame:
    """Per fault (rows) and method (columns), the share of proxy runs whose verdict agrees with
    the original's: ``reproduced``, or ``both healthy`` where the original raised nothing.

    Example
    -------
    >>> import pandas as pd
    >>> runs = pd.DataFrame({"fault": ["lr_spike"] * 2, "method": ["cluster"] * 2,
    ...                      "verdict": ["reproduced", "not reproduced"]})
    >>> float(fault_agreement(runs).loc["lr_spike", "cluster"])
    0.5
    """
    agree = frame.assign(agree=frame["verdict"].isin(AGREEING_VERDICTS))
    return agree.pivot_table(index="fault", columns="method", values="agree", aggfunc="mean", sort=False)


def run_summary(steps: list[dict[str, Any]]) -> dict[str, float]:
    """What the study keeps of one replay beside its comparison: the mean of each of
    :data:`EFFECT_METRICS` over the run's second half (where a fault has acted), and the mean
    share of GRPO groups with no reward variance over the whole run (``no_signal``).

    >>> run_summary([{"reward/mean": 0.0, "reward/no_signal_frac": 1.0},
    ...              {"reward/mean": 0.5, "reward/no_signal_frac": 0.5}])["no_signal"]
    0.75
    """
    late = steps[len(steps) // 2 :]
    summary = {m: mean_of([_number(s.get(m, 0.0 if m in _ZERO_WHEN_ABSENT else None)) for s in late])
               for m in EFFECT_METRICS}  # fmt: skip
    summary["no_signal"] = mean_of([_number(s.get(S.NO_SIGNAL_FRAC)) for s in steps])
    return summary


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def fault_effects(result: dict[str, Any]) -> pd.DataFrame:
    """Per proxy run of one of :data:`PAPER_FAULTS`: the fault's effect on each of its curves
    (the faulty run minus the healthy run of the same model and seed, second-half means), on the
    original and on the proxy, and ``agrees``: every effect has the same sign on both. This is
    the paper's criterion (same direction and trend, not the same values). The effects of
    :data:`ALSO_REPORTED` are there too, with ``also agrees``, outside the criterion."""
    import pandas as pd

    original = {(o["fault"], o["seed"]): o["summary"] for o in result.get("originals", [])}
    proxy = {(r["keep"], r["method"], r["seed"], r["fault"]): r.get("summary") for r in result["rows"]}
    rows = []
    for (keep, method, seed, fault), summary in proxy.items():
        healthy = proxy.get((keep, method, seed, "healthy"))
        base = original.get(("healthy", seed))
        if fault not in PAPER_FAULTS or None in (summary, healthy, base, original.get((fault, seed))):
            continue
        row: dict[str, Any] = {"keep": keep, "method": method, "seed": seed, "fault": fault}
        signs = {}
        for metric in PAPER_FAULTS[fault] + ALSO_REPORTED.get(fault, ()):
            on_original = original[(fault, seed)].get(metric, math.nan) - base.get(metric, math.nan)
            on_proxy = summary.get(metric, math.nan) - healthy.get(metric, math.nan)
            row[f"{metric} original"], row[f"{metric} proxy"] = on_original, on_proxy
            signs[metric] = _sign(on_original) == _sign(on_proxy)
        row["agrees"] = all(signs[m] for m in PAPER_FAULTS[fault])
        row["also agrees"] = all(signs[m] for m in ALSO_REPORTED.get(fault, ()))
        rows.append(row)
    return pd.DataFrame(rows)


def paper_fault_agreement(result: dict[str, Any], column: str = "agrees") -> pd.DataFrame:
    """Per paper fault and keep ratio (rows) and method (columns), the share of proxy runs whose
    effects agree with the original's (:func:`fault_effects`; ``"also agrees"`` for the curves
    reported outside the criterion). Empty when the study ran neither fault."""
    import pandas as pd

    effects = fault_effects(result)
    if effects.empty:
        return pd.DataFrame()
    shares = effects.assign(share=effects[column].astype(float))
    return shares.pivot_table(
        index=["fault", "keep"], columns="method", values="share", aggfunc="mean", sort=False
    )


def _sign(value: float) -> float:
    """The sign of an effect, with effects under 1e-6 counted as none."""
    return 0.0 if math.isnan(value) or abs(value) < 1e-6 else math.copysign(1.0, value)


def no_signal_table(result: dict[str, Any]) -> pd.DataFrame:
    """Per keep ratio and method, the mean share of GRPO groups with no reward variance in the
    proxies' healthy runs, beside the original's (``original``): a proxy near 1.0 gives RL no
    learning signal, so a fault acting through gradients cannot show on it."""
    import pandas as pd

    healthy = [r for r in result["rows"] if r["fault"] == "healthy" and r.get("summary")]
    frame = pd.DataFrame(
        [{"keep": r["keep"], "method": r["method"], "no_signal": r["summary"]["no_signal"]} for r in healthy]
    )
    if frame.empty:
        return frame
    table = frame.groupby(["keep", "method"], sort=False)["no_signal"].mean().reset_index()
    originals = [o["summary"]["no_signal"] for o in result.get("originals", []) if o["fault"] == "healthy"]
    return table.assign(original=mean_of(originals))
