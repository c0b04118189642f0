"""Accelerator profiles: the few numbers of a device that an RL step's time depends on.

The built-in profiles are vendors' published figures (dense bf16 peak, HBM capacity and
bandwidth, scale-up link per device, scale-out NIC per device). Latencies are one collective
call's fixed cost, order-of-magnitude figures for an all-to-all within a node (NVLink, HCCS) and
across nodes (InfiniBand, RoCE), not measurements. Every field can be overridden, and a profile
can come whole from a JSON file with the same keys.

=============  ======  ========  ======  ===========  ===========  =====  =========  =========
profile        memory  HBM       bf16    scale-up     scale-out    per    latency    latency
               GB      TB/s      TFLOPs  GB/s/device  GB/s/device  node   intra µs   inter µs
=============  ======  ========  ======  ===========  ===========  =====  =========  =========
h100           80      3.35      989     450          50           8      10         30
h200           141     4.8       989     450          50           8      10         30
h20            96      4.0       148     450          50           8      10         30
ascend-910b    64      1.6       313     196          25           8      15         50
=============  ======  ========  ======  ===========  ===========  =====  =========  =========

H100/H200 SXM and H20: NVLink 4 (900 GB/s both ways), a 400 Gb/s NIC per GPU. Ascend 910B (Atlas 800T
A2): HCCS full mesh (392 GB/s both ways), a 200 Gb/s RoCE port per NPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from moescope._util.io import read_json_object
from moescope.errors import MoescopeError


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator: memory, bandwidths, peak compute and what a node holds.

    Examples
    --------
    >>> p = device_profile("ascend-910b")
    >>> p.memory_gb, p.devices_per_node, device_profile("h100", inter_node_gb_s=25).inter_node_gb_s
    (64.0, 8, 25.0)
    """

    name: str
    memory_gb: float
    hbm_tb_s: float  # memory bandwidth, TB/s
    bf16_tflops: float  # dense peak
    intra_node_gb_s: float  # scale-up link, GB/s per device, one direction
    inter_node_gb_s: float  # scale-out network, GB/s per device, one direction
    devices_per_node: int
    intra_latency_us: float  # fixed cost of one collective call within a node
    inter_latency_us: float  # the same across nodes

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name != "name" and not (isinstance(value, int | float) and value > 0):
                raise MoescopeError(
                    f"device profile {self.name!r}: {field.name} is {value!r}; give a positive number."
                )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], name: str = "custom") -> DeviceProfile:
        """A profile from a mapping with every field (``name`` optional); a missing or unknown
        key is refused naming it."""
        wanted = [f.name for f in fields(cls) if f.name != "name"]
        unknown = sorted(set(data) - {*wanted, "name"})
        if unknown:
            raise MoescopeError(
                f"device profile {name!r} has unknown field(s) {', '.join(unknown)}; the fields are: "
                f"{', '.join(wanted)}."
            )
        missing = [key for key in wanted if data.get(key) is None]
        if missing:
            raise MoescopeError(
                f"device profile {name!r} lacks {', '.join(missing)}; give every field: {', '.join(wanted)}."
            )
        values = {key: _number(data[key], key, name) for key in wanted}
        values["devices_per_node"] = int(values["devices_per_node"])
        return cls(name=str(data.get("name") or name), **values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """One line: the figures the step time uses."""
        return (
            f"{self.name}: {self.memory_gb:g} GB at {self.hbm_tb_s:g} TB/s, "
            f"{self.bf16_tflops:g} bf16 TFLOPs, {self.devices_per_node} per node, "
            f"{self.intra_node_gb_s:g} GB/s within a node and "
            f"{self.inter_node_gb_s:g} GB/s across nodes per device, collective latency "
            f"{self.intra_latency_us:g}/{self.inter_latency_us:g} µs within/across nodes."
        )


def _number(value: Any, key: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MoescopeError(f"device profile {name!r}: {key} is {value!r}; give a positive number.")
    return float(value)


PROFILES: dict[str, DeviceProfile] = {
    "h100": DeviceProfile("h100", 80.0, 3.35, 989.0, 450.0, 50.0, 8, 10.0, 30.0),
    "h200": DeviceProfile("h200", 141.0, 4.8, 989.0, 450.0, 50.0, 8, 10.0, 30.0),
    "h20": DeviceProfile("h20", 96.0, 4.0, 148.0, 450.0, 50.0, 8, 10.0, 30.0),
    "ascend-910b": DeviceProfile("ascend-910b", 64.0, 1.6, 313.0, 196.0, 25.0, 8, 15.0, 50.0),
}


def device_profile(
    source: str | Path | DeviceProfile | Mapping[str, Any] = "h100", **overrides: Any
) -> DeviceProfile:
    """A built-in profile by name, a JSON file of one, a mapping or a profile; ``overrides`` replace
    single fields (``inter_node_gb_s=25``)."""
    if isinstance(source, DeviceProfile):
        profile = source
    elif isinstance(source, Mapping):
        profile = DeviceProfile.from_mapping(source)
    elif str(source).lower() in PROFILES:
        profile = PROFILES[str(source).lower()]
    elif str(source).endswith(".json") or Path(source).exists():
        path = Path(source).expanduser()
        fix = f"pass a JSON device profile or one of {_names()}"
        profile = DeviceProfile.from_mapping(read_json_object(path, fix), path.stem)
    else:
        raise MoescopeError(f"unknown device {source!r}; pass one of {_names()} or a JSON profile file.")
    if not overrides:
        return profile
    return DeviceProfile.from_mapping(profile.to_dict() | overrides, profile.name)


def _names() -> str:
    return ", ".join(PROFILES)
