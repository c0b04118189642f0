"""How long one RL step takes on a number of devices: a first-order model, every term printed.

A step of GRPO-style RL (verl, MindSpeed-RL, OpenRLHF with a colocated rollout engine) is
rollout generation, then training on the rollouts, then the optimizer update, then the new
weights sent to the rollout engine. Each term below is a bound from one resource; they add up
(nothing overlaps, which over-counts by at most the smaller of overlapping terms).

**Rollout** (``rollout_s``). The engine runs instances of ``I`` devices, ``I`` the smallest power
of two whose share of the engine's memory (``rollout_memory_fraction`` of each device, of which
the weights may take ``weight_share``) holds its share of the bf16 weights; ``D / I`` instances
split the ``prompts × samples`` sequences. How an instance splits the model is
``rollout_parallel``:

- ``"tp"`` (verl's ``rollout.tensor_model_parallel_size``, vLLM's default): every layer is
  split over the ``I`` devices, and two all-reduces per layer carry the hidden vectors of the
  tokens decoded (ring: ``2·(I − 1)/I`` of them per device, plus one latency per call). The KV
  cache splits by key-value head, so a model with fewer KV heads than ``I`` keeps copies: every
  rank holds ``⌈g/I⌉`` of the ``g`` heads, and an MLA model's single latent whole (vLLM's
  DeepSeek MLA cache has one head).
- ``"ep"`` (data-parallel attention with expert-parallel MoE, as SGLang and vLLM-Ascend serve
  DeepSeek): every device keeps the non-expert weights and its own sequences' whole KV cache,
  the routed experts spread over the instance, and each MoE layer runs two all-to-alls (dispatch
  and combine of ``k`` hidden vectors per token).

Communication uses the scale-up link within a node and the network once the instance spans
nodes. The cache holds as many sequences at once as fit at their final length (prompt plus the
mean response); the batch decodes until its longest response (``response_tokens``) is done,
and longer if the sequences it could not hold at once need more steps (continuous batching:
``sequences × mean response / sequences held`` steps). One decode step reads what the batch
touches — the non-expert weights, the experts its tokens pick (``E·(1 − (1 − k/E)^c)`` of them
per layer for ``c`` tokens) and the KV cache (at half the mean response) — at
``decode_bandwidth_efficiency`` of HBM bandwidth, or is bound by compute if that is longer.
Prefill is counted as training compute is.

**Training** (``training_s``): ``2 × active parameters × tokens × forward_passes`` FLOPs at
``mfu`` of the devices' peak; ``forward_passes`` counts forward-equivalents (policy forward 1
and backward 2, old-policy log-probs 1, reference log-probs 1). Tokens are ``sequences ×
(prompt_tokens + mean response)``, the mean response being ``mean_response_share`` of the
budget (1: every response at its budget, an upper bound).

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
shard. Over the network once the job spans nodes, plus ``sync_ms_per_tensor`` for each of the
model's weight tensors (:attr:`~moescope.export.cost.shape.ModelShape.weight_tensors`): verl
resharding tensor by tensor took 120 s for DeepSeek-V3.1 on 128 GPUs and 80 s on 256 (verl
issue 5311), 1.2–2.0 ms a tensor beyond the bytes at 50 GB/s; 0 for an engine that sends
weights in buckets.

What the model ignores: attention FLOPs, tensor-parallel all-reduces in training, overlap of
communication with compute, load imbalance between experts, kernel-launch and scheduling
overheads of the rollout engine, host offloading, checkpointing, the reward model or verifier.
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
_ENGINES = {"tp": "tensor parallel", "ep": "data-parallel attention, expert parallel"}
ROLLOUT_PARALLEL = tuple(_ENGINES)
_FRACTIONS = (
    "mfu",
    "decode_bandwidth_efficiency",
    "rollout_memory_fraction",
    "weight_share",
    "mean_response_share",
)


@dataclass(frozen=True)
class RLWorkload:
    """One RL step's batch and the efficiencies it runs at; every field overridable.

    Defaults: verl's GSM8K GRPO example (1,024 prompts, 5 samples each, 512 prompt and 1,024
    response tokens), 30 % model-FLOPs utilisation in training, decode at 60 % of HBM bandwidth,
    a tensor-parallel rollout engine.

    Examples
    --------
    >>> w = RLWorkload(prompts=256, mean_response_share=0.5)
    >>> w.sequences, w.mean_response_tokens, w.tokens
    (1280, 512, 1310720)
    """

    prompts: int = 1024
    samples_per_prompt: int = 5
    prompt_tokens: int = 512
    response_tokens: int = 1024
    mean_response_share: float = 1.0
    mfu: float = 0.3
    decode_bandwidth_efficiency: float = 0.6
    forward_passes: float = 5.0
    a2a_passes: float = 4.0
    micro_batches: int = 32
    rollout_memory_fraction: float = 0.6
    weight_share: float = 0.5
    rollout_parallel: str = "tp"
    optimizer_bytes_per_param: float = 26.0
    sync_full_model: bool = True
    sync_ms_per_tensor: float = 1.5

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type in ("bool", "str"):
                continue
            if not (value > 0 or (field.name == "sync_ms_per_tensor" and value == 0)):
                raise MoescopeError(f"workload {field.name} is {value!r}; give a positive number.")
        for key in _FRACTIONS:
            if getattr(self, key) > 1:
                raise MoescopeError(f"workload {key} is {getattr(self, key)}; it is a fraction, at most 1.")
        if self.rollout_parallel not in ROLLOUT_PARALLEL:
            raise MoescopeError(
                f"workload rollout_parallel is {self.rollout_parallel!r}; give 'tp' (tensor parallel) "
                "or 'ep' (data-parallel attention, expert-parallel experts)."
            )

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def mean_response_tokens(self) -> int:
        return max(1, round(self.response_tokens * self.mean_response_share))

    @property
    def tokens(self) -> int:
        """Tokens trained on per step: every sequence at the mean response length."""
        return self.sequences * (self.prompt_tokens + self.mean_response_tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        """One line: the batch and the efficiencies."""
        sync = "every device receives the whole model" if self.sync_full_model else "each device its shard"
        engine = _ENGINES[self.rollout_parallel]
        return (
            f"workload: {self.prompts} prompts × {self.samples_per_prompt} samples, "
            f"{self.prompt_tokens} prompt + {self.response_tokens} response tokens "
            f"(mean {self.mean_response_tokens}); training at "
            f"{self.mfu:.0%} MFU, {self.forward_passes:g} forward-equivalents, "
            f"{self.micro_batches} micro-batches; rollout engine {engine}, "
            f"{self.rollout_memory_fraction:.0%} of memory, weights ≤ {self.weight_share:.0%} of it, "
            f"decode at {self.decode_bandwidth_efficiency:.0%} of HBM bandwidth; "
            f"optimizer {self.optimizer_bytes_per_param:g} B/param; weight sync: {sync}, "
            f"{self.sync_ms_per_tensor:g} ms per tensor."
        )


@dataclass(frozen=True)
class StepTime:
    """One step's seconds by term (:data:`STEP_TERMS`) and the layout they were computed for."""

    devices: int
    nodes: int
    rollout_instance: int  # devices per rollout-engine instance
    concurrent_sequences: int  # per instance, what its KV cache holds at once
    decode_steps: int  # decode steps each instance runs
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
            f"{self.rollout_instance}, {self.concurrent_sequences} sequences at once, "
            f"{self.decode_steps:,} decode steps; EP {self.expert_parallel}, "
            f"{self.pipeline_stages} pipeline stage(s)"
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
    rollout = _rollout(shape, devices, p, w)
    flops = 2.0 * shape.params_active * w.tokens * w.forward_passes
    training = flops / _flops_per_s(devices, p, w)
    stages = max(1, min(nodes, shape.num_layers // 4))
    ep = min(shape.routed_experts, devices)
    return StepTime(
        devices=devices,
        nodes=nodes,
        rollout_instance=rollout.instance,
        concurrent_sequences=rollout.concurrent,
        decode_steps=rollout.steps,
        expert_parallel=ep,
        pipeline_stages=stages,
        rollout_s=rollout.seconds,
        training_s=training,
        all_to_all_s=_training_all_to_all(shape, devices, ep, p, w),
        bubble_s=training * (stages - 1) / w.micro_batches,
        optimizer_s=shape.params_total / devices * w.optimizer_bytes_per_param / (p.hbm_tb_s * 1e12),
        weight_sync_s=_weight_sync(shape, devices, rollout.weights_per_device, p, w),
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


def _all_reduce(tokens: float, shape: ModelShape, group: int, profile: DeviceProfile) -> float:
    """Seconds of one ring all-reduce of ``tokens`` hidden vectors over ``group`` devices."""
    if group <= 1:
        return 0.0
    bandwidth, latency = _link(profile, group)
    return latency + 2 * (group - 1) / group * tokens * shape.hidden_size * BF16 / bandwidth


@dataclass(frozen=True)
class _Rollout:
    instance: int
    weights_per_device: float  # bytes
    concurrent: int
    steps: int
    seconds: float


def _weight_bytes(shape: ModelShape) -> tuple[float, float]:
    """(routed experts, everything else) of the bf16 weights, in bytes."""
    return shape.params_routed * BF16, (shape.params_total - shape.params_routed) * BF16


def _engine_layout(shape: ModelShape, devices: int, p: DeviceProfile, w: RLWorkload) -> tuple[int, float]:
    """(devices per rollout-engine instance, bytes of weights each holds): the smallest power of
    two whose share of the engine's memory holds a device's part of the weights."""
    routed, rest = _weight_bytes(shape)
    room = p.memory_gb * 1e9 * w.rollout_memory_fraction * w.weight_share
    if w.rollout_parallel == "ep" and rest >= room:
        raise MoescopeError(
            f"{shape.name}'s non-expert weights ({rest / 1e9:,.0f} GB) do not fit the rollout engine's "
            f"share of one {p.name} ({room / 1e9:,.0f} GB), as data-parallel attention needs; use "
            "rollout_parallel=tp."
        )
    needed = (routed + rest) / room if w.rollout_parallel == "tp" else routed / (room - rest)
    instance = 1 << max(0, math.ceil(needed) - 1).bit_length()
    if instance > devices:
        raise MoescopeError(
            f"{shape.name}'s rollout engine needs {instance} devices of {p.name} for its bf16 weights "
            f"({(routed + rest) / 1e9:,.0f} GB), more than the {devices} given; give more devices."
        )
    return instance, (routed + rest) / instance if w.rollout_parallel == "tp" else rest + routed / instance


def _rollout(shape: ModelShape, devices: int, p: DeviceProfile, w: RLWorkload) -> _Rollout:
    """The rollout phase: instance size, sequences held at once, decode steps and seconds."""
    tp = w.rollout_parallel == "tp"
    instance, weights = _engine_layout(shape, devices, p, w)
    routed, rest = _weight_bytes(shape)
    engine = p.memory_gb * 1e9 * w.rollout_memory_fraction  # per device
    kv_token = shape.kv_per_token * BF16  # bytes per token, all layers
    if tp:
        kv_token *= math.ceil(shape.kv_heads / instance) / shape.kv_heads  # heads each rank keeps
    per_instance = math.ceil(w.sequences / (devices // instance))
    mean = w.mean_response_tokens
    held = int(max(0.0, engine - weights) // max(kv_token * (w.prompt_tokens + mean), 1))  # per device
    concurrent = max(1, min(per_instance, held * (1 if tp else instance)))
    steps = max(w.response_tokens, math.ceil(per_instance * mean / concurrent))
    e, k = shape.routed_experts, shape.top_k
    touched = routed * (1 - (1 - k / e) ** concurrent)
    sequences_here = concurrent if tp else concurrent / instance  # whose KV cache a device reads
    read = (rest + touched) / instance if tp else rest + touched / instance
    read += sequences_here * (w.prompt_tokens + mean / 2) * kv_token
    memory_bound = read / (p.hbm_tb_s * 1e12 * w.decode_bandwidth_efficiency)
    compute_bound = 2.0 * shape.params_active * concurrent / _flops_per_s(instance, p, w)
    if tp:
        comm = shape.num_layers * 2 * _all_reduce(concurrent, shape, instance, p)
    else:
        comm = shape.num_moe_layers * _all_to_all(concurrent / instance, shape, instance, p)
    decode = steps * (max(memory_bound, compute_bound) + comm)
    prefill = 2.0 * shape.params_active * w.sequences * w.prompt_tokens / _flops_per_s(devices, p, w)
    return _Rollout(instance, weights, concurrent, steps, decode + prefill)


def _training_all_to_all(shape: ModelShape, devices: int, ep: int, p: DeviceProfile, w: RLWorkload) -> float:
    per_micro_batch = w.tokens / devices / w.micro_batches
    layer = _all_to_all(per_micro_batch, shape, ep, p)
    return shape.num_moe_layers * w.micro_batches * w.a2a_passes * layer


def _weight_sync(shape: ModelShape, devices: int, shard: float, p: DeviceProfile, w: RLWorkload) -> float:
    received = shape.params_total * BF16 if w.sync_full_model else shard
    bandwidth, _ = _link(p, devices)
    return received / bandwidth + shape.weight_tensors * w.sync_ms_per_tensor * 1e-3
