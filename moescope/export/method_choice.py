"""``method="auto"``: cut a proxy with each strong selection method, keep the one that keeps the
most task skill, measured.

Which selection keeps the most skill depends on the model and on what it was calibrated on. On
the embedded models calibrated on the replay's two tasks, REAP's saliency ranking kept more than
the paper's clustering at 1/2 and 1/4 of the experts and the clustering more at 1/8: a narrow
calibration concentrates saliency on the few experts the task routes to, where K-Medoids still
spends a representative on every cluster. Taylor importance, which scores what removing an expert
does to the sampled completions, kept the most of the three on average at 1/2 and 1/4 of toy-v3,
but not on every seed (the documentation's *The fidelity studies*). Rather than guess, ``auto``
cuts a proxy with each of :data:`AUTO_CANDIDATES` from the one calibration pass, measures each
one's accuracy ratio on the tasks before any healing, and keeps the best (ties: the earlier
candidate).

The candidates are measured as the checklist measures (same tasks, prompts, samples and seed:
the capability target's :class:`~moescope.export.targeting.CapabilityProbe`, the original
measured once), so the unhealed figure the checklist reports of an ``auto`` proxy is the larger
of the candidates' on those prompts. The rest of what a proxy is judged by (its replays against
the original's) is measured apart from the choice. Where no task can be measured (no tokenizer,
no tasks for the model), ``auto`` is :data:`FALLBACK`, and the manifest's ``"method_choice"``
says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from moescope.explore.methods import AUTO, auto_candidates

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.explore.selection import Selection
    from moescope.export.fidelity.records import Check


class CapabilityProbe(Protocol):
    """What the choice measures with (:class:`moescope.export.targeting.CapabilityProbe`)."""

    def check(self, proxy: PreTrainedModel) -> Check: ...


AUTO_METHOD = AUTO
"""The export ``method`` that measures :data:`AUTO_CANDIDATES` and keeps the best."""

AUTO_CANDIDATES = tuple(m.name for m in auto_candidates())
"""The methods ``auto`` compares, as the registry marks them (:mod:`moescope.explore.methods`;
``taylor`` where the model supports it): between them, the most skill unhealed in every row of
the study."""

FALLBACK = "paper"
"""What ``auto`` is where no task can be measured: the study's best on reproduced verdicts."""


@dataclass(frozen=True)
class Choice:
    """One kept count: each candidate's accuracy ratio (unhealed) and the method kept."""

    keep: int
    ratios: dict[str, float]
    chosen: str


@dataclass
class MethodChoices:
    """What ``auto`` did, for the manifest: each kept count's choice, or why nothing was measured
    (then every count is :data:`FALLBACK`)."""

    candidates: tuple[str, ...] = AUTO_CANDIDATES
    choices: list[Choice] = field(default_factory=list)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON values (a NaN ratio as ``None``): the manifest's ``"method_choice"``."""
        choices = [
            {
                "keep": c.keep,
                "chosen": c.chosen,
                "ratios": {m: None if math.isnan(r) else r for m, r in c.ratios.items()},
            }
            for c in self.choices
        ]
        out = {"method": AUTO_METHOD, "candidates": list(self.candidates), "choices": choices}
        if self.why:
            out.update(fallback=FALLBACK, why=self.why)
        return out


def choosing_selector(
    cut: Callable[[Selection], PreTrainedModel],
    selectors: Mapping[str, Callable[[Any], Selection]],
    probe: CapabilityProbe,
    record: MethodChoices,
) -> Callable[[Any], Selection]:
    """``keep → Selection``: every candidate's selection at that keep, cut into a proxy by ``cut``
    (from the original in memory, or from its shards) and measured with ``probe``; the best kept
    (a NaN ratio counts as none), its choice appended to ``record``."""

    record.candidates = tuple(selectors)

    def select(keep: Any) -> Selection:
        selections = {method: choose(keep) for method, choose in selectors.items()}
        ratios = {method: _ratio(probe, cut(s)) for method, s in selections.items()}
        best = max(ratios, key=lambda m: -math.inf if math.isnan(ratios[m]) else ratios[m])
        record.choices.append(Choice(selections[best].keep, ratios, best))
        return selections[best]

    return select


def _ratio(probe: CapabilityProbe, proxy: PreTrainedModel) -> float:
    details = probe.check(proxy).details
    return float(details.get("ratio", math.nan))
