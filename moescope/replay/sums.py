"""Per-step sums and counts, reduced over data-parallel ranks in one collective.

Every metric of a step is accumulated as a sum (scalars as floats, per-layer counts and
histograms as float64 tensors) so that ranks can add theirs: one ``all_reduce`` of the
concatenation gives the global sums, from which means and shares are taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moescope.replay.comm import Comm


@dataclass
class StepSums:
    values: dict[str, float | torch.Tensor] = field(default_factory=dict)

    def add(self, key: str, value: float | torch.Tensor) -> None:
        if torch.is_tensor(value) and value.dim() > 0:
            value = value.detach().to("cpu", torch.float64)
            old = self.values.get(key)
            self.values[key] = value.clone() if old is None else old + value
        else:
            self.values[key] = self.values.get(key, 0.0) + float(value)

    def reduce(self, comm: Comm) -> dict[str, float | torch.Tensor]:
        """Global sums (a copy; the local sums are left as they are)."""
        keys = sorted(self.values)
        parts = [torch.as_tensor(self.values[k], dtype=torch.float64).reshape(-1) for k in keys]
        flat = comm.sum_(torch.cat(parts)) if parts else torch.zeros(0, dtype=torch.float64)
        out: dict[str, float | torch.Tensor] = {}
        offset = 0
        for key, part in zip(keys, parts, strict=True):
            chunk = flat[offset : offset + part.numel()]
            offset += part.numel()
            value = self.values[key]
            out[key] = chunk.reshape(value.shape).clone() if torch.is_tensor(value) else float(chunk[0])
        return out
