"""Where an export finds the original: loaded whole, or one decoder layer at a time.

Every step of an export reads the original through calls a transformers model answers whatever
holds its weights: forward passes with hooks (routing statistics, the teacher's distributions,
fidelity), ``generate`` (own completions, task accuracy), a backward pass (Taylor scores), one
layer's weights outside a forward (the weight views, the checklist). So the export runs one plan,
and a *gatherer* decides only where the original's weights live:

- **in memory**: the model loaded whole, as ``from_pretrained`` loads it; a proxy is cut from it
  in memory (:func:`~moescope.export.surgery.build_proxy`).
- **layer-sequential**: the model of :func:`~moescope.explore.sequential.layer_sequential`, whose
  decoder layers are read from the shards while they run, one resident at a time; a proxy is cut
  from the shards (:func:`~moescope.export.streaming.export.write_selected`) into a scratch
  directory, the same tensors ``build_proxy`` would copy, and loaded whole or, where it does not
  fit, read from there a decoder layer at a time too (:func:`proxy_fits`).

Either runs on the device and in the dtype of a :class:`~moescope.models.device.Compute`
(the CPU and the checkpoint's own dtype unless told): over several GPUs the in-memory original
is placed by accelerate.

The layer-sequential gatherer runs when the export is told to stream, or when the in-memory
export's peak (the original, plus a proxy) would not fit the memory budget: ``max_memory`` (as
accelerate's ``max_memory``: what the weights may take), else the memory available now. A
layer-sequential original runs each layer over a forward's rows in chunks whose activations are
sized within ``max_memory`` (less what a proxy held beside it takes): each layer is read once per
forward (:mod:`moescope.models.row_chunks`).

A proxy only measured (the held-out KL, the checklist, task accuracy, ``auto``'s candidates) is
loaded whole where it leaves the budget room for the original's largest layer twice over (the
layer, and as much for a chunk's activations): its forwards then read nothing. Otherwise it is
read a decoder layer at a time from its cut, by the same machinery (the same chunks, its LM head
run apart, its reads counted apart from the original's), and every measurement runs on that
model; its scratch directory lives until the export is done with it. A proxy healed (healing
trains it whole) is loaded whole, so it must fit the budget itself, and is refused in one
sentence where it does not. The proxy written is the same tensors either way.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.memory import available_memory, format_size
from moescope.errors import MoescopeError
from moescope.models.device import ON_CPU, Compute

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.explore.selection import Selection

IN_MEMORY, LAYER_SEQUENTIAL = "in memory", "layer-sequential"


def parse_size(size: int | str | None, what: str = "max_memory") -> int | None:
    """Bytes of a size given as bytes or as accelerate writes them (``"4MB"``, ``"24GiB"``), a
    fraction of a unit too (``"1.5GB"``, which accelerate's parser refuses).

    Example
    -------
    >>> parse_size("4MB"), parse_size("1.5GB"), parse_size("4000000"), parse_size(None)
    (4000000, 1500000000, 4000000, None)
    """
    if size is None:
        return None
    try:
        digits = isinstance(size, str) and size.strip().isdigit()  # bytes, as the flag's text gives them
        value = int(size) if digits else _unit_size(size)
    except (ValueError, TypeError):
        value = 0
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MoescopeError(f"{what}={size!r} is not a size; give bytes or a size such as '24GB' or '4MB'.")
    return value


def _unit_size(size: int | str) -> int:
    """``size`` with a unit, its number a whole one or not, the unit read as transformers reads it."""
    from transformers.utils.hub import convert_file_size_to_int

    if not isinstance(size, str):
        return convert_file_size_to_int(size)
    number = re.match(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*", size)
    if number is None or not size[number.end() :].strip():
        raise ValueError(size)
    return round(float(number.group(1)) * convert_file_size_to_int("1" + size[number.end() :].strip()))


@dataclass(frozen=True)
class Placement:
    """Which gatherer an export runs, and why, in words the console prints; ``budget`` is
    ``max_memory`` in bytes (``None``: not given), ``proxy`` a lower bound of the proxy's weights
    (the kept share of the original's), known before anything loads; ``compute`` the device and
    dtype the original and its proxies run on."""

    mode: str
    why: str
    budget: int | None
    proxy: int = 0
    compute: Compute = ON_CPU

    @property
    def sequential(self) -> bool:
        return self.mode == LAYER_SEQUENTIAL

    def record(self, original: PreTrainedModel) -> dict[str, Any]:
        """The manifest's ``"original"``: where it was read and why, the device it ran on and its
        dtype (``original``'s own: the checkpoint's where none was asked for), and why those."""
        dtype = str(original.dtype).removeprefix("torch.")
        return {"read": self.mode, "why": self.why, **self.compute.to_dict(), "dtype": dtype}


def choose_placement(
    weights: int,
    keep_ratio: float,
    *,
    streaming: bool | None,
    max_memory: int | None,
    available: int | None = None,
    devices: int = 1,
) -> Placement:
    """The gatherer for an original of ``weights`` bytes whose proxy keeps ``keep_ratio`` of it at
    most: layer-sequential when told (``streaming``), or when the in-memory peak (the original
    plus one proxy) exceeds ``max_memory`` on each of ``devices`` (default: ``available``, the
    memory the compute device has free, else the memory available now).

    Example
    -------
    >>> choose_placement(7_500_000, 0.5, streaming=None, max_memory=4_000_000).mode
    'layer-sequential'
    """
    proxy = int(weights * keep_ratio)
    if streaming is False:
        return Placement(IN_MEMORY, "asked for (no streaming)", max_memory, proxy)
    if streaming:
        return Placement(LAYER_SEQUENTIAL, "asked for (streaming)", max_memory, proxy)
    peak = weights + proxy
    if max_memory is not None:
        budget, named = max_memory * devices, "--max-memory" + (f" × {devices} GPUs" if devices > 1 else "")
    elif available is not None:
        budget, named = available, "the GPU memory free"
    else:
        budget, named = available_memory(), "the memory available"
    if peak > budget:
        why = f"the original and a proxy ({format_size(peak)}) exceed {named} ({format_size(budget)})"
        return Placement(LAYER_SEQUENTIAL, why, max_memory, proxy)
    why = f"the original and a proxy ({format_size(peak)}) fit {named} ({format_size(budget)})"
    return Placement(IN_MEMORY, why, max_memory, proxy)


def check_budget(placement: Placement, *, heals_proxy: bool, layer: int | None = None) -> None:
    """Refuse, in one sentence and before any pass, a budget that cannot hold what the export
    must hold: one decoder layer of the original (``layer`` bytes), and, where the proxy is
    healed (``heals_proxy``: training holds it whole), the proxy whole. A proxy only measured
    is read a layer at a time where it does not fit (:func:`proxy_fits`)."""
    budget = placement.budget
    if budget is None:
        if heals_proxy and placement.sequential and placement.proxy > available_memory():
            raise _proxy_too_large(
                f"about {format_size(placement.proxy)}", "the memory available", available_memory()
            )
        return
    if layer is not None and layer > budget:
        raise MoescopeError(
            f"one decoder layer of the original ({format_size(layer)}) does not fit --max-memory "
            f"({format_size(budget)}), and the layer-sequential pass holds one; raise --max-memory."
        )
    if heals_proxy and placement.proxy > budget:
        raise _proxy_too_large(f"about {format_size(placement.proxy)}", "--max-memory", budget)


def placement_for(
    model: str | Path,
    keep: Any = None,
    selection: Selection | str | Path | None = None,
    streaming: bool | None = None,
    max_memory: int | str | None = None,
    compute: Compute | None = None,
) -> Placement:
    """:func:`choose_placement` for a checkpoint: its weights on disk, the kept share as far as
    it can be told before anything loads (1 when it cannot), against the memory of ``compute``'s
    device (the GPUs' free memory; on the CPU, or without ``compute``, the memory available)."""
    from moescope.models.device import device_memory, gpu_count
    from moescope.models.loading import resolve_model, weight_files

    budget = parse_size(max_memory)
    source = resolve_model(model)
    weights = sum(file.stat().st_size for file in weight_files(source))
    ratio = keep_ratio(source, keep, selection)
    available = device_memory(compute) if compute is not None else None
    devices = gpu_count() if compute is not None and compute.spread else 1
    options = {"available": available, "devices": devices}
    placement = choose_placement(weights, ratio, streaming=streaming, max_memory=budget, **options)
    return replace(placement, compute=compute or ON_CPU)


def needs_streaming(
    model: str | Path, *, keep: Any = None, selection: Selection | str | Path | None = None
) -> bool:
    """Whether the in-memory export would not fit: its peak (the model, plus the proxy it
    builds) against the memory available now."""
    return placement_for(model, keep, selection).sequential


def keep_ratio(source: Path, keep: Any, selection: Selection | str | Path | None) -> float:
    """The kept share of the experts, as far as it can be told cheaply (1 when it cannot;
    ``keep="auto"`` tries at most half)."""
    from moescope.explore.selection import Selection
    from moescope.keep import Keep
    from moescope.models.loading import load_config
    from moescope.models.support import language_config, spec_for

    if selection is not None:
        return (selection if isinstance(selection, Selection) else Selection.load(selection)).keep_ratio
    if keep is None:
        return 1.0
    if isinstance(keep, Keep):  # parsed against the model's routing already
        return keep.ratio
    config = language_config(load_config(source))
    experts = spec_for(config).num_experts(config)
    try:
        return Keep.parse(keep, experts, 0, allow_top_k=True, allow_auto=True).ratio
    except MoescopeError:
        return 1.0  # the export itself says what is wrong with keep


@dataclass
class Gathered:
    """The original as the export reads it, and how a proxy of it is made.

    ``original`` is a transformers model (resident, or read a layer at a time);
    ``cut(selection)`` returns the proxy of that selection: loaded whole, or, cut from a
    layer-sequential original's shards and too large to sit beside it within the budget, read a
    decoder layer at a time from the cut (:func:`proxy_fits`). ``heals``: whether the export
    heals the proxies it cuts (set before the first cut; healing trains a proxy whole);
    ``targets``: whether it heals them only if measured short of a capability target, so that a
    proxy too large to be trained is measured all the same, and refused only when it falls short
    (:func:`~moescope.export.healing.check_trainable`). ``proxy_read`` says how the last proxy
    cut was read, and why (empty for a proxy built in memory).
    """

    original: PreTrainedModel
    tokenizer: Any
    placement: Placement
    cut: Callable[[Selection], PreTrainedModel]
    heals: bool = False
    targets: bool = False
    proxy_read: dict[str, str] = field(default_factory=dict)


@contextmanager
def gather(model: str | Path, source: Path, placement: Placement, *, out: Path) -> Iterator[Gathered]:
    """The original of ``model`` placed as ``placement`` says (on its ``compute``'s device and in
    its dtype), for the ``with`` block.

    ``out`` is the proxy's directory: a layer-sequential cut is written beside it (on the disk
    that will hold the proxy), then loaded whole and removed, or, where it does not fit, read a
    layer at a time from there and removed when the block ends. Over several GPUs the original
    in memory is placed by accelerate (``max_memory`` each) and its proxies live on the first; a
    layer-sequential original runs each layer on the first. An original in memory runs its own
    forward once first, so a checkpoint whose forward raises is one sentence.
    """
    from moescope.models.loading import load_model, load_tokenizer, probe_forward

    compute = placement.compute
    dtype = compute.torch_dtype()
    if not placement.sequential:
        from moescope.export.surgery import build_proxy

        lm, tokenizer = load_model(model, dtype=dtype, **compute.load_options(placement.budget))
        probe_forward(lm, source, f"{compute.device} in {compute.dtype}")
        move = (lambda proxy: proxy.to(compute.main_device)) if compute.spread else (lambda proxy: proxy)
        yield Gathered(lm, tokenizer, placement, lambda selection: move(build_proxy(lm, selection)))
        return

    from moescope.explore.sequential import largest_layer_bytes, layer_sequential

    with (
        ExitStack() as opened,
        layer_sequential(source, dtype=dtype, device=compute.main_device, available=placement.budget) as lm,
    ):
        check_budget(placement, heals_proxy=False, layer=largest_layer_bytes(lm))
        got = Gathered(lm, load_tokenizer(source), placement, lambda _: lm)
        got.cut = _shard_cutter(source, out, compute, opened, got)
        yield got


def proxy_fits(proxy: int, layer: int, budget: int, *, trained: bool = False) -> bool:
    """Whether a proxy of ``proxy`` bytes is loaded whole beside a layer-sequential original whose
    largest decoder layer takes ``layer`` bytes: where it leaves ``budget`` room for that layer
    and as much again for a chunk's activations (its forwards then read nothing), or, where it
    is ``trained`` (healing holds it whole), where it fits ``budget`` itself. Otherwise it is
    read a decoder layer at a time from its cut shards, as the original is, or, to be trained,
    refused.

    Example
    -------
    >>> proxy_fits(1_000, 300, 1_600), proxy_fits(1_000, 300, 1_599)
    (True, False)
    >>> proxy_fits(1_000, 300, 1_000, trained=True)
    True
    """
    return proxy <= budget if trained else proxy + 2 * layer <= budget


def _shard_cutter(
    source: Path, out: Path, compute: Compute, opened: ExitStack, got: Gathered
) -> Callable[[Selection], PreTrainedModel]:
    """``selection → proxy``: cut from ``source``'s shards into a scratch directory beside ``out``,
    then loaded whole on ``compute``'s device where it fits beside ``got.original``'s largest
    layer within the budget (``--max-memory``, else the memory available now;
    :func:`proxy_fits`, ``got.heals``: within the budget alone, or refused), the scratch removed
    at once; else read from the scratch a layer at a time, the scratch kept until ``opened``
    closes. The original's passes then share the budget with what the proxy holds: they are
    sized within what it leaves. ``got.proxy_read`` is told how the proxy was read, and why."""
    from moescope.explore.sequential import largest_layer_bytes, layer_sequential
    from moescope.export.healing import UNTRAINABLE
    from moescope.export.streaming.export import write_selected
    from moescope.models.loading import load_model, weight_files

    placed = {} if compute.device == "cpu" else {"device_map": compute.main_device}
    budget, layer = got.placement.budget, largest_layer_bytes(got.original)

    def cut(selection: Selection) -> PreTrainedModel:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{Path(out).name}.cut-", dir=Path(out).parent))
        opened.callback(shutil.rmtree, scratch, ignore_errors=True)  # after a proxy reading it closes
        write_selected(source, scratch, selection, progress=False)
        size = sum(f.stat().st_size for f in weight_files(scratch))
        limit, named = (budget, "--max-memory") if budget else (available_memory(), "the memory available")
        if got.heals and size > limit:
            raise _proxy_too_large(format_size(size), named, limit)
        trained = got.heals or (got.targets and size <= limit)  # loaded whole to be trained
        held = f"the proxy ({format_size(size)})"
        if not trained:
            held += f" and the original's layer twice ({format_size(2 * layer)})"
        if proxy_fits(size, layer, limit, trained=trained):
            proxy, _ = load_model(scratch, dtype=compute.torch_dtype(), with_tokenizer=False, **placed)
            shutil.rmtree(scratch, ignore_errors=True)
            got.proxy_read.update(read=IN_MEMORY, why=f"{held} fit {named} ({format_size(limit)})")
        else:
            sequential = layer_sequential(
                scratch, dtype=compute.torch_dtype(), device=compute.main_device, available=budget
            )
            proxy = opened.enter_context(sequential)
            got.proxy_read.update(read=LAYER_SEQUENTIAL, why=f"{held} exceed {named} ({format_size(limit)})")
        if got.targets and not trained:  # measured as it is; healing it would load it whole
            setattr(proxy, UNTRAINABLE, _proxy_too_large(format_size(size), named, limit))
        if budget is not None:
            got.original._pass_memory = budget - resident_bytes(proxy)
        return proxy

    return cut


def resident_bytes(model: PreTrainedModel) -> int:
    """Bytes of ``model``'s weights and buffers in memory (a layer-sequential model's decoder
    layers, on the meta device, hold none)."""
    tensors = model.state_dict().values()
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")


def _proxy_too_large(size: str, limit: str, budget: int) -> MoescopeError:
    """The one refusal of a proxy that must be loaded whole to be healed and does not fit."""
    fix = "raise --max-memory, keep" if limit == "--max-memory" else "keep"
    return MoescopeError(
        f"the proxy ({size}) does not fit {limit} ({format_size(budget)}), and healing it loads it whole; "
        f"{fix} fewer experts, or cut it without healing (--heal-steps 0 --min-capability 0) and heal it "
        "sharded (`torchrun --nproc-per-node N -m moescope heal OUT --shard fsdp`)."
    )
