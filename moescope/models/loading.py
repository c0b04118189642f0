"""Finding, checking and loading a model given by name (``toy``, ``toy-v3``) or as a checkpoint directory.

Every entry point (CLI, notebooks, library) goes through here, so a wrong path, a directory
that is not a checkpoint, a truncated safetensors file or a dense model fails the same way:
one :class:`~moescope.errors.ModelLoadError` sentence naming the problem and the fix, raised
*before* any weight is read. Weights are only ever read from safetensors, and remote code is
never run.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.errors import ModelLoadError
from moescope.models.embedded import EMBEDDED, embedded_path, is_embedded

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

_NAMES = " or ".join(repr(name) for name in EMBEDDED)
INDEX_FILE = "model.safetensors.index.json"


def resolve_model(model: str | Path) -> Path:
    """The checkpoint directory for ``model`` (an embedded model's name or a path), checked to hold a config.

    Raises
    ------
    ModelLoadError
        When the path is missing, is a file, or holds no readable ``config.json``.
    """
    if is_embedded(model):
        return embedded_path(str(model))
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"no such model directory: {path}; pass a local Hugging Face checkpoint directory or {_NAMES}."
        )
    if path.is_file():
        raise ModelLoadError(
            f"{path} is a file; pass the checkpoint directory that holds config.json and the weights."
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(
            f"{path} has no config.json, so it is not a Hugging Face checkpoint; pass the directory "
            f"that save_pretrained wrote (or {_NAMES})."
        )
    _read_json(config_file)
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not valid JSON ({exc}); restore it from the original checkpoint."
        ) from None


def load_config(model: str | Path) -> PretrainedConfig:
    """The model's config, with moescope's architecture checks applied (no weights read)."""
    from transformers import AutoConfig

    from moescope.models.support import language_config  # torch: Selection and report import this module

    path = resolve_model(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        model_type = _read_json(path / "config.json").get("model_type", "?")
        raise ModelLoadError(
            f"transformers cannot read {path}/config.json (model_type '{model_type}': {_first_line(exc)}); "
            "moescope loads stock transformers architectures only and never runs remote code."
        ) from None
    check_routing(language_config(config), path)  # dense or unknown architectures fail here too
    return config


def check_routing(config: PretrainedConfig, path: Path | str = "the model") -> None:
    """Refuse a config whose routing numbers contradict each other, which the model's own forward
    would only meet as an indexing error: top-k outside 1 to the expert count, groups that do not
    divide the experts, more groups chosen than exist, or fewer experts in them than top-k."""
    from moescope.models.support import spec_for

    spec = spec_for(config)
    experts, rule = spec.num_experts(config), spec.rule(config)
    problems = (
        (not 1 <= rule.top_k <= experts, f"{spec.topk_key}={rule.top_k} with {experts} experts"),
        (rule.n_group < 1 or experts % rule.n_group, f"n_group={rule.n_group} groups of {experts} experts"),
        (not 1 <= rule.topk_group <= rule.n_group, f"topk_group={rule.topk_group} of n_group={rule.n_group}"),
        (
            rule.n_group > 1 and rule.top_k > rule.topk_group * (experts // rule.n_group),
            f"{spec.topk_key}={rule.top_k} from {rule.topk_group} groups of {experts // rule.n_group}",
        ),
    )
    for bad, what in problems:
        if bad:
            raise ModelLoadError(
                f"{path}/config.json routes {what}, which its own forward pass cannot run; use the "
                "config.json that was saved with these weights."
            )


def check_builds(model: str | Path) -> None:
    """Build the model its config describes on the meta device (no memory, no weight read), so a
    config transformers accepts but cannot build (an unknown activation, a zero layer step) fails
    in one sentence before anything is read rather than in the middle of a pass."""
    import torch

    from moescope.models.layer_weights import meta_model

    config = load_config(model)
    try:
        meta_model(config, torch.float32)
    except Exception as exc:
        raise _unbuildable(resolve_model(model), exc) from None


def _unbuildable(path: Path, exc: BaseException) -> ModelLoadError:
    return ModelLoadError(
        f"transformers cannot build the model {path}/config.json describes ({type(exc).__name__}: "
        f"{_first_line(exc)}); use the config.json that was saved with these weights."
    )


def probe_forward(model: PreTrainedModel, path: Path, where: str = "cpu") -> None:
    """Run the model's own forward once on four tokens, with nothing of moescope attached, so a
    checkpoint whose forward pass raises (a config that contradicts its weights, a dtype the
    device cannot run) fails in one sentence before any pass, rather than as a traceback in one.
    ``where`` names the device and dtype for the message."""
    import torch

    from moescope.models.resident import execution_device

    vocabulary = model.get_input_embeddings().num_embeddings
    ids = torch.tensor([[1, 2, 3, 4]], device=execution_device(model)) % vocabulary
    try:
        with torch.no_grad():
            model(input_ids=ids)
    except (RuntimeError, ValueError, IndexError, KeyError, TypeError, AssertionError) as exc:
        raise ModelLoadError(
            f"the model in {path} fails its own forward pass on {where} ({type(exc).__name__}: "
            f"{_first_line(exc)}); use the config.json saved with these weights, or another --device "
            "or --dtype."
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint, via its index when sharded."""
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index} has no weight_map; restore it from the original checkpoint.")
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(
                f"{index} names {', '.join(missing)}, which is missing from {path}; copy the missing "
                "shard(s) from the original checkpoint."
            )
        return files
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise ModelLoadError(
            f"{path} holds pickled weights (*.bin/*.pt) only; moescope reads safetensors only — convert "
            "with `model.save_pretrained(dir, safe_serialization=True)` in a trusted environment."
        )
    raise ModelLoadError(f"{path} has a config but no *.safetensors weights; copy the weights next to it.")


