"""The hooks behind :func:`moescope.explore.routing.observe_routing`: which tensors are read, and when.

Per MoE layer, a forward hook on the router reads the model's own choice (logits and top-k
index); a pre-hook on the MoE block reads its input (the hidden states whose gate-weighted sums
per expert are the routed context); a pre-hook on the experts module reads the gate weights it
applies; a pass-through ``post_expert_norm`` installed on transformers' fused experts reads the
per-slot expert outputs they compute anyway. A pre-hook on the decoder stack reads the padding
from the attention mask, and its forward hook folds the pass into
:class:`~moescope.explore.routing_sums.RoutingSums`.
Until then a pass holds, per layer, its routed-context sums ``(E, H)`` in float32 (not the
hidden states), so a pass that fails half-way adds nothing. A layer-sequential model's layers
may run a forward's rows in chunks (:mod:`moescope.models.row_chunks`), each on its rows' real
positions alone (:func:`~moescope.models.row_chunks.trailing_padding`): the hooks then fire once
per chunk, read the padding of the chunk's rows, and the chunks are joined into one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from moescope.explore.routing_sums import (
    SLOT_ORDER,
    RoutingSums,
    recomputed_norms,
    routed_context,
    slot_norms,
)
from moescope.explore.stats import RoutingStats
from moescope.models.resident import execution_device
from moescope.models.row_chunks import chunk_width, row_offset
from moescope.models.view import decoder_model
from moescope.provenance import config_hash

if TYPE_CHECKING:  # pragma: no cover
    from moescope.models.view import MoELayer, MoEModel


@dataclass
class _Pending:
    """One layer's routing in the forward pass under way, until the pass ends."""

    logits: torch.Tensor  # (T, E) raw router logits
    index: torch.Tensor  # (T, k) chosen experts
    saliency: torch.Tensor | None = None  # (T, k) gate weight × ‖expert output‖ per slot
    context: tuple[torch.Tensor, torch.Tensor] | None = None  # (E, H), (E,): see routed_context
    width: int = 0  # positions per row, where a chunk ran on fewer than its forward's (0: all)

    @staticmethod
    def joined(parts: list[_Pending], width: int) -> _Pending:
        """One layer's routing of a forward whose rows ran in chunks, in row order, each chunk
        cut to its rows' real positions padded back to the forward's ``width`` (the padding's
        routing is zeros, left out by the forward's attention mask)."""
        parts = [part.padded(width) for part in parts]
        if len(parts) == 1:
            return parts[0]
        saliency = None if any(p.saliency is None for p in parts) else torch.cat([p.saliency for p in parts])
        contexts = [p.context for p in parts if p.context is not None]
        context = tuple(sum(c[i] for c in contexts) for i in range(2)) if contexts else None
        return _Pending(
            torch.cat([p.logits for p in parts]), torch.cat([p.index for p in parts]), saliency, context
        )

    def padded(self, width: int) -> _Pending:
        """This chunk's routing at ``width`` positions a row, zeros after its rows' real positions
        (:func:`~moescope.models.row_chunks.trailing_padding`)."""
        if not self.width or self.width == width or not width:
            return self

        def pad(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            rows = t.reshape(-1, self.width, t.shape[-1])
            return torch.nn.functional.pad(rows, (0, 0, 0, width - self.width)).reshape(-1, t.shape[-1])

        return _Pending(pad(self.logits), pad(self.index), pad(self.saliency), self.context)


class RoutingObserver:
    """Running routing sums of every forward pass while :func:`observe_routing` is active.

    Router hooks queue each layer's routing for the pass under way; the queue is folded into the
    sums when the next layer starts and when the pass ends, so a pass holds one layer's routing of
    its tokens (every layer's, held to the end, grew a layer-sequential pass over its rows).
    ``saliency_source`` says per decoder layer whether expert-output norms were ``"captured"``
    from the forward or ``"recomputed"`` on the routed tokens (in the last pass).
    """

    def __init__(self, moe: MoEModel) -> None:
        self.moe = moe
        self.saliency_source: dict[int, str] = {}
        self._rows = {layer.index: row for row, layer in enumerate(moe.layers)}
        self._handles: list[Any] = []
        self._tapped: list[torch.nn.Module] = []
        self._pending: dict[int, _Pending] = {}
        self._chunks: dict[int, list[_Pending]] = {}  # earlier chunks of the pass under way, per layer
        self._width = 0  # positions per row of the pass under way
        self._experts_in: dict[int, tuple[torch.Tensor, ...]] = {}
        self._block_in: dict[int, torch.Tensor] = {}
        self._norms: dict[int, tuple[str, torch.Tensor]] = {}
        self._valid: torch.Tensor | None = None
        self.reset()

    def reset(self) -> None:
        """Start the sums again from zero (e.g. once per RL step)."""
        device = execution_device(self.moe.model)
        sigmoid = self.moe.rule.scoring == "sigmoid"
        hidden = self.moe.layers[0].router_weight.shape[1]  # the router reads the block's input
        self._sums = RoutingSums(len(self.moe.layers), self.moe.num_experts, device, sigmoid, hidden)
        self._pending.clear()

    @property
    def n_tokens(self) -> int:
        """Tokens through the model so far (a looped layer routes some of them more than once)."""
        self._flush()
        return int(self._sums.tokens.min())

    def stats(self, source: str = "") -> RoutingStats:
        """The sums so far as :class:`~moescope.explore.stats.RoutingStats`; ``source`` names the data."""
        self._flush()
        tokens = self._sums.tokens.tolist()
        n_tokens = min(tokens)  # a looped layer routes every token once per pass
        whole_passes = all(t % n_tokens == 0 for t in tokens) if n_tokens else not any(tokens)
        if not whole_passes:
            counts = sorted(set(tokens))
            raise RuntimeError(f"MoE layers saw token counts {counts}, not whole passes of one count")
        return RoutingStats(
            model_type=self.moe.spec.model_type,
            config_hash=config_hash(self.moe.config),
            source=source,
            layers=tuple(self._rows),
            num_experts=self.moe.num_experts,
            top_k=self.moe.top_k,
            n_tokens=n_tokens,
            **self._sums.arrays(),
            passes=np.array([t // n_tokens if n_tokens else 1 for t in tokens], dtype=np.int64),
        )

    # --- installing and removing ---------------------------------------------------------------

    def _install(self) -> None:
        stack = decoder_model(self.moe.model)
        self._handles.append(stack.register_forward_pre_hook(self._on_start, with_kwargs=True))
        self._handles.append(stack.register_forward_hook(self._on_end))
        for layer in self.moe.layers:
            self._handles.append(layer.router.register_forward_hook(self._router_hook(layer)))
            if layer.spec.combine == "output":  # Llama 4's dense experts are not hooked (module doc)
                self._hook_experts(layer)

    def _hook_experts(self, layer: MoELayer) -> None:
        block_hook = self._block_pre_hook(layer.index)
        self._handles.append(layer.block.register_forward_pre_hook(block_hook, with_kwargs=True))
        experts, pre_hook = layer.experts, self._experts_pre_hook(layer.index)
        self._handles.append(experts.register_forward_pre_hook(pre_hook, with_kwargs=True))
        self._handles.append(experts.register_forward_hook(self._experts_hook(layer)))
        fused = getattr(experts, "has_post_expert_norm", None) is False  # transformers' fused experts
        if fused and not hasattr(experts, "post_expert_norm"):
            experts.post_expert_norm, experts.has_post_expert_norm = self._tap(layer), True
            self._tapped.append(experts)

    def _tap(self, layer: MoELayer) -> Any:
        """A pass-through ``post_expert_norm`` that reads the per-slot expert outputs' norms."""
        config = layer.experts.config

        def tap(out: torch.Tensor) -> torch.Tensor:
            impl = getattr(config, "_experts_implementation", None)
            if impl in SLOT_ORDER:
                norms = torch.linalg.vector_norm(out.detach(), dim=-1, dtype=torch.float32)  # (S,)
                self._norms[layer.index] = (impl, norms)
            return out  # the very same tensor: the model's output is unchanged

        return tap

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        for experts in self._tapped:
            del experts.post_expert_norm
            experts.has_post_expert_norm = False
        self._handles, self._tapped = [], []
        self._experts_in.clear()
        self._block_in.clear()
        self._norms.clear()

    # --- hooks -------------------------------------------------------------------------------

    def _on_start(self, module: Any, args: tuple, kwargs: dict) -> None:
        """Forget a pass that failed half-way; find the padding of the new one."""
        self._pending.clear()
        self._chunks.clear()
        ids = kwargs.get("input_ids", args[0] if args else None)
        ids = ids if ids is not None else kwargs.get("inputs_embeds")
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self._valid = None
        self._width = ids.shape[1] if ids is not None and ids.dim() >= 2 else 0
        if ids is not None and mask is not None and mask.dim() == 2:
            valid = mask[:, -ids.shape[1] :].reshape(-1).bool()  # with a cache the mask covers the past too
            self._valid = None if bool(valid.all()) else valid

    def _on_end(self, *_: Any) -> None:
        self._flush()

    def _router_hook(self, layer: MoELayer) -> Any:
        def hook(module: Any, args: tuple, out: Any) -> None:
            if layer.index in self._pending:
                if row_offset():  # the next chunk of the same forward's rows
                    self._chunks.setdefault(layer.index, []).append(self._pending.pop(layer.index))
                else:  # the layer ran again without the stack: a new pass
                    self._flush()
            elif not row_offset():  # the layers before this one are done: folded now, not held to the end
                self._flush()
            logits, index = layer.router_choice(out)
            width = chunk_width(self._width)
            if layer.spec.combine == "output":
                self._pending[layer.index] = _Pending(logits.detach(), index.detach(), width=width)
                return
            scores = out[0]  # Llama 4: dense sigmoid scores (0 off the top-k)
            hidden = args[0].detach().reshape(-1, args[0].shape[-1])
            weights = scores.detach().gather(1, index).float()
            valid = self._chunk_valid(len(hidden))
            saliency = recomputed_norms(layer, hidden, index, valid) * weights
            self.saliency_source[layer.index] = "recomputed"
            context = routed_context(hidden, index, weights, valid, layer.num_experts)
            self._pending[layer.index] = _Pending(logits.detach(), index, saliency, context, width)

        return hook

    def _block_pre_hook(self, index: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            self._block_in[index] = x.detach().reshape(-1, x.shape[-1])

        return hook

    def _experts_pre_hook(self, index: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            named = ("hidden_states", "top_k_index", "top_k_weights")
            values = [*args, *(kwargs[name] for name in named[len(args) :])]
            self._experts_in[index] = tuple(v.detach() for v in values[:3])

        return hook

    def _experts_hook(self, layer: MoELayer) -> Any:
        def hook(module: Any, args: tuple, out: Any) -> None:
            hidden, index, weights = self._experts_in.pop(layer.index)
            hidden = hidden.reshape(-1, hidden.shape[-1])  # DBRX's experts take [B, S, H]
            captured = self._norms.pop(layer.index, None)
            valid = self._chunk_valid(len(hidden))
            if captured is not None:
                norms, source = slot_norms(*captured, index), "captured"
            else:
                norms, source = recomputed_norms(layer, hidden, index, valid), "recomputed"
            self.saliency_source[layer.index] = source
            pending = self._pending[layer.index]
            pending.saliency = norms * weights.float()
            block_in = self._block_in.pop(layer.index)
            pending.context = routed_context(block_in, index, weights, valid, layer.num_experts)

        return hook

    def _chunk_valid(self, tokens: int) -> torch.Tensor | None:
        """The padding mask of the ``tokens`` the running chunk's rows hold, on their real
        positions where the chunk was cut to them (all rows outside a chunked layer)."""
        if self._valid is None:
            return None
        width = chunk_width(self._width)
        rows = self._valid.view(-1, self._width)[row_offset() : row_offset() + tokens // width, :width]
        return rows.reshape(-1)

    def _flush(self) -> None:
        """Fold the queued pass into the sums: one stacked update when all layers saw one shape."""
        chunks, self._chunks = self._chunks, {}
        pending = {
            index: _Pending.joined([*chunks.get(index, []), last], self._width)
            for index, last in self._pending.items()
        }
        self._pending = {}
        shapes = {p.logits.shape for p in pending.values()}
        groups = [list(pending)] if len(shapes) == 1 else [[i] for i in pending]
        for group in groups if pending else []:
            items = [pending[i] for i in group]
            self._sums.add(
                [self._rows[i] for i in group],
                torch.stack([p.logits for p in items]),
                torch.stack([p.index for p in items]),
                torch.stack([p.saliency for p in items]),
                self._valid,
            )
            for i, p in zip(group, items, strict=True):
                if p.context is not None:
                    self._sums.add_context(self._rows[i], *p.context)
