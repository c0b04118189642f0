"""Data parallelism for a replay: one process, or ``torchrun`` with gloo (CPU) / NCCL (GPU).

Each RL step's groups are split across ranks; gradients are summed with ``all_reduce`` (the
loss is already normalised by the global token count, so the sum is the single-process
gradient), and every metric is reduced as sums and counts, so rank 0 writes the trace of the
whole global batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.distributed as dist

from moescope.models.sharding import all_reduce_


class Comm:
    """Rank, world size and the few collectives a replay needs (no-ops in one process)."""

    def __init__(self, owns_group: bool = False, *, sharded: bool = False) -> None:
        self.group = dist.is_available() and dist.is_initialized()
        self.world = dist.get_world_size() if self.group else 1
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.owns_group = owns_group
        self.sharded = sharded  # FSDP reduces the gradients itself

    @classmethod
    def from_env(cls, *, sharded: bool = False) -> Comm:
        """Join the process group ``torchrun`` describes in the environment, if any (a sharded
        run joins it even as the only process, since FSDP needs one)."""
        launched = "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if (world > 1 or (sharded and launched)) and not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":  # one GPU a process: FSDP places each shard on the current one
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(backend)
            return cls(owns_group=True, sharded=sharded)
        return cls(sharded=sharded)

    def __enter__(self) -> Comm:
        return self

    def __exit__(self, *exc: object) -> None:
        """Destroy the process group this object created (one the caller made stays theirs):
        left to interpreter shutdown, gloo's teardown aborts a finished process now and then."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mine(self, items: list) -> list:
        """This rank's share of ``items`` (round robin, so shares differ by at most one)."""
        return items[self.rank :: self.world]

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks in place (a metric's CPU sums pass through the GPU under NCCL)."""
        return all_reduce_(tensor) if self.world > 1 else tensor

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        return all_reduce_(tensor, dist.ReduceOp.MAX) if self.world > 1 else tensor

    def sum_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum gradients over ranks (one flat buffer, one collective); FSDP has summed them
        already (reduce-scatter) when the model is sharded."""
        if self.world == 1 or self.sharded:
            return
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        all_reduce_(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def any_(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a sharded model's data-dependent extra pass must
        run on every rank, or FSDP's collectives wait forever)."""
        return bool(self.max_(torch.tensor(float(flag)))) if self.world > 1 else flag

    def first_text(self, text: str | None) -> str | None:
        """The first non-empty value over ranks, in rank order."""
        if self.world == 1:
            return text
        values: list[str | None] = [None] * self.world
        dist.all_gather_object(values, text)
        return next((v for v in values if v), None)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
