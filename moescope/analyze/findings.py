"""What a diagnosis says: :class:`Finding` records in the DESIGN vocabulary.

A finding has a ``type`` from :data:`FINDING_TYPES`, the onset ``step`` (``None`` when the log
does not say), a ``severity`` (``info`` / ``warning`` / ``error``), one-sentence ``message``,
``evidence`` (the figures it rests on) and ``layer`` where it applies. Charts mark findings on
traces; the verdict compares the findings of an original and a proxy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

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
