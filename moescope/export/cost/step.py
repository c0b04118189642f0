"""How long one RL step takes on a number of devices: a first-order model, every term printed.

A step of GRPO-style RL (verl, MindSpeed-RL, OpenRLHF with a colocated rollout engine) is
rollout generation, then training on the rollouts, then the optimizer update, then the new
weights sent to the rollout engine. Each term below is a bound from one resource; they add up
(nothing overlaps, which over-counts by at most the smaller of overlapping terms).

**Rollout** (``rollout_s``). The engine runs instances of ``I`` devices, ``I`` the smallest power
of two whose share of the engine's memory (``rollout_memory_fraction`` of each device, of which
the weights may take ``weight_share``) holds the bf16 weights; ``D / I`` instances split the
``prompts × samples`` sequences, and each decodes as many at once as its KV cache holds
(more run in waves). One decode step of ``c`` sequences reads the backbone, the experts the
``c`` tokens touch (``E·(1 − (1 − k/E)^c)`` of them per layer) and the KV cache, at
``decode_bandwidth_efficiency`` of the instance's HBM bandwidth — or is bound by compute, if
that is longer — and, on an instance of several devices, runs two all-to-alls per MoE layer
(dispatch and combine of ``k`` hidden vectors per token) whose latency and bytes use the
scale-up link within a node and the network once the instance spans nodes. A batch decodes
``response_tokens`` steps: it waits for its longest response. Prefill is counted as training
compute is.

**Training** (``training_s``): ``2 × active parameters × tokens × forward_passes`` FLOPs at
``mfu`` of the devices' peak; ``forward_passes`` counts forward-equivalents (policy forward 1
and backward 2, old-policy log-probs 1, reference log-probs 1). Tokens are ``sequences ×
(prompt_tokens + response_tokens)``: every response at its budget, an upper bound.

**Expert-parallel all-to-all** (``all_to_all_s``): experts spread over ``EP = min(E, D)`` devices;
per MoE layer and pass each token's ``k`` hidden vectors go out and come back (``a2a_passes``:
policy forward and backward, old-policy and reference forwards), the remote share
``(EP − 1)/EP`` over the network once ``EP`` spans nodes, plus one latency per call and
micro-batch.

**Pipeline bubble** (``bubble_s``): one pipeline stage per node the job spans (tensor
parallel within a node, pipeline across nodes, as Megatron lays out a model), at most one per
four layers; a bubble of ``(stages − 1) / micro_batches`` of the training compute.

**Optimizer** (``optimizer_s``): Adam reads and writes fp32 master weights and two moments and
reads the gradients: ``optimizer_bytes_per_param`` per parameter a device holds, at HBM speed.

**Weight sync** (``weight_sync_s``): the bf16 weights go to the rollout engine. With
``sync_full_model`` (verl's Megatron path gathers each tensor whole on every rank before the
engine loads its shard) every device receives all of them; otherwise only its instance's
shard. Over the network once the job spans nodes.

What the model ignores: attention FLOPs and tensor-parallel all-reduces, overlap of
communication with compute, load imbalance between experts, rollout long tails beyond the
response budget, host offloading, checkpointing, the reward model or verifier.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from moescope.errors import MoescopeError
from moescope.export.cost.profiles import DeviceProfile
from moescope.export.cost.shape import ModelShape

BF16 = 2  # bytes per weight, activation and KV entry
STEP_TERMS = ("rollout_s", "training_s", "all_to_all_s", "bubble_s", "optimizer_s", "weight_sync_s")


@dataclass(frozen=True)
class RLWorkload:
    """One RL step's batch and the efficiencies it runs at; every field overridable.

    Defaults: verl's GSM8K GRPO example (1,024 prompts, 5 samples each, 512 prompt and 1,024
    response tokens), 30 % model-FLOPs utilisation in training, decode at 60 % of HBM bandwidth.

    Examples
    --------
    >>> w = RLWorkload(prompts=256)
    >>> w.sequences, w.tokens
    (1280, 1966080)
    """

    prompts: int = 1024
    samples_per_prompt: int = 5
    prompt_tokens: int = 512
    response_tokens: int = 1024
    mfu: float = 0.3
    decode_bandwidth_efficiency: float = 0.6
    forward_passes: float = 5.0
    a2a_passes: float = 4.0
    micro_batches: int = 32
    rollout_memory_fraction: float = 0.6
    weight_share: float = 0.5
    optimizer_bytes_per_param: float = 26.0
    sync_full_model: bool = True

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type != "bool" and not value > 0:
                raise MoescopeError(f"workload {field.name} is {value!r}; give a positive number.")
        for key in ("mfu", "decode_bandwidth_efficiency", "rollout_memory_fraction", "weight_share"):
            if getattr(self, key) > 1:
                raise MoescopeError(f"workload {key} is {getattr(self, key)}; it is a fraction, at most 1.")

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def tokens(self) -> int:
        """Tokens trained on per step (every response at its budget)."""
        return self.sequences * (self.prompt_tokens + self.response_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """One line: the batch and the efficiencies."""
        sync = "every device receives the whole model" if self.sync_full_model else "each device its shard"
        return (
            f"workload: {self.prompts} prompts × {self.samples_per_prompt} samples, "
            f"{self.prompt_tokens} prompt + {self.response_tokens} response tokens; training at "
            f"{self.mfu:.0%} MFU, {self.forward_passes:g} forward-equivalents, "
            f"{self.micro_batches} micro-batches; decode at "
            f"{self.decode_bandwidth_efficiency:.0%} of HBM bandwidth; rollout engine "
            f"{self.rollout_memory_fraction:.0%} of memory, weights ≤ {self.weight_share:.0%} of it; "
            f"optimizer {self.optimizer_bytes_per_param:g} B/param; weight sync: {sync}."
        )


@dataclass(frozen=True)
class StepTime:
    """One step's seconds by term (:data:`STEP_TERMS`) and the layout they were computed for."""

    devices: int
    nodes: int
    rollout_instance: int  # devices per rollout-engine instance
    concurrent_sequences: int  # per instance, what its KV cache holds at once
    waves: int  # batches each instance decodes one after another
    expert_parallel: int
    pipeline_stages: int
    rollout_s: float
    training_s: float
    all_to_all_s: float
    bubble_s: float
    optimizer_s: float
    weight_sync_s: float

    @property
    def total_s(self) -> float:
        return sum(getattr(self, term) for term in STEP_TERMS)

    def terms(self) -> dict[str, float]:
        return {term: getattr(self, term) for term in STEP_TERMS}

    def layout(self) -> str:
        """One line: how the devices were laid out."""
        return (
            f"{self.devices} devices on {self.nodes} node(s); rollout instances of "
            f"{self.rollout_instance}, {self.concurrent_sequences} sequences at once × {self.waves} "
            f"wave(s); EP {self.expert_parallel}, {self.pipeline_stages} pipeline stage(s)"
        )