def check_weights(path: Path) -> list[Path]:
    """Open every safetensors header; a truncated or corrupted file fails here, by name."""
    from safetensors import SafetensorError, safe_open

    files = weight_files(path)
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(
                f"{file} is corrupted or truncated ({_first_line(exc)}); re-download or re-copy that file."
            ) from None
    return files


def load_model(
    model: str | Path,
    *,
    dtype: torch.dtype | None = None,
    experts_implementation: str | None = None,
    with_tokenizer: bool = True,
    device_map: Any = None,
    max_memory: dict[int | str, int] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Load ``model`` (an embedded model's name or a checkpoint directory) for analysis, in eval mode.

    Parameters
    ----------
    dtype : compute dtype; float32 by default (analysis on CPU). Routers that a model keeps
        in float32 stay so (transformers' ``_keep_in_fp32_modules``).
    experts_implementation : ``"eager"`` or ``"grouped_mm"``; transformers' default otherwise.
    with_tokenizer : also load the tokenizer when the directory has one (else ``None``).
    device_map, max_memory : ``from_pretrained``'s placement (a device such as ``"cuda:0"``, or
        ``"auto"`` with bytes per GPU: :meth:`~moescope.models.device.Compute.load_options`);
        the CPU when not given.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = load_config(model)
    path = resolve_model(model)
    check_weights(path)
    kwargs: dict[str, Any] = {"dtype": dtype or torch.float32, "trust_remote_code": False}
    if experts_implementation:
        kwargs["experts_implementation"] = experts_implementation
    if device_map is not None:
        kwargs.update(device_map=device_map, max_memory=max_memory)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = AutoModelForCausalLM.from_pretrained(
                path, config=config, local_files_only=True, **kwargs
            )
    except (RuntimeError, ValueError, OSError) as exc:
        raise ModelLoadError(
            f"the weights in {path} do not match its config.json ({_first_line(exc)}); use the config "
            "that was saved with these weights."
        ) from None
    except (KeyError, TypeError, AttributeError, ZeroDivisionError, IndexError) as exc:
        raise _unbuildable(path, exc) from None
    return loaded.eval(), (load_tokenizer(path) if with_tokenizer else None)


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase | None:
    """The checkpoint's tokenizer, or ``None`` when it ships none."""
    from transformers import AutoTokenizer

    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
