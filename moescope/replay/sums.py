"""Per-step sums and counts, reduced over data-parallel ranks in one collective.

Every metric of a step is accumulated as a sum (scalars as floats, per-layer counts and
histograms as float64 tensors) so that ranks can add theirs: one ``all_reduce`` of the
concatenation gives the global sums, from which means and shares are taken. A few are peaks
(the largest router logit), kept as maxima and reduced with a second, max collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moescope.replay.comm import Comm


@dataclass
class StepSums:
    values: dict[str, float | torch.Tensor] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float | torch.Tensor) -> None:
        if torch.is_tensor(value) and value.dim() > 0:
            value = value.detach().to("cpu", torch.float64)
            old = self.values.get(key)
            self.values[key] = value.clone() if old is None else old + value
        else:
            self.values[key] = self.values.get(key, 0.0) + float(value)

    def peak(self, key: str, value: float | torch.Tensor) -> None:
        """Keep the largest ``value`` seen under ``key`` (over minibatches, then over ranks)."""
        self.peaks[key] = max(self.peaks.get(key, -float("inf")), float(value))

    def reduce(self, comm: Comm) -> dict[str, float | torch.Tensor]:
        """Global sums and peaks (a copy; the local values are left as they are)."""
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
        if self.peaks:
            names = sorted(self.peaks)
            top = comm.max_(torch.tensor([self.peaks[k] for k in names], dtype=torch.float64))
            out.update({k: float(v) for k, v in zip(names, top.tolist(), strict=True)})
        return out