def step_time(
    shape: ModelShape, devices: int, profile: DeviceProfile, workload: RLWorkload | None = None
) -> StepTime:
    """Seconds of one RL step of ``shape`` on ``devices`` of ``profile`` (see the module docstring).

    Examples
    --------
    >>> from moescope.export.cost.profiles import device_profile
    >>> from moescope.export.cost.shape import reference_models
    >>> qwen = reference_models()[3]  # Qwen3-30B-A3B
    >>> t = step_time(qwen, 16, device_profile("h100"))
    >>> t.rollout_instance, t.expert_parallel, t.pipeline_stages
    (4, 16, 2)
    """
    w = workload or RLWorkload()
    p = profile
    if devices < 1:
        raise MoescopeError(f"{devices} devices; give a positive count.")
    nodes = math.ceil(devices / p.devices_per_node)
    instance, concurrent, waves, rollout = _rollout(shape, devices, p, w)
    flops = 2.0 * shape.params_active * w.tokens * w.forward_passes
    training = flops / _flops_per_s(devices, p, w)
    stages = max(1, min(nodes, shape.num_layers // 4))
    ep = min(shape.routed_experts, devices)
    return StepTime(
        devices=devices,
        nodes=nodes,
        rollout_instance=instance,
        concurrent_sequences=concurrent,
        waves=waves,
        expert_parallel=ep,
        pipeline_stages=stages,
        rollout_s=rollout,
        training_s=training,
        all_to_all_s=_training_all_to_all(shape, devices, ep, p, w),
        bubble_s=training * (stages - 1) / w.micro_batches,
        optimizer_s=shape.params_total / devices * w.optimizer_bytes_per_param / (p.hbm_tb_s * 1e12),
        weight_sync_s=_weight_sync(shape, devices, instance, p, w),
    )


def _flops_per_s(devices: int, profile: DeviceProfile, workload: RLWorkload) -> float:
    """What ``devices`` compute per second at the workload's utilisation."""
    return devices * profile.bf16_tflops * 1e12 * workload.mfu


def _link(profile: DeviceProfile, group: int) -> tuple[float, float]:
    """(bytes/s, seconds per call) of a collective over ``group`` devices: the scale-up link
    within a node, the network once the group spans nodes."""
    if group <= profile.devices_per_node:
        return profile.intra_node_gb_s * 1e9, profile.intra_latency_us * 1e-6
    return profile.inter_node_gb_s * 1e9, profile.inter_latency_us * 1e-6


def _all_to_all(tokens: float, shape: ModelShape, group: int, profile: DeviceProfile) -> float:
    """Seconds of one MoE layer's dispatch and combine of ``tokens`` per device over ``group``."""
    if group <= 1:
        return 0.0
    bandwidth, latency = _link(profile, group)
    remote = tokens * shape.top_k * shape.hidden_size * BF16 * (group - 1) / group
    return 2 * (latency + remote / bandwidth)


def _rollout(shape: ModelShape, devices: int, p: DeviceProfile, w: RLWorkload) -> tuple[int, int, int, float]:
    """(instance devices, sequences decoded at once, waves, seconds) of the rollout phase."""
    weights = shape.params_total * BF16
    engine = p.memory_gb * 1e9 * w.rollout_memory_fraction  # per device
    instance = 1 << max(0, math.ceil(weights / (engine * w.weight_share)) - 1).bit_length()
    if instance > devices:
        raise MoescopeError(
            f"{shape.name}'s rollout engine needs {instance} devices of {p.name} for its bf16 weights "
            f"({weights / 1e9:,.0f} GB), more than the {devices} given; give more devices."
        )
    per_instance = math.ceil(w.sequences / (devices // instance))
    kv_per_sequence = (w.prompt_tokens + w.response_tokens) * shape.kv_per_token * BF16
    room = max(0.0, instance * engine - weights)
    concurrent = max(1, min(per_instance, int(room // max(kv_per_sequence, 1))))
    waves = math.ceil(per_instance / concurrent)
    e, k = shape.routed_experts, shape.top_k
    touched = e * (1 - (1 - k / e) ** concurrent)
    read = (shape.params_total - shape.params_routed * (1 - touched / e)) * BF16
    context = w.prompt_tokens + w.response_tokens / 2
    read += concurrent * context * shape.kv_per_token * BF16
    memory_bound = read / (instance * p.hbm_tb_s * 1e12 * w.decode_bandwidth_efficiency)
    compute_bound = 2.0 * shape.params_active * concurrent / _flops_per_s(instance, p, w)
    comm = shape.num_moe_layers * _all_to_all(concurrent / instance, shape, instance, p)
    decode = waves * w.response_tokens * (max(memory_bound, compute_bound) + comm)
    prefill = 2.0 * shape.params_active * w.sequences * w.prompt_tokens / _flops_per_s(devices, p, w)
    return instance, concurrent, waves, decode + prefill


def _training_all_to_all(shape: ModelShape, devices: int, ep: int, p: DeviceProfile, w: RLWorkload) -> float:
    per_micro_batch = w.tokens / devices / w.micro_batches
    layer = _all_to_all(per_micro_batch, shape, ep, p)
    return shape.num_moe_layers * w.micro_batches * w.a2a_passes * layer


def _weight_sync(shape: ModelShape, devices: int, instance: int, p: DeviceProfile, w: RLWorkload) -> float:
    received = shape.params_total * BF16 / (1 if w.sync_full_model else instance)
    bandwidth, _ = _link(p, devices)
    return received / bandwidth
