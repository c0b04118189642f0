"""What an export wrote and measured: :class:`ExportResult`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from moescope.explore.embeddings import ExpertEmbeddings
    from moescope.explore.selection import Selection
    from moescope.export.fidelity.measure import Fidelity
    from moescope.export.fidelity.validity import Check
    from moescope.export.healing import HealingReport
    from moescope.export.targeting import Targeting


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_proxy` wrote, and what it measured on the way.

    ``embeddings`` are the weight-view vectors a streaming export clustered (when it did);
    ``fidelity``, ``checklist``, ``healing`` and ``targeting`` (the capability target's rounds
    and, for ``keep="auto"``, the kept counts tried) are ``None`` when not measured or not done.
    """

    path: Path
    manifest: dict[str, Any]
    selection: Selection
    embeddings: ExpertEmbeddings | None = None
    fidelity: Fidelity | None = None
    checklist: list[Check] | None = None
    healing: HealingReport | None = None
    targeting: Targeting | None = None

    def healing_frame(self) -> pd.DataFrame:
        """Healing's record (:meth:`HealingReport.to_frame`), or one ``note`` row saying it was not done."""
        if self.healing is not None:
            return self.healing.to_frame()
        if self.targeting is not None and self.targeting.chosen.steps:
            steps = self.targeting.chosen.steps
            return _note(
                f"not healed by heal_steps; the capability target healed {steps} steps (targeting_frame)"
            )
        return _note("not healed (heal_steps = 0)")

    def targeting_frame(self) -> pd.DataFrame:
        """The capability target's curves (:meth:`Targeting.to_frame`), or one ``note`` row saying
        why there were none."""
        if self.targeting is not None:
            return self.targeting.to_frame()
        why = self.manifest.get("targeting", {}).get("why")
        return _note(
            f"capability target not measured: {why}" if why else "no capability target (min_capability = 0)"
        )

    def accuracy_frame(self) -> pd.DataFrame:
        """Task accuracy of original and proxy, or one ``note`` row saying why none was measured."""
        if self.fidelity is None:
            return _note("fidelity was not measured (fidelity=False)")
        if self.fidelity.task_accuracy is None:
            return _note("no tasks for this model: pass tasks= a .jsonl of prompts and answers")
        return self.fidelity.task_accuracy


def _note(text: str) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({"note": [text]})
