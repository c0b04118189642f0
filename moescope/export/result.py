"""What an export wrote and measured: :class:`ExportResult`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moescope.explore.embeddings import ExpertEmbeddings
    from moescope.explore.selection import Selection
    from moescope.export.fidelity.measure import Fidelity
    from moescope.export.fidelity.validity import Check
    from moescope.export.healing import HealingReport


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_proxy` wrote, and what it measured on the way.

    ``embeddings`` are the weight-view vectors a streaming export clustered (when it did);
    ``fidelity``, ``checklist`` and ``healing`` are ``None`` when not measured or not done.
    """

    path: Path
    manifest: dict[str, Any]
    selection: Selection
    embeddings: ExpertEmbeddings | None = None
    fidelity: Fidelity | None = None
    checklist: list[Check] | None = None
    healing: HealingReport | None = None
