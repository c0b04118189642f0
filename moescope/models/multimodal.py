"""Multimodal checkpoints whose language model is a supported MoE (e.g. Llama 4): moescope reads
and trains their language model, and writes the whole checkpoint back, so nothing the language
model does not hold (the vision tower, the projector) is lost.

transformers' ``AutoModelForCausalLM`` loads the language model alone from such a checkpoint, and
its ``save_pretrained`` would write that alone. A proxy whose language model changed in memory
(healing) is therefore written by loading the multimodal checkpoint with its stock class, putting
the language model's weights in, and saving that.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moescope.models.loading import load_config
from moescope.models.support import language_config

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def is_multimodal(path: str | Path) -> bool:
    """Whether the checkpoint holds more than the language model moescope reads."""
    config = load_config(path)
    return language_config(config) is not config


def save_with_language_model(whole: Path, language_model: PreTrainedModel, out: Path) -> None:
    """Write the multimodal checkpoint ``whole`` into ``out`` with ``language_model``'s weights
    in place of its own (same shapes: the same proxy, healed); every other part as it was."""
    model = _load_whole(whole)
    with torch.no_grad():
        model.get_decoder().load_state_dict(language_model.get_decoder().state_dict(), strict=True)
        model.get_output_embeddings().load_state_dict(language_model.get_output_embeddings().state_dict())
    model.save_pretrained(out)


def _load_whole(path: Path) -> Any:
    """The multimodal model, with transformers' image-text class for its config."""
    from transformers import AutoModelForImageTextToText

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForImageTextToText.from_pretrained(
            path, dtype="auto", trust_remote_code=False, local_files_only=True
        )
