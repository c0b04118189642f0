"""A layer-sequential model's decoder layers run a forward's rows in chunks, within one read.

A layer-sequential model (:func:`~moescope.explore.sequential.layer_sequential`) reads every
decoder layer from the checkpoint's shards once per forward, so a pass reads the checkpoint as
many times as it has forwards, and holds one forward's activations. Sized by memory alone, the
rows per forward set the reads: on a 0.91 GB checkpoint a default export read it 4 times with
forwards as large as half the machine's memory (3.8 GB resident), and 69 times with forwards
sized within a 600 MB budget. Here a forward takes every row whose hidden states fit, and each
decoder layer, once its weights are read, runs the rows in chunks of as many as its activations
may take (:func:`chunk_decoder_layers`): layer-major, each layer read once for all the rows,
the transient activations one chunk's.

Under autograd (Taylor importance: a backward follows) each chunk runs under non-reentrant
activation checkpointing, so the forward keeps a layer's input only; the backward reads the
layer once more for all its chunks, loaded when the backward reaches the layer's output and
released when it leaves the layer's input (:class:`_LoadForBackward`, :class:`_ReleaseAfterBackward`).
A layer the backward never reaches (before the first scaled expert) is never read again.

A chunk's rows are sized by one row's activations: the larger of their estimate and what the
layer's first row of a forward at that width (and with or without a backward) was measured to
allocate (:mod:`moescope.models.peak_memory`), that row run as a chunk of its own. An estimate
short of a layer's real activations (Qwen3-Next's gated delta rule on the CPU holds 100 times
it) would otherwise size chunks past the memory they were given.

A forward that carries a key/value cache (``generate``) runs unchunked: a cache written a chunk
at a time would hold each chunk's keys one after another.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

from moescope.models.peak_memory import measurable, peak_allocation
from moescope.models.resident import read_when_used, resident

_OFFSET: contextvars.ContextVar[int] = contextvars.ContextVar("moescope_row_offset", default=0)
_WIDTH: contextvars.ContextVar[int] = contextvars.ContextVar("moescope_row_width", default=0)
_LENGTHS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "moescope_row_lengths", default=None
)

# (a layer's hidden states, backward follows, one row's measured bytes or None) -> rows per chunk
RowsFor = Callable[[torch.Tensor, bool, "int | None"], int]


def row_offset() -> int:
    """Rows of the forward before the chunk running now (0 outside a chunked layer): a hook that
    indexes a forward's rows (Taylor importance's per-row multipliers) adds it."""
    return _OFFSET.get()


def chunk_width(width: int) -> int:
    """Positions per row of the chunk running now, ``width`` (the forward's) outside a chunked
    layer: a chunk cut to its rows' real positions (:func:`trailing_padding`) is narrower."""
    return _WIDTH.get() or width


@contextmanager
def trailing_padding(lengths: Sequence[int]) -> Iterator[None]:
    """Within it, a chunked layer's forward whose rows are ``len(lengths)``, right-padded, runs
    each chunk on its rows' first ``lengths`` positions alone (the longest of the chunk's), sized
    for that width, and returns zeros at the positions cut off; where a backward follows, each
    such chunk is checkpointed and run again on them.

    A causal layer's output at a real position never depends on the padding after it, so the
    real positions come out as before; the padding does not (zeros, not what the layer makes of
    pad tokens): a caller enters it only where nothing reads the padded positions (the
    teacher's distributions and Taylor importance's likelihood, taken at the scored positions
    alone). A hook that indexes positions within a chunk asks :func:`chunk_width`. Rows sorted longest first
    give chunks of like widths; a layer with a per-position input this module does not know
    runs as before."""
    token = _LENGTHS.set(tuple(lengths))
    try:
        yield
    finally:
        _LENGTHS.reset(token)


def real_lengths(mask: torch.Tensor) -> list[int]:
    """Each right-padded row's positions up to its last real token (0 for a row of padding): the
    ``lengths`` :func:`trailing_padding` takes, from the rows' attention mask."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.bool() * positions).amax(dim=1).tolist()


def trimmed_width(config: Any) -> float:
    """The widest forward whose output at a real position is the same whatever padding follows
    it, so that :func:`trailing_padding` may cut the padding off: any, but under DeepSeek sparse
    attention (an ``index_topk``), whose indexer, for a query with fewer earlier keys than its
    top-k, picks the rest among later positions; up to ``index_topk`` positions it keeps them all."""
    from moescope.models.support import language_config

    return getattr(language_config(config), "index_topk", None) or math.inf


def chunks_rows(model: nn.Module) -> bool:
    """Whether ``model``'s decoder layers run a forward's rows in chunks (:func:`chunk_decoder_layers`)."""
    from moescope.models.view import decoder_layers

    return any(
        isinstance(getattr(layer, "_old_forward", None), _ChunkedForward) for layer in decoder_layers(model)
    )


def chunk_decoder_layers(model: nn.Module, rows_for: RowsFor) -> None:
    """Every decoder layer of ``model`` whose weights accelerate reads when it runs runs its
    rows in chunks of ``rows_for(hidden_states, backward, row_bytes)`` rows (``row_bytes``: what
    one row was measured to allocate, ``None`` where it was not), inside one read of its weights.

    The chunking sits inside accelerate's hook (its ``_old_forward``), so the hook still loads
    the layer once before the first chunk and releases it after the last.
    """
    from moescope.models.view import decoder_layers

    for layer in decoder_layers(model):
        if isinstance(getattr(layer, "_old_forward", None), _ChunkedForward):
            layer._old_forward.rows_for = rows_for  # chunked already: sized anew
        elif read_when_used(layer):
            layer._old_forward = _ChunkedForward(
                layer, layer._old_forward, rows_for, trimmed_width(model.config)
            )


class _ChunkedForward:
    """A decoder layer's own forward, run a chunk of rows at a time."""

    def __init__(
        self, layer: nn.Module, forward: Callable[..., Any], rows_for: RowsFor, trims: float = math.inf
    ) -> None:
        self.layer, self.forward, self.rows_for = layer, forward, rows_for
        self.trims = trims  # the widest forward whose padding may be cut off (trimmed_width)
        self.row_bytes: dict[tuple[int, bool], int] = {}  # (width, backward) -> one row, measured
        self._measuring: tuple[int, bool] | None = None
        self._per_row: dict[tuple, bool] = {}  # an input's path -> one entry a row, where rows ≠ width

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hidden = args[0] if args else kwargs["hidden_states"]
        rows, backward = hidden.shape[0], torch.is_grad_enabled()
        if _holds_cache(args, kwargs):
            return self.forward(*args, **kwargs)
        key = (row_width(hidden), backward)
        whole = self._left_whole((args, kwargs), rows, key[0])
        measure = whole is not None and rows > 1 and key not in self.row_bytes and measurable(hidden.device)
        size = functools.cache(lambda: self._size(hidden, rows, backward))  # asked after a row is measured
        measuring = key if measure else None
        chunks = iter([slice(0, rows)]) if whole is None else self._chunks(rows, measuring, lambda _: size())
        lengths = _LENGTHS.get()
        if whole is not None and lengths is not None and len(lengths) == rows and 1 < key[0] <= self.trims:
            cut = _position_cutter(args, kwargs, key[0])
            if cut is not None:
                return self._trimmed(args, kwargs, rows, whole, lengths, cut)
        if backward:  # checkpointed even whole: autograd would keep the weights to the backward
            return self._run_chunks(chunks, rows, args, kwargs, whole or frozenset(), checkpointed=True)
        if whole is None or (not measure and self._size(hidden, rows, backward) >= rows):
            return self.forward(*args, **kwargs)
        return self._run_chunks(chunks, rows, args, kwargs, whole)

    def _left_whole(self, inputs: tuple[tuple, dict[str, Any]], rows: int, width: int) -> frozenset | None:
        """The paths of the inputs whose first axis has ``rows`` entries but not one a row. Where
        the rows are as many as the positions, a table of positions × positions (inkling2's
        relative distances) has as many entries as rows: it is told apart by what the layer's
        forwards of another number of rows showed, and where they showed nothing yet the forward
        runs as one chunk (``None``); before, the table was cut as rows and the layer's output
        was wrong (a teacher 0.006 off in log-probability)."""
        sized = _row_sized(inputs, rows)
        if rows != width:
            self._per_row.update(sized)
            return frozenset()
        if any(is_rows and path not in self._per_row for path, is_rows in sized.items()):
            return None
        return frozenset(path for path, is_rows in sized.items() if is_rows and not self._per_row[path])

    def _chunks(
        self, rows: int, measuring: tuple[int, bool] | None, size_at: Callable[[int], int]
    ) -> Iterator[slice]:
        """The forward's chunks of rows, in order; with ``measuring`` (a width, and whether a
        backward follows, of which no row was measured yet) the first row is a chunk of its own,
        measured as it runs, and the rest are sized by what it took: ``size_at(first row)``
        rows each, asked once the row before has run."""
        start = 0
        if measuring is not None:
            self._measuring = measuring
            yield slice(0, 1)
            start = 1
        while start < rows:
            stop = min(rows, start + size_at(start))
            yield slice(start, stop)
            start = stop

    def _size(self, hidden: torch.Tensor, rows: int, backward: bool) -> int:
        measured = self.row_bytes.get((row_width(hidden), backward))
        return max(1, self.rows_for(hidden, backward, measured)) if rows > 1 else 1

    def _trimmed(
        self,
        args: tuple,
        kwargs: dict[str, Any],
        rows: int,
        whole: frozenset,
        lengths: tuple[int, ...],
        cut: Cut,
    ) -> Any:
        """The forward a chunk at a time, each on its rows' real positions (:func:`trailing_padding`),
        each chunk checkpointed where a backward follows (:meth:`_run_chunks`).

        A chunk takes as many rows as the memory given holds at their span, and at least as many
        as the widest row's positions hold (``widest // span``): that row runs in a chunk of its
        own at the least, and a row's activations grow at least linearly with its width, so such
        a chunk holds no more than it and the forward's peak is unchanged. Where the memory given
        holds one row or none (toy-v3 under 4 MB with its proxy beside it), a chunk a row would
        cost the teacher a layer call per row, a call of one short row costing about what one of
        three does."""
        hidden = args[0] if args else kwargs["hidden_states"]
        backward = torch.is_grad_enabled()
        spans = [max(1, n) for n in lengths]
        longest = list(itertools.accumulate(reversed(spans), max))[::-1]  # a chunk from row i: at most
        first = (spans[0], backward)  # the first row, measured at its own width where none of it was
        measuring = first if rows > 1 and first not in self.row_bytes and measurable(hidden.device) else None
        chunks = self._chunks(
            rows,
            measuring,
            lambda start: max(self._size_at(hidden, longest[start], backward), longest[0] // longest[start]),
        )

        def fit(part: slice, chunk_args: tuple, chunk_kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
            return cut(chunk_args, chunk_kwargs, max(spans[part]))

        return self._run_chunks(chunks, rows, args, kwargs, whole, fit, checkpointed=backward)

    def _size_at(self, hidden: torch.Tensor, span: int, backward: bool = False) -> int:
        """Rows per chunk of ``span`` positions: what one row measured at that width, or at a
        wider one scaled down to it (a row's activations grow with its width at least
        linearly, so the scaled figure is not short of them), allows."""
        scaled = [
            measured * span // width
            for (width, after), measured in self.row_bytes.items()
            if after == backward and width >= span
        ]
        return max(1, self.rows_for(hidden[:, :span], backward, min(scaled, default=None)))

    def _chunk(self, start: int, *args: Any, **kwargs: Any) -> Any:
        hidden = args[0] if args else kwargs["hidden_states"]
        token, width = _OFFSET.set(start), _WIDTH.set(row_width(hidden))
        try:
            if self._measuring is None:
                return self.forward(*args, **kwargs)
            return self._measured(*args, **kwargs)
        finally:
            _WIDTH.reset(width)
            _OFFSET.reset(token)

    def _measured(self, *args: Any, **kwargs: Any) -> Any:
        """The layer's forward of one row, what it allocated kept for sizing the chunks after it."""
        key, self._measuring = self._measuring, None
        hidden = args[0] if args else kwargs["hidden_states"]
        with peak_allocation(hidden.device) as peak:
            out = self.forward(*args, **kwargs)
        if peak.bytes is not None and key is not None:
            self.row_bytes[key] = peak.bytes
        return out

    def _run_chunks(
        self,
        chunks: Iterator[slice],
        rows: int,
        args: tuple,
        kwargs: dict[str, Any],
        whole: frozenset,
        fit: Fit | None = None,
        *,
        checkpointed: bool = False,
    ) -> Any:
        """Each chunk's forward, the outputs joined: ``checkpointed``, each under activation
        checkpointing and the layer read again for the backward; with ``fit``, each chunk's
        inputs cut to its rows' real positions and its output padded back (:meth:`_trimmed`)."""
        hidden = args[0] if args else kwargs["hidden_states"]
        width = row_width(hidden)
        if not checkpointed:
            inputs = ((part, *_chunk_inputs(args, kwargs, part, rows, whole)) for part in chunks)
            return _joined((self._run_chunk(*chunk, fit, width) for chunk in inputs), rows)

        def run(read_again: torch.Tensor) -> Any:
            return _cat(
                [
                    self._run_chunk(
                        part,
                        *_with_hidden(*_chunk_inputs(args, kwargs, part, rows, whole), piece),
                        fit,
                        width,
                        checkpointed=True,
                    )
                    for part, piece in _row_pieces(read_again, chunks)
                ]
            )

        return read_again_for_backward(self.layer, hidden, run)

    def _run_chunk(
        self,
        part: slice,
        chunk_args: tuple,
        chunk_kwargs: dict[str, Any],
        fit: Fit | None,
        width: int,
        *,
        checkpointed: bool = False,
    ) -> Any:
        """One chunk's forward (under activation checkpointing where asked), its inputs cut by
        ``fit`` and its output padded back to ``width`` positions where one is given."""
        if fit is not None:
            chunk_args, chunk_kwargs = fit(part, chunk_args, chunk_kwargs)
        if checkpointed:
            from torch.utils.checkpoint import checkpoint

            out = checkpoint(self._chunk, part.start, *chunk_args, use_reentrant=False, **chunk_kwargs)
        else:
            out = self._chunk(part.start, *chunk_args, **chunk_kwargs)
        return out if fit is None else _padded(out, width)


def _row_pieces(hidden: torch.Tensor, chunks: Iterator[slice]) -> Iterator[tuple[slice, torch.Tensor]]:
    """Each chunk with its rows of ``hidden``, split off in two splits: the first chunk (measured,
    perhaps, as it runs), then the rest, sized once it has run. Cut a chunk at a time, each
    chunk's gradient would come back as a tensor of every row, zeros but its own: toy-v3's
    Taylor pass of 1,152 rows a chunk of one row filled 18 MB a chunk, most of its backward."""
    first = next(chunks)
    mine, rest = hidden.split([first.stop, len(hidden) - first.stop])
    yield first, mine
    parts = list(chunks)
    yield from zip(parts, rest.split([part.stop - part.start for part in parts]), strict=True)


def _chunk_inputs(
    args: tuple, kwargs: dict[str, Any], part: slice, rows: int, whole: frozenset
) -> tuple[tuple, dict[str, Any]]:
    """A layer's inputs for the rows of ``part`` (those in ``whole`` left whole: :func:`_rows`)."""
    return _rows(args, part, rows, whole, (0,)), _rows(kwargs, part, rows, whole, (1,))


def _with_hidden(args: tuple, kwargs: dict[str, Any], hidden: torch.Tensor) -> tuple[tuple, dict[str, Any]]:
    """A layer's inputs with ``hidden`` for its hidden states."""
    return ((hidden, *args[1:]), kwargs) if args else ((), {**kwargs, "hidden_states": hidden})


def read_again_for_backward(
    module: nn.Module, hidden: torch.Tensor, run: Callable[[torch.Tensor], Any]
) -> Any:
    """``run(hidden)``, whose backward runs ``module`` again (activation checkpointing), with
    ``module``'s weights read once for that backward: loaded when the backward reaches the output,
    released when it has left ``hidden``. Call it with the weights in memory, inside
    :func:`layers_read_for_backward`."""
    loaded = _loaded_layers(module)
    output = run(_ReleaseAfterBackward.apply(hidden, loaded))
    if isinstance(output, torch.Tensor):
        return _LoadForBackward.apply(output, module, loaded)
    return (_LoadForBackward.apply(output[0], module, loaded), *output[1:])


class _Loaded:
    """The layers the backward has read and not yet released (at most one while it runs)."""

    def __init__(self) -> None:
        self.stacks: dict[int, ExitStack] = {}

    def load(self, layer: nn.Module) -> None:
        if id(layer) not in self.stacks:
            stack = ExitStack()
            stack.enter_context(resident(layer))
            self.stacks[id(layer)] = stack

    def release(self, layer: nn.Module | None = None) -> None:
        for key in [id(layer)] if layer is not None else list(self.stacks):
            stack = self.stacks.pop(key, None)
            if stack is not None:
                stack.close()


_BACKWARD: contextvars.ContextVar[_Loaded | None] = contextvars.ContextVar("moescope_backward", default=None)


@contextmanager
def layers_read_for_backward() -> Iterator[None]:
    """One forward and its backward: the backward reads each chunked layer it reaches once; a
    layer it leaves loaded (its input needed no gradient) is released when the block ends."""
    loaded = _Loaded()
    token = _BACKWARD.set(loaded)
    try:
        yield
    finally:
        _BACKWARD.reset(token)
        loaded.release()


def _loaded_layers(layer: nn.Module) -> _Loaded:
    loaded = _BACKWARD.get()
    if loaded is None:
        raise RuntimeError(
            f"{type(layer).__name__} is read again for a backward only inside "
            "layers_read_for_backward(), which releases what the backward reads."
        )
    return loaded


class _LoadForBackward(torch.autograd.Function):
    """Identity; its backward reads the layer, before any of its chunks is run again."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, layer: nn.Module, loaded: _Loaded) -> torch.Tensor:
        ctx.layer, ctx.loaded = layer, loaded
        return output.view_as(output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.loaded.load(ctx.layer)
        return grad, None, None


class _ReleaseAfterBackward(torch.autograd.Function):
    """Identity on a layer's input; its backward, once every chunk's has run, releases the layer."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, loaded: _Loaded) -> torch.Tensor:
        ctx.loaded = loaded
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.loaded.release()
        return grad, None


def row_width(hidden: torch.Tensor) -> int:
    """Positions per row of a decoder layer's hidden states (1 for a flat batch of tokens)."""
    return hidden.shape[1] if hidden.dim() > 2 else 1


def _holds_cache(args: tuple, kwargs: dict[str, Any]) -> bool:
    from transformers.cache_utils import Cache

    return any(isinstance(value, Cache) for value in (*args, *kwargs.values()))


def _rows(values: Any, part: slice, rows: int, whole: frozenset = frozenset(), path: tuple = ()) -> Any:
    """``values`` (a tuple, a dict, or one value) with every tensor that holds one entry per row
    (``rows`` along its first axis, two axes or more) cut to the rows of ``part``, but those at
    a path in ``whole`` (names and indices from ``values`` down)."""
    if isinstance(values, dict):
        return {name: _rows(value, part, rows, whole, (*path, name)) for name, value in values.items()}
    if isinstance(values, tuple | list):
        return type(values)(_rows(value, part, rows, whole, (*path, i)) for i, value in enumerate(values))
    if (
        isinstance(values, torch.Tensor)
        and values.dim() >= 2
        and values.shape[0] == rows
        and path not in whole
    ):
        return values[part]
    return values


def _row_sized(values: Any, rows: int, path: tuple = ()) -> dict[tuple, bool]:
    """Every tensor of two axes or more in ``values``, by its path: whether its first axis has
    ``rows`` entries."""
    if isinstance(values, dict):
        items: Iterator[tuple[Any, Any]] = iter(values.items())
    elif isinstance(values, tuple | list):
        items = enumerate(values)
    else:
        is_table = isinstance(values, torch.Tensor) and values.dim() >= 2
        return {path: values.shape[0] == rows} if is_table else {}
    return {
        found: sized for key, value in items for found, sized in _row_sized(value, rows, (*path, key)).items()
    }


def _joined(outputs: Iterator[Any], rows: int) -> Any:
    """The chunks' hidden states, as each chunk ends, copied into one tensor of ``rows`` rows:
    the layer holds its input, that output and one chunk's, where a join of every chunk's
    output would hold them all beside it (on the 4 GB bench checkpoint a forward's hidden states
    are 0.6 GB). Outputs of another form are joined by :func:`_cat`."""
    first = next(outputs)
    if not isinstance(first, torch.Tensor) or first.dim() == 0 or first.shape[0] >= rows:
        return _cat([first, *outputs])
    out = first.new_empty((rows, *first.shape[1:]))
    start = 0
    for part in itertools.chain([first], outputs):
        out[start : start + len(part)].copy_(part)
        start += len(part)
    return out


def _cat(outputs: list[Any]) -> Any:
    """The chunks' outputs joined along the rows: tensors, or tuples of them (``None`` kept)."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(outputs) if len(outputs) > 1 else first
    if isinstance(first, tuple):
        return tuple(
            _cat([out[i] for out in outputs]) if isinstance(first[i], torch.Tensor) else first[i]
            for i in range(len(first))
        )
    return first


Cut = Callable[[tuple, dict[str, Any], int], tuple[tuple, dict[str, Any]]]
Fit = Callable[[slice, tuple, dict[str, Any]], tuple[tuple, dict[str, Any]]]  # a chunk's inputs, cut
_POSITION_AXES = {  # a decoder layer's per-position inputs as transformers passes them: axes cut
    "attention_mask": {4: (2, 3), 2: (1,)},  # (rows, 1, query, key); (rows, positions)
    "position_ids": {2: (1,), 3: (2,)},  # (1 or rows, positions); mrope's (3, rows, positions)
    "cache_position": {1: (0,)},
    "conv_mask": {2: (1,)},  # a linear-attention layer's (rows, positions) mask of its causal convolution
}


def _position_cutter(args: tuple, kwargs: dict[str, Any], width: int) -> Cut | None:
    """A function cutting a layer's inputs to their first ``span`` positions, or ``None`` where one
    input has ``width`` entries on an axis this module does not know to be one of positions (a
    table of relative distances, say): the forward then runs untrimmed."""
    rotary = kwargs.get("position_embeddings")
    known = {"hidden_states", "position_embeddings", *_POSITION_AXES}
    for name, value in (*((i, a) for i, a in enumerate(args[1:], 1)), *kwargs.items()):
        if name in known or not isinstance(value, torch.Tensor | tuple | list):
            continue
        if any(width in t.shape for t in _tensors(value)):
            return None
    if rotary is not None and not all(t.dim() == 3 and t.shape[1] == width for t in _tensors(rotary)):
        return None
    for name, axes in _POSITION_AXES.items():
        value = kwargs.get(name)
        if value is not None and (
            value.dim() not in axes or any(value.shape[a] != width for a in axes[value.dim()])
        ):
            return None

    def cut(args: tuple, kwargs: dict[str, Any], span: int) -> tuple[tuple, dict[str, Any]]:
        kwargs = dict(kwargs)
        if args:
            args = (args[0][:, :span], *args[1:])
        else:
            kwargs["hidden_states"] = kwargs["hidden_states"][:, :span]
        rotary = kwargs.get("position_embeddings")
        if isinstance(rotary, torch.Tensor):  # complex frequencies (DeepSeek-V2, Llama 4)
            kwargs["position_embeddings"] = rotary[:, :span]
        elif rotary is not None:  # (cos, sin)
            kwargs["position_embeddings"] = type(rotary)(t[:, :span] for t in rotary)
        for name, axes in _POSITION_AXES.items():
            value = kwargs.get(name)
            if value is not None:
                for axis in axes[value.dim()]:
                    value = value.narrow(axis, 0, span)
                kwargs[name] = value
        return args, kwargs

    return cut


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    return []


def _padded(output: Any, width: int) -> Any:
    """A chunk's output (hidden states, or a tuple led by them) zero-padded back to ``width`` positions."""
    if isinstance(output, tuple):
        return (_padded(output[0], width), *output[1:])
    full = output.new_zeros((output.shape[0], width, *output.shape[2:]))
    full[:, : output.shape[1]] = output
    return full
