"""OPEFO token-entropy flow control: keep the policy's token entropy off the floor.

Late in RL the policy's token entropy can fall fast (entropy collapse): the model stops
exploring and groups stop varying. OPEFO watches the mean token entropy of each step's rollout
(measured by the training forward before the update) and, while it is below
``min_entropy_floor``, intervenes in two ways:

1. an adaptive entropy bonus: the loss gains ``- coef * mean token entropy``; ``coef`` doubles
   each step the entropy stays under the floor (starting at ``entropy_coef_max / 16``, capped
   at ``entropy_coef_max``) and halves each step it is above (reaching 0 below 1e-6);
2. damping: tokens whose entropy is below the floor *and* whose advantage is positive — the
   updates that sharpen an already confident distribution most — have their advantage
   multiplied by ``low_entropy_damping``.

Per step the trace records ``opefo/active``, ``opefo/entropy_coef`` and ``opefo/damped_frac``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EntropyFlowControl:
    floor: float
    coef_max: float
    damping: float
    enabled: bool = True
    coef: float = 0.0
    active: bool = False

    def observe(self, mean_entropy: float) -> None:
        """Update the controller from this step's mean token entropy (before the update)."""
        self.active = self.enabled and mean_entropy < self.floor
        if self.active:
            self.coef = min(self.coef_max, max(2 * self.coef, self.coef_max / 16))
        else:
            self.coef = self.coef / 2 if self.coef / 2 >= 1e-6 else 0.0
        if not self.enabled:
            self.coef = 0.0

    def damp(
        self, advantages: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """Per-token advantages with low-entropy positive tokens damped; share of tokens damped."""
        if not self.active:
            return advantages, 0.0
        hit = (entropy < self.floor) & (advantages > 0) & (mask > 0)
        share = float(hit.sum() / mask.sum().clamp(min=1))
        return torch.where(hit, advantages * self.damping, advantages), share

    def state_dict(self) -> dict[str, float | bool]:
        return {"coef": self.coef, "active": self.active}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.active = float(state["coef"]), bool(state["active"])
