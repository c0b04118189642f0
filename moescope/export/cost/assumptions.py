"""The assumptions of one costing from ``KEY=VALUE`` overrides: the device, the workload, the memory.

One flag (``moescope cost --assume prompts=256 --assume inter_node_gb_s=50``) reaches every
field of :class:`~moescope.export.cost.profiles.DeviceProfile` and
:class:`~moescope.export.cost.step.RLWorkload`, whose names do not overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from moescope.errors import MoescopeError
from moescope.export.cost.memory import TrainingMemory
from moescope.export.cost.profiles import DeviceProfile, device_profile
from moescope.export.cost.step import RLWorkload

_DEVICE_KEYS = [f.name for f in fields(DeviceProfile) if f.name != "name"]
_WORKLOAD_KEYS = [f.name for f in fields(RLWorkload)]
_WORDS = {f.name for f in fields(RLWorkload) if f.type == "str"}  # taken as written


def assumed(
    device: str | Path = "h100",
    overrides: Sequence[str] | None = None,
    device_memory_gb: float | None = None,
    usable_fraction: float | None = None,
) -> tuple[DeviceProfile, RLWorkload, TrainingMemory]:
    """The device profile, workload and training memory that ``overrides`` (``KEY=VALUE``) leave.

    Examples
    --------
    >>> profile, workload, memory = assumed("ascend-910b", ["prompts=128", "inter_node_gb_s=50"])
    >>> workload.prompts, profile.inter_node_gb_s, memory.device_memory_gb
    (128, 50.0, 64.0)
    """
    values = dict(_pair(text) for text in overrides or [])
    unknown = sorted(set(values) - {*_DEVICE_KEYS, *_WORKLOAD_KEYS})
    if unknown:
        raise MoescopeError(
            f"no assumption named {', '.join(unknown)}; the device's are {', '.join(_DEVICE_KEYS)} and "
            f"the workload's {', '.join(_WORKLOAD_KEYS)}."
        )
    device_changes = {key: value for key, value in values.items() if key in _DEVICE_KEYS}
    profile = device_profile(device, **device_changes)
    workload = RLWorkload(
        **{key: _typed(key, value) for key, value in values.items() if key in _WORKLOAD_KEYS}
    )
    memory_gb = profile.memory_gb if device_memory_gb is None else device_memory_gb
    given = {"device_memory_gb": memory_gb, "usable_fraction": usable_fraction}
    memory = TrainingMemory(**{key: value for key, value in given.items() if value is not None})
    return profile, workload, memory


def _pair(text: str) -> tuple[str, Any]:
    key, sign, value = text.partition("=")
    if not sign or not key.strip() or not value.strip():
        raise MoescopeError(f"assumption {text!r} is not KEY=VALUE; write e.g. prompts=256 or mfu=0.4.")
    key, value = key.strip(), value.strip()
    return key, value if key in _WORDS else _number(key, value)


def _number(key: str, value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            raise MoescopeError(f"assumption {key}={value!r} is not a number; write e.g. {key}=2.") from None


def _typed(key: str, value: Any) -> Any:
    """``value`` as the workload field's type (a whole number where one is counted)."""
    kind = next(f.type for f in fields(RLWorkload) if f.name == key)
    if kind == "int" and not (isinstance(value, int) and not isinstance(value, bool)):
        raise MoescopeError(f"assumption {key}={value!r} counts something; give a whole number.")
    if kind == "bool" and not isinstance(value, bool):
        raise MoescopeError(f"assumption {key}={value!r} is true or false.")
    if kind == "float" and isinstance(value, bool):
        raise MoescopeError(f"assumption {key}={value!r} is not a number; give one.")
    return value
