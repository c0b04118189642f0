"""The memory side of the cost: bytes per parameter of each RL training state, and devices.

A proxy keeps ``K`` of the ``E`` routed experts of every MoE layer (top-k unchanged), so it
drops the parameters of the cut experts and their router rows and nothing else. RL
post-training memory grows with the parameter count, state by state (bytes per parameter,
all overridable in :class:`TrainingMemory`):

=====================  =====  ===============================================================
state                  bytes  why
=====================  =====  ===============================================================
policy weights         2      bf16 weights the trainer runs forward and backward with
gradients              2      bf16 gradients
fp32 master weights    4      the optimizer updates an fp32 copy (mixed precision)
Adam m and v           8      two fp32 moments
frozen reference       2      bf16 reference policy for the KL term
rollout-engine copy    2      bf16 weights of the inference engine that generates rollouts
=====================  =====  ===============================================================

20 bytes per parameter in all. Of each device's memory (``device_memory_gb`` × ``usable_fraction``),
``activation_fraction`` is held back for activations and ``kv_cache_fraction`` for the rollout
engine's KV cache; the rest holds state. Devices = ⌈params × bytes per param / state per
device⌉, then optionally rounded up to a whole node of 8 (``rounding="node"``) or a power of
two (``"pow2"``). GB means 10⁹ bytes.

What the model ignores: activation and KV-cache memory really depend on batch, sequence
length and recomputation (here they are fixed fractions); it assumes every state is sharded
evenly over all devices and resident at once (ZeRO-3/FSDP with a colocated rollout engine, no
offloading, no parallelism overheads or replicated layers). And what a proxy does **not** save:
per-token compute. Top-k is unchanged, so every token still runs ``top_k`` experts
(``params_active`` hardly moves). With the same batch a compute-bound step on fewer devices
takes longer; device-hours per step (devices × step time) fall by the device ratio only if the
step time stays equal — pass measured step times per row to see the real figure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from moescope.errors import MoescopeError
from moescope.export.cost.profiles import DeviceProfile
from moescope.export.cost.shape import ModelShape

ROUNDINGS = ("device", "node", "pow2")
NODE_SIZE = 8  # accelerators per node, for rounding="node"
GB = 1e9
STATES = {  # TrainingMemory field -> how the text output names it
    "policy_weights": "bf16 weights",
    "gradients": "bf16 grads",
    "master_weights": "fp32 master",
    "adam_states": "Adam m+v",
    "reference_model": "reference",
    "rollout_weights": "rollout copy",
}


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes per parameter of each RL training state, and the device they must fit on.

    See the module docstring for the table of defaults and what the model ignores.

    Examples
    --------
    >>> m = TrainingMemory(device_memory_gb=64)  # e.g. an accelerator with 64 GB
    >>> m.bytes_per_param, round(m.state_gb_per_device, 2)
    (20.0, 40.32)
    """

    policy_weights: float = 2.0
    gradients: float = 2.0
    master_weights: float = 4.0
    adam_states: float = 8.0
    reference_model: float = 2.0
    rollout_weights: float = 2.0
    activation_fraction: float = 0.2  # of usable memory, for activations
    kv_cache_fraction: float = 0.1  # of usable memory, for the rollout engine's KV cache
    device_memory_gb: float = 80.0
    usable_fraction: float = 0.9  # what the framework can allocate (runtime, fragmentation)

    def __post_init__(self) -> None:
        if not self.device_memory_gb > 0:
            raise MoescopeError(
                f"device memory must be a positive number of GB, not {self.device_memory_gb}; "
                "pass the accelerator's memory, e.g. 80."
            )
        if not 0 < self.usable_fraction <= 1:
            raise MoescopeError(f"usable fraction {self.usable_fraction} is not in (0, 1]; pass e.g. 0.9.")
        headroom = self.activation_fraction + self.kv_cache_fraction
        if min(self.activation_fraction, self.kv_cache_fraction) < 0 or headroom >= 1:
            raise MoescopeError(
                f"activation and KV-cache fractions must be non-negative and leave room for state "
                f"(they sum to {headroom}); lower them."
            )
        if any(getattr(self, key) < 0 for key in STATES):
            raise MoescopeError(
                "bytes per parameter must not be negative; pass 0 for a state you do not keep."
            )

    @property
    def bytes_per_param(self) -> float:
        return float(sum(getattr(self, key) for key in STATES))

    @property
    def state_gb_per_device(self) -> float:
        """GB of one device left for parameter state after the activation and KV-cache headroom."""
        usable = self.device_memory_gb * self.usable_fraction
        return usable * (1 - self.activation_fraction - self.kv_cache_fraction)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "bytes_per_param": self.bytes_per_param,
            "state_gb_per_device": self.state_gb_per_device,
        }

    def text(self) -> str:
        """One line: the bytes per parameter and the memory of one device."""
        parts = ", ".join(f"{label} {getattr(self, key):g}" for key, label in STATES.items())
        return (
            f"state {self.bytes_per_param:g} B/param ({parts}); {self.device_memory_gb:g} GB devices, "
            f"{self.usable_fraction:.0%} usable, less {self.activation_fraction:.0%} activations and "
            f"{self.kv_cache_fraction:.0%} rollout KV cache: {self.state_gb_per_device:.1f} GB of state "
            "per device."
        )


def memory_of(memory: TrainingMemory | None, profile: DeviceProfile | None = None) -> TrainingMemory:
    """``memory`` as given, else the defaults on ``profile``'s device memory (80 GB without one)."""
    if memory is not None:
        return memory
    return TrainingMemory(device_memory_gb=profile.memory_gb) if profile else TrainingMemory()


def memory_breakdown(shape: ModelShape, memory: TrainingMemory | None = None) -> dict[str, float]:
    """GB of each training state for the whole model, their total, and one device's budget.

    Examples
    --------
    >>> from moescope.export.cost.shape import reference_models
    >>> b = memory_breakdown(reference_models()[0])  # Mixtral-8x7B
    >>> round(b["adam_states"]), round(b["state_total"])
    (374, 934)
    """
    memory = memory or TrainingMemory()
    states = {key: shape.params_total * getattr(memory, key) / GB for key in STATES}
    usable = memory.device_memory_gb * memory.usable_fraction
    return states | {
        "state_total": sum(states.values()),
        "device_usable": usable,
        "device_activations": usable * memory.activation_fraction,
        "device_kv_cache": usable * memory.kv_cache_fraction,
        "device_state": memory.state_gb_per_device,
    }


def devices_needed(shape: ModelShape, memory: TrainingMemory | None = None, rounding: str = "device") -> int:
    """Accelerators whose state budget holds every training state of ``shape``.

    ``⌈params × bytes per param / state GB per device⌉``, rounded up to a multiple of
    ``NODE_SIZE`` (``rounding="node"``) or a power of two (``"pow2"``) when asked.

    Examples
    --------
    >>> from moescope.export.cost.shape import reference_models
    >>> devices_needed(reference_models()[0]), devices_needed(reference_models()[0], rounding="node")
    (19, 24)
    """
    if rounding not in ROUNDINGS:
        raise MoescopeError(f"rounding {rounding!r} is not one of {', '.join(ROUNDINGS)}.")
    memory = memory or TrainingMemory()
    state_gb = shape.params_total * memory.bytes_per_param / GB
    devices = max(1, math.ceil(state_gb / memory.state_gb_per_device - 1e-9))
    if rounding == "node":
        return math.ceil(devices / NODE_SIZE) * NODE_SIZE
    if rounding == "pow2":
        return 1 << (devices - 1).bit_length()
    return devices
