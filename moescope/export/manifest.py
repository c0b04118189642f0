"""The proxy manifest ``moescope.json``: how a proxy was made, beside its weights.

Source model (path, config hash), method, keep, seed, per-layer kept expert ids in original
indices and cluster labels, the proxy's routing facts, versions; the fidelity, checklist and
healing sections are added by the export that measured them. Also the side files (tokenizer,
chat template) a proxy directory copies from its source.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._version import __version__
from moescope.errors import MoescopeError
from moescope.explore.selection import Selection
from moescope.export.surgery import weight_semantics
from moescope.models.looping import loop_times_of
from moescope.models.view import adapt
from moescope.provenance import config_hash, library_versions

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PretrainedConfig, PreTrainedModel

MANIFEST = "moescope.json"
MANIFEST_KIND = "moescope.proxy"
SCHEMA_VERSION = 1

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
# Rewritten for the proxy, or describing the source only (the toy's card holds its accuracy).
_NOT_COPIED = {"config.json", "model.safetensors.index.json", MANIFEST, "toy_card.json"}


def copy_side_files(source: Path, out: Path) -> list[str]:
    """Copy tokenizer, chat-template and other non-weight files the proxy needs unchanged."""
    copied = []
    for file in sorted(source.iterdir()):
        wanted = file.is_file() and file.name not in _NOT_COPIED and not file.name.endswith(_WEIGHT_SUFFIXES)
        if wanted and not (out / file.name).exists():  # save_pretrained already wrote generation_config
            shutil.copy2(file, out / file.name)
            copied.append(file.name)
    return copied


def make_manifest(
    source: Path,
    model: PreTrainedModel,
    proxy: PreTrainedModel | PretrainedConfig,
    selection: Selection,
) -> dict[str, Any]:
    """``moescope.json``: how the proxy was made, in original expert indices (``proxy``: the
    proxy model or its config)."""
    moe = adapt(model)
    cut_config = getattr(proxy, "config", proxy)
    return {
        "kind": MANIFEST_KIND,
        "schema_version": SCHEMA_VERSION,
        "moescope_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": {
            "path": str(source),
            "model_type": model.config.model_type,
            "config_hash": config_hash(model.config),
            "num_experts": moe.num_experts,
        },
        "proxy": {
            "config_hash": config_hash(cut_config),
            "num_experts": selection.keep,
            "count_key": moe.spec.count_key,
            "top_k": moe.top_k,
            "n_group": moe.rule.n_group,
            "topk_group": moe.rule.topk_group,
            "weight_semantics": weight_semantics(moe.rule),
        },
        "method": selection.method,
        "view": selection.view,
        "keep": selection.keep,
        "keep_ratio": selection.keep_ratio,
        "seed": selection.seed,
        "loop_times": loop_times_of(model.config),
        "layers": [
            {"layer": entry.layer, "kept": list(entry.kept), "labels": list(entry.labels)}
            for entry in selection.layers
        ],
        "selection": json.loads(selection.to_json()),
        "versions": library_versions(),
    }


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    return path


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    """The proxy manifest of a checkpoint directory, or ``None`` for a model that is no proxy."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise MoescopeError(f"{path} is not valid JSON ({err}); export the proxy again.") from None
    if data.get("kind") != MANIFEST_KIND:
        raise MoescopeError(f"{path} is not a moescope proxy manifest; export the proxy again.")
    return data


def manifest_summary(directory: str | Path) -> pd.Series:
    """How the proxy in ``directory`` was made, in a few lines: method, view, experts kept per
    layer of the source's, the routing-weight semantics and the files beside the weights.

    Example
    -------
    >>> import tempfile
    >>> from moescope.export.pipeline import export_proxy
    >>> out = Path(tempfile.mkdtemp()) / "proxy"
    >>> _ = export_proxy("toy", out, keep=0.5, method="random", fidelity=False, progress=False)
    >>> manifest_summary(out)["kept per layer"]
    '16 of 32'
    """
    import pandas as pd

    manifest = read_manifest(directory)
    if manifest is None:
        raise MoescopeError(f"{directory} holds no {MANIFEST}; pass a proxy directory from export_proxy.")
    summary = {
        "method": manifest["method"],
        "view": manifest["view"],
        "kept per layer": f"{manifest['keep']} of {manifest['source']['num_experts']}",
        "routing weights on unchanged choices": manifest["proxy"]["weight_semantics"],
        "files": ", ".join(sorted(p.name for p in Path(directory).iterdir())),
    }
    return pd.Series(summary, name="proxy", dtype=object)  # object: a view of None stays None


def find_proxy(proxy: str | Path, default: str | Path) -> Path | None:
    """The proxy checkpoint a notebook parameter names: ``"auto"`` is ``default`` (where notebook 02
    writes it), ``""`` is none, anything else a directory. A directory without a checkpoint gives
    ``None`` and a warning saying how to make one, so a report still runs, without the comparison.

    >>> find_proxy("", "moescope-out/proxy") is None
    True
    """
    if proxy == "":
        return None
    path = Path(default if proxy == "auto" else proxy)
    if (path / "config.json").is_file():
        return path
    warnings.warn(
        f"no proxy checkpoint at {path}: export one first (notebook 02 or `moescope export`), "
        "or pass another proxy directory.",
        stacklevel=2,
    )
    return None
