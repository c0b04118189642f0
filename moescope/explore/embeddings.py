"""Expert embeddings: one vector per routed expert per MoE layer, from several views.

Views (``VIEWS``):

- ``weights``: a fixed random projection of the expert's flattened weights (gate, up, down
  and biases), computed one expert at a time (see *Projections*);
- ``outputs``: every expert applied to the same probe tokens; each concatenated ``(T, H)``
  response is sketched like a weight matrix, then the layer's sketches are reduced to ``dim``
  on their principal axes. The probe is the hidden state at each MoE block's input for a batch
  of token ids (default: ``PROBE_SHAPE`` random ids drawn with the seed), captured with forward
  pre-hooks; only the probe set is kept;
- ``router``: the expert's router weight row ``(H,)``;
- ``coactivation``: row ``i`` of the co-selection matrix divided by expert ``i``'s routed
  tokens, i.e. ``P(j chosen | i chosen)`` with ``P(i | i) = 1`` (needs ``RoutingStats``);
- ``multiview``: weights, outputs, router (and co-activation when ``stats`` is given), each
  centred on the layer's mean expert and scaled to unit length per expert, then joined and
  divided by ``sqrt(views)``. The joined vectors have unit length, and their cosine similarity
  is the average of the per-view cosine similarities: every view counts the same.

Projections. A dense Gaussian matrix over a DeepSeek-V3 expert's 3 × 7168 × 2048 weights would
hold ~10¹¹ numbers, so each matrix ``W (m, n)`` is sketched from both sides, ``A W Bᵀ`` with
fixed Gaussian ``A (r, m)`` and ``B (r, n)`` (entries ``N(0, 1/r)``). That is the Kronecker
projection ``(B ⊗ A) vec(W)``: it preserves squared norms and inner products in expectation,
costs ``r·m·n`` per matrix and stores only ``r·(m + n)`` numbers. Biases go through the left
factor of their matrix. A Kronecker projection distorts more than a dense one of the same
size, so the sketches oversample: ``r = 2·ceil(sqrt(dim))`` gives ``4·dim`` numbers per matrix,
and one more fixed Gaussian matrix brings the joined pieces to ``dim`` (measured on planted
expert outputs: mean cosine error 0.14, against 0.12 for a dense projection and 0.18 with
``r² = dim``). Every matrix is drawn from ``(seed, role, shape)``, so all layers and experts
share it and ``weights`` vectors are comparable across layers.

The other views need no fixed basis, since clustering compares experts within a layer: rows
longer than ``dim`` (output sketches of rank ``4·ceil(sqrt(dim))``, router rows, co-activation
rows) go to :func:`principal_coordinates`, exact for every inner product when ``E <= dim``.
Expert outputs carry less signal than weights (noise compounds through three matrices and a
non-linearity), and a random projection to ``dim`` would bury it: on planted copies with
noise 0.5, clustering the outputs recovered every group this way and missed some with it.

Examples
--------
>>> from moescope.models.zoo import tiny
>>> emb = embed_experts(tiny("mixtral"), "weights", dim=16, progress=False)
>>> emb.vectors.shape, emb.layers
((2, 8, 16), (0, 1))
>>> emb.project().to_frame().columns.tolist()
['layer', 'expert', 'x', 'y']
"""

from __future__ import annotations

import inspect
import io
import json
import math
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from moescope._util.io import write_atomic
from moescope._util.threads import map_on_cores, single_threaded
from moescope.errors import MoescopeError
from moescope.models.resident import execution_device, resident
from moescope.models.view import MoELayer, MoEModel, adapt
from moescope.provenance import config_hash
from moescope.schema import EXPERT, LAYER, SCHEMA_VERSION, check_schema

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedModel

    from moescope.explore.routing import RoutingStats

VIEWS = ("weights", "outputs", "router", "coactivation", "multiview")
PROBE_SHAPE = (4, 64)  # default probe: 4 sequences × 64 random token ids → 256 tokens
UMAP_MIN_EXPERTS = 16  # below this, a k-nearest-neighbour graph says little: "auto" uses PCA
PROJECTIONS = ("auto", "umap", "pca")
UPCAST_ROWS = 128  # rows of a bf16 matrix upcast at a time where the CPU lacks bf16 products


