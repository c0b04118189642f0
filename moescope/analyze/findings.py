"""What a diagnosis says: :class:`Finding` records in the DESIGN vocabulary.

A finding has a ``type`` from :data:`FINDING_TYPES`, the onset ``step`` (``None`` when the log
does not say), a ``severity`` (``info`` / ``warning`` / ``error``), one-sentence ``message``,
``evidence`` (the figures it rests on) and ``layer`` where it applies. Charts mark findings on
traces; the verdict compares the findings of an original and a proxy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pandas as pd

FINDING_TYPES = (
    "nonfinite",
    "grad_spike",
    "zero_grad",
    "overflow",
    "loss_divergence",
    "entropy_collapse",
    "entropy_surge",
    "reward_collapse",
    "no_signal",
    "degenerate_output",
    "load_collapse",
    "kl_blowup",
    "rollout_mismatch",
    "route_overlap_low",
    "optimizer_reset",
    "aux_loss_doubled",
)
SEVERITIES = ("info", "warning", "error")
Severity = Literal["info", "warning", "error"]


@dataclass(frozen=True)
class Finding:
    type: str
    step: int | None
    severity: Severity
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    layer: int | None = None

    def __post_init__(self) -> None:
        if self.type not in FINDING_TYPES:
            raise ValueError(f"unknown finding type {self.type!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FRAME_COLUMNS = ("model", "type", "step", "severity", "layer", "message")


def findings_frame(by_model: Mapping[str, Sequence[Finding]]) -> pd.DataFrame:
    """The findings of several models in one table, one row each, in the given order.

    Columns: ``model`` (the mapping's key), ``type``, ``step``, ``severity``, ``layer`` and
    ``message``; the evidence stays on the :class:`Finding`. A model without findings adds
    no row, so an empty table means nothing was raised.

    Example
    -------
    >>> spike = Finding("grad_spike", 6, "warning", "grad norm 40x its median")
    >>> findings_frame({"original": [spike], "proxy": []})[["model", "type", "step"]].values.tolist()
    [['original', 'grad_spike', 6]]
    """
    import pandas as pd

    rows = [
        {"model": model, **{k: v for k, v in f.to_dict().items() if k != "evidence"}}
        for model, findings in by_model.items()
        for f in findings
    ]
    return pd.DataFrame(rows, columns=list(FRAME_COLUMNS))