@dataclass(frozen=True)
class ExpertEmbeddings:
    """Vectors of the routed experts of every MoE layer of one model, from one view.

    Attributes
    ----------
    view : one of ``VIEWS``.
    layers : decoder-layer index of each row of ``vectors``.
    num_experts : routed experts per layer ``E``.
    config_hash : :func:`~moescope.provenance.config_hash` of the source model.
    seed : seed of the fixed random projections (and of the default probe).
    vectors : ``(L, E, D)`` float32.
    coords : ``(L, E, 2)`` float32 2-D positions after :meth:`project`, else ``None``.
    model_type, top_k, n_group, topk_group : the source model's routing shape, so a selection
        can be made from the embeddings alone (``top_k=0``: unknown).
    components : the views joined by ``multiview`` (empty for a single view).
    """

    view: str
    layers: tuple[int, ...]
    num_experts: int
    config_hash: str
    seed: int
    vectors: np.ndarray = field(repr=False)
    coords: np.ndarray | None = field(default=None, repr=False)
    model_type: str = ""
    top_k: int = 0
    n_group: int = 1
    topk_group: int = 1
    components: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        shape = (len(self.layers), self.num_experts)
        if self.vectors.ndim != 3 or self.vectors.shape[:2] != shape:
            raise MoescopeError(
                f"expert vectors have shape {self.vectors.shape}, not (layers, experts, dim) = "
                f"{(*shape, 'D')}; build them with one row per layer and one per expert."
            )
        if self.coords is not None and self.coords.shape != (*shape, 2):
            raise MoescopeError(f"coords have shape {self.coords.shape}; expected {(*shape, 2)}.")

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[2])

    def layer_vectors(self, layer: int) -> np.ndarray:
        """``(E, D)`` vectors of decoder layer ``layer``."""
        if layer not in self.layers:
            raise KeyError(f"decoder layer {layer} has no embeddings; layers: {list(self.layers)}")
        return self.vectors[self.layers.index(layer)]

    def project(self, method: str = "auto", seed: int | None = None) -> ExpertEmbeddings:
        """2-D positions per layer: ``umap`` (umap-learn, cosine), ``pca``, or ``auto``.

        ``auto`` is UMAP from ``UMAP_MIN_EXPERTS`` experts up and PCA below. Each layer is
        projected on its own. Returns a copy with ``coords`` ``(L, E, 2)``.
        """
        if method not in PROJECTIONS:
            raise MoescopeError(f"unknown projection {method!r}; choose one of {', '.join(PROJECTIONS)}.")
        if method == "auto":
            method = "umap" if self.num_experts >= UMAP_MIN_EXPERTS else "pca"
        if method == "umap" and self.num_experts < UMAP_MIN_EXPERTS:
            raise MoescopeError(
                f"UMAP needs at least {UMAP_MIN_EXPERTS} experts per layer and this model has "
                f"{self.num_experts}; use method='pca' or 'auto'."
            )
        seed = self.seed if seed is None else seed
        embed2d = _umap_2d if method == "umap" else _pca_2d
        with single_threaded():
            coords = np.stack([embed2d(layer, seed) for layer in self.vectors]).astype(np.float32)
        return replace(self, coords=coords)

    def to_frame(self) -> pd.DataFrame:
        """Long form, one row per (layer, expert): ``layer, expert`` and ``x, y`` when projected."""
        import pandas as pd

        n_layers, n_experts = len(self.layers), self.num_experts
        frame = pd.DataFrame(
            {
                LAYER: np.repeat(np.asarray(self.layers, dtype=np.int64), n_experts),
                EXPERT: np.tile(np.arange(n_experts, dtype=np.int64), n_layers),
            }
        )
        if self.coords is not None:
            frame["x"] = self.coords[..., 0].reshape(-1)
            frame["y"] = self.coords[..., 1].reshape(-1)
        return frame

    def save(self, path: str | Path) -> Path:
        """Write one ``.npz`` file (vectors, coords, JSON metadata), atomically."""
        meta = {k: v for k, v in asdict(self).items() if k not in ("vectors", "coords")}
        arrays = {"meta": np.array(json.dumps({"schema_version": SCHEMA_VERSION, **meta}))}
        arrays["vectors"] = self.vectors
        if self.coords is not None:
            arrays["coords"] = self.coords
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return write_atomic(path, buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> ExpertEmbeddings:
        """Read a file written by :meth:`save`."""
        try:
            with np.load(Path(path), allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                vectors = data["vectors"]
                coords = data["coords"] if "coords" in data.files else None
        except (OSError, KeyError, ValueError) as err:
            raise MoescopeError(
                f"{path} is not an expert-embeddings file ({err}); write one with ExpertEmbeddings.save()."
            ) from err
        check_schema(meta.pop("schema_version", None), path)
        for key in ("layers", "components"):
            meta[key] = tuple(meta[key])
        return cls(vectors=vectors, coords=coords, **meta)


def embed_experts(
    model: PreTrainedModel | MoEModel,
    view: str = "multiview",
    *,
    stats: RoutingStats | None = None,
    probe: torch.Tensor | None = None,
    dim: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> ExpertEmbeddings:
    """Embed the routed experts of every MoE layer.

    Parameters
    ----------
    model : a loaded MoE causal LM (or its :func:`~moescope.models.view.adapt` view), whole in
        memory or a decoder layer at a time (:func:`~moescope.explore.sequential.layer_sequential`:
        each layer's weights are read while it is embedded, the probes run as a forward pass).
    view : one of ``VIEWS`` (see the module docstring).
    stats : routing statistics of this model; needed by ``coactivation`` and joined into
        ``multiview`` when given.
    probe : ``(B, S)`` or ``(S,)`` token ids for the ``outputs`` view; default ``PROBE_SHAPE``
        random ids drawn with ``seed``.
    dim : columns per view (``multiview`` has ``dim`` × its number of views).
    seed : seed of the projections and the default probe.
    progress : show a progress bar over layers.

    Returns
    -------
    ExpertEmbeddings with ``vectors`` ``(L, E, D)``.
    """
    if view not in VIEWS:
        raise MoescopeError(f"unknown view {view!r}; choose one of {', '.join(VIEWS)}.")
    if dim < 1:
        raise MoescopeError(f"dim={dim} must be a positive number of columns per view, e.g. 64.")
    moe = model if isinstance(model, MoEModel) else adapt(model)
    if stats is not None:
        check_stats(stats, config_hash(moe.config), moe.moe_indices)
    parts = _view_parts(view, stats)
    projector = _Projector(seed, dim)
    hidden = _probe_hidden(moe, probe, seed) if "outputs" in parts else {}
    rows = []
    for layer in _progress(moe.layers, progress, f"{view} embeddings"):
        with resident(layer.layer):  # its weights, where a layer-sequential model holds them apart
            vectors = [_embed_layer(part, layer, projector, hidden, stats) for part in parts]
        rows.append(vectors[0] if view != "multiview" else join_views(vectors))
    return ExpertEmbeddings(
        view=view,
        seed=seed,
        vectors=np.stack(rows).astype(np.float32),
        components=parts if view == "multiview" else (),
        **model_facts(moe),
    )


def model_facts(moe: MoEModel) -> dict[str, Any]:
    """What a selection needs to know about the source model: layers, counts, routing groups."""
    return {
        "layers": tuple(moe.moe_indices),
        "num_experts": moe.num_experts,
        "config_hash": config_hash(moe.config),
        "model_type": moe.spec.model_type,
        "top_k": moe.top_k,
        "n_group": moe.rule.n_group,
        "topk_group": moe.rule.topk_group,
    }


def join_views(vectors: list[np.ndarray]) -> np.ndarray:
    """Join per-view ``(E, D_v)`` vectors of one layer into ``(E, ΣD_v)``.

    Each view is centred on the mean expert, each expert scaled to unit length in it, and the
    whole divided by ``sqrt(views)``: the joined cosine similarity is the mean of the views'.
    """
    parts = []
    for x in vectors:
        centred = x - x.mean(axis=0, keepdims=True)
        norms = np.linalg.norm(centred, axis=1, keepdims=True)
        parts.append(np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0))
    return np.concatenate(parts, axis=1) / math.sqrt(len(parts))


def default_probe(vocab_size: int, seed: int = 0) -> torch.Tensor:
    """``PROBE_SHAPE`` token ids drawn uniformly from the vocabulary with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, PROBE_SHAPE, generator=generator)


def probe_hidden_states(moe: MoEModel, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """``{decoder layer: (T, H)}`` hidden states at each MoE block's input for token ``ids``
    (``(passes · T, H)`` for a layer a looped model runs several times per forward).

    One eval-mode forward pass with a pre-hook on every MoE block (removed afterwards).
    """
    captured: dict[int, torch.Tensor] = {}
    model = moe.model
    accepts = inspect.signature(model.forward).parameters
    extra = {"use_cache": False, "logits_to_keep": 1}  # no cache; the LM head is not what is probed
    with _capture_block_inputs(moe, captured), _eval_mode(model), torch.no_grad():
        device = execution_device(model)
        ids = ids.reshape(-1, ids.shape[-1]).to(device)
        model(input_ids=ids, **{key: value for key, value in extra.items() if key in accepts})
    return captured


# --- views ---------------------------------------------------------------------------------------


def _view_parts(view: str, stats: RoutingStats | None) -> tuple[str, ...]:
    if view == "coactivation" and stats is None:
        raise MoescopeError(
            "the coactivation view needs routing statistics; pass stats= (a moescope.explore.routing."
            "RoutingStats of this model) or choose another view."
        )
    if view != "multiview":
        return (view,)
    return ("weights", "outputs", "router") + (("coactivation",) if stats is not None else ())


def _embed_layer(
    part: str,
    layer: MoELayer,
    projector: _Projector,
    hidden: dict[int, torch.Tensor],
    stats: RoutingStats | None,
) -> np.ndarray:
    """``(E, dim)`` vectors of one layer in one single view (small products: one thread is fastest)."""
    with torch.no_grad(), single_threaded():
        if part == "weights":
            return weight_vectors(layer, projector)
        if part == "outputs":
            x, rank = hidden[layer.index], 2 * projector.rank
            rows = [
                projector.sketch("outputs", layer.expert_forward(i, x), rank)
                for i in range(layer.num_experts)
            ]
            return principal_coordinates(np.stack(rows), projector.dim)
        if part == "router":
            return principal_coordinates(layer.router_weight.detach().float().cpu().numpy(), projector.dim)
    return principal_coordinates(_coactivation_rows(stats, layer.index), projector.dim)


def principal_coordinates(x: np.ndarray, dim: int) -> np.ndarray:
    """``(E, F)`` → ``(E, dim)`` keeping the experts' inner products as well as ``dim`` columns can.

    Rows are taken as they are when ``F <= dim`` (zero-padded); otherwise their coordinates on
    the layer's principal axes (uncentred SVD, signs fixed): exact for every inner product when
    ``E <= dim``, the best rank-``dim`` approximation of the experts' Gram matrix otherwise.
    """
    x = x.astype(np.float64)
    if x.shape[1] > dim:
        with single_threaded():
            u, s, vt = np.linalg.svd(x, full_matrices=False)
        k = min(dim, len(s))
        x = u[:, :k] * s[:k] * _signs(vt[:k])
    return np.pad(x, ((0, 0), (0, dim - x.shape[1]))).astype(np.float32)


def _signs(axes: np.ndarray) -> np.ndarray:
    """``±1`` per axis (row) making its largest loading positive: a deterministic SVD."""
    signs = np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])
    return np.where(signs == 0, 1.0, signs)


def weight_vectors(layer: MoELayer, projector: _Projector, workers: int = 1) -> np.ndarray:
    """``(E, dim)`` weights-view vectors of one layer, its experts shared among ``workers``
    threads of one BLAS thread each (:func:`~moescope._util.threads.map_on_cores`).

    Each expert's sketch is the same computation on whichever thread runs it, so the vectors
    do not depend on ``workers``. One is fastest for a model in memory (the products are small);
    a streaming export, whose sketching keeps pace with the disk only on several cores, passes more.
    """

    def sketch(i: int) -> np.ndarray:
        with torch.no_grad():  # grad mode is per thread
            return _expert_sketch(layer, i, projector)

    with single_threaded():  # to_dim's BLAS call too: a threaded one spins ~0.1 s after
        rows = map_on_cores(sketch, range(layer.num_experts), workers)
        return projector.to_dim("weights", np.stack(rows))


def _expert_sketch(layer: MoELayer, i: int, projector: _Projector) -> np.ndarray:
    """Two-sided sketches of gate, up and down, then the biases through the left factors."""
    w = layer.expert(i)
    matrices = (("gate", w.gate), ("up", w.up), ("down", w.down))
    pieces = [projector.sketch(name, m) for name, m in matrices if m is not None]
    for name, bias in (("gate", w.gate_bias), ("up", w.up_bias), ("down", w.down_bias)):
        if bias is not None:
            pieces.append(projector.left(name, bias))
    return np.concatenate(pieces)


def _coactivation_rows(stats: RoutingStats, layer: int) -> np.ndarray:
    """``(E, E)``: ``P(j chosen | i chosen)``, with 1 on the diagonal."""
    row = stats.layer_index(layer)
    co = np.asarray(stats.coactivation[row], dtype=np.float64)
    counts = np.asarray(stats.counts[row], dtype=np.float64)
    conditional = co / np.maximum(counts, 1.0)[:, None]
    np.fill_diagonal(conditional, 1.0)
    return conditional


def _product_dtype(w: torch.Tensor) -> torch.dtype:
    """bfloat16 for bfloat16 weights on hardware with native bfloat16 products, else float32.

    Upcasting a bfloat16 matrix multiplies at fp32 speed: sketching a bfloat16 checkpoint
    took over 3× longer that way (0.86 ms against 0.25 ms per 768 × 2048 matrix on an
    AVX512-BF16 CPU). Without native products it is the other way round (22.8 ms in bf16
    against 1.5 ms upcast on an AVX2 CPU). Both give the same numbers: see :func:`_times_right`.
    """
    if w.dtype != torch.bfloat16:
        return torch.float32
    return torch.bfloat16 if w.device.type != "cpu" or _cpu_multiplies_bf16() else torch.float32


@cache
def _cpu_multiplies_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def product_kernel(dtype: torch.dtype = torch.bfloat16) -> str:
    """How this machine's CPU multiplies ``dtype`` weights in the weight view, in words."""
    if dtype != torch.bfloat16:
        return f"{str(dtype).removeprefix('torch.')} weights: float32 products"
    if _cpu_multiplies_bf16():
        return "bf16 weights: native bf16 products"
    return f"bf16 weights: no native bf16 products, float32 ones of {UPCAST_ROWS} rows upcast at a time"


def _times_right(w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``W Bᵀ`` in float32, the same numbers whichever dtype :func:`_product_dtype` takes.

    For bfloat16 weights both paths compute one thing: the products of ``W`` and ``B`` rounded
    to bfloat16 (a part of the projection, as fixed as ``B``), summed in float32, the sums
    rounded to bfloat16. The native product does exactly that (it sums in float32 and returns
    bfloat16); the upcast one too, as a product of two bfloat16 numbers is exact in float32
    (8 + 8 significant bits of 24). Only the order of the additions can differ, which moves a
    sum by ~1e-7 of itself, and so its bfloat16 rounding by one ulp in a few sums in ten
    thousand (2 in 10⁴ for 768 × 2048 matrices): sketches then differ by ~3e-5 of their norm,
    which no clustering tells apart (tests/test_embeddings.py bounds both and checks the
    selection). Before, the upcast path kept ``B`` and the sums in float32, and the two paths'
    vectors differed by ~2e-3, in every entry.

    The upcast goes ``UPCAST_ROWS`` rows at a time, each block multiplied while it is in the
    core's cache rather than a float32 copy of the whole matrix written to memory and read back
    (median 1.7 against 2.1 ms of CPU per 768 × 2048 matrix on a 2-core AVX2 EPYC).
    """
    if w.dtype != torch.bfloat16:
        return w.float() @ b.T
    b = b.to(torch.bfloat16)
    if _product_dtype(w) == torch.bfloat16:
        return (w @ b.T).float()
    right = b.T.float()
    out = torch.empty(w.shape[0], b.shape[0], device=w.device)
    for start in range(0, w.shape[0], UPCAST_ROWS):
        rows = slice(start, start + UPCAST_ROWS)
        torch.mm(w[rows].float(), right, out=out[rows])
    return out.bfloat16().float()


class _Projector:
    """Fixed Gaussian matrices drawn from ``(seed, role, shape)``, cached and shared by experts."""

    def __init__(self, seed: int, dim: int) -> None:
        self.seed, self.dim = seed, dim
        self.rank = 2 * math.ceil(math.sqrt(dim))  # 4·dim numbers per sketch, see the module notes
        self._cache: dict[tuple[str, int, int], torch.Tensor] = {}

    def matrix(self, role: str, rows: int, cols: int) -> torch.Tensor:
        """``(rows, cols)`` with entries ``N(0, 1/rows)``: squared norms kept in expectation."""
        key = (role, rows, cols)
        if key not in self._cache:
            rng = np.random.default_rng([self.seed, zlib.crc32(role.encode()), rows, cols])
            draw = rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(math.sqrt(rows))
            self._cache[key] = torch.from_numpy(draw)
        return self._cache[key]

    def sketch(self, role: str, w: torch.Tensor, rank: int | None = None) -> np.ndarray:
        """``vec(A W Bᵀ)``, ``(rank²,)`` for a ``(m, n)`` matrix.

        ``W Bᵀ``, the product over the whole matrix, runs in ``W``'s own dtype where that is
        bfloat16 and the hardware multiplies it natively, with the result of the upcast product
        (see :func:`_times_right`), and comes first: with ``W`` as the left operand the kernel
        streams it once at memory speed, while ``A W`` first repacks it (0.26 against 0.47 ms
        per 768 × 2048 bf16 matrix read from the page cache, where summing it takes 0.22 ms).
        """
        w, rank = w.detach(), rank or self.rank
        a = self.matrix(f"{role}/left", rank, w.shape[0]).to(w.device)
        b = self.matrix(f"{role}/right", rank, w.shape[1]).to(w.device)
        return (a @ _times_right(w, b)).reshape(-1).cpu().numpy()

    def left(self, role: str, v: torch.Tensor) -> np.ndarray:
        """``A v``, ``(rank,)``: a bias through the left factor of its matrix."""
        v = v.detach().float()
        return (self.matrix(f"{role}/left", self.rank, v.shape[0]).to(v.device) @ v).cpu().numpy()

    def to_dim(self, role: str, x: np.ndarray) -> np.ndarray:
        """``(N, F)`` → ``(N, dim)`` through one more fixed Gaussian matrix."""
        g = self.matrix(f"{role}/out", self.dim, x.shape[1]).numpy()
        return (x.astype(np.float32) @ g.T).astype(np.float32)


# --- the probe -----------------------------------------------------------------------------------


def _probe_hidden(moe: MoEModel, probe: torch.Tensor | None, seed: int) -> dict[int, torch.Tensor]:
    vocab = moe.model.get_input_embeddings().num_embeddings
    if probe is None:
        probe = default_probe(vocab, seed)
    valid_ids = probe.numel() > 0 and int(probe.min()) >= 0 and int(probe.max()) < vocab
    if probe.dtype not in (torch.int64, torch.int32) or probe.ndim not in (1, 2) or not valid_ids:
        raise MoescopeError(
            f"probe must be a 1-D or 2-D tensor of token ids below the vocabulary size {vocab}, got "
            f"{probe.dtype} of shape {tuple(probe.shape)}; pass the input_ids of the model's tokenizer."
        )
    return probe_hidden_states(moe, probe.long())


@contextmanager
def _capture_block_inputs(moe: MoEModel, captured: dict[int, torch.Tensor]) -> Iterator[None]:
    def hook(index: int):
        def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else kwargs["hidden_states"]
            x = x.detach().reshape(-1, x.shape[-1])
            captured[index] = torch.cat([captured[index], x]) if index in captured else x  # every pass

        return record

    handles = [
        layer.block.register_forward_pre_hook(hook(layer.index), with_kwargs=True) for layer in moe.layers
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode for the pass (PhiMoE samples routes in train mode), restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def check_stats(stats: RoutingStats, expected_hash: str, layers: tuple[int, ...] | list[int]) -> None:
    """Refuse routing statistics of another model, or missing some MoE ``layers``."""
    if stats.config_hash != expected_hash:
        raise MoescopeError(
            f"the routing statistics were collected on model config {stats.config_hash}, not "
            f"{expected_hash}; collect them on this model."
        )
    missing = sorted(set(layers) - set(stats.layers))
    if missing:
        raise MoescopeError(
            f"the routing statistics lack MoE layers {missing}; collect them over every MoE layer."
        )


def _progress(items: Any, enabled: bool, desc: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="layer", disable=not enabled, leave=False)


# --- 2-D projection ------------------------------------------------------------------------------


def _pca_2d(x: np.ndarray, seed: int) -> np.ndarray:
    """First two principal components, sign fixed so the largest loading is positive."""
    return principal_coordinates(x - x.mean(axis=0, keepdims=True), 2)


def _umap_2d(x: np.ndarray, seed: int) -> np.ndarray:
    try:
        import umap
    except ImportError:
        raise MoescopeError(
            "the UMAP projection needs umap-learn; install it with pip install 'moescope[analysis]' "
            "or use method='pca'."
        ) from None
    reducer = umap.UMAP(
        n_components=2, n_neighbors=min(15, len(x) - 1), metric="cosine", random_state=seed, n_jobs=1
    )
    return reducer.fit_transform(x)
