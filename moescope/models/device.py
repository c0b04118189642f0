"""Where a model computes and in what precision: ``--device`` and ``--dtype``, checked once.

An export (or any caller) names a device and a dtype, or leaves them out; :func:`choose_compute`
turns that into a :class:`Compute` before any weight is read, refusing in one sentence a device
torch does not know or does not see, and a dtype the device cannot run. The defaults:

- **device**: the GPU when torch sees one (``"cuda"``: every GPU, the model placed over them by
  accelerate where there are several), else the CPU.
- **dtype**: :func:`default_dtype`, the one rule: bfloat16 on a GPU that multiplies it natively
  (CUDA compute capability 8 or above: A100, H100, ...); on an older GPU float16 where the
  checkpoint is float16, else float32 (its bfloat16 is emulated, and a bfloat16-trained model
  can overflow float16); on the CPU the checkpoint's own dtype (``"auto"``, what
  ``from_pretrained(dtype="auto")`` gives: float32 for the embedded models), so every CPU run
  is what it was before the flags existed.

torch is imported inside the functions: the command line builds its config (and these checks'
names) without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError

if TYPE_CHECKING:
    import torch

AUTO_DTYPE = "auto"
"""The checkpoint's own dtype (``from_pretrained``'s ``dtype="auto"``)."""

DTYPES = ("float32", "bfloat16", "float16")
"""The compute dtypes a ``--dtype`` may name (``fp32``, ``bf16``, ``fp16`` also read)."""

_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
NATIVE_BF16_CAPABILITY = (8, 0)
"""CUDA compute capability from which a GPU multiplies bfloat16 natively (Ampere)."""


@dataclass(frozen=True)
class Compute:
    """Where a model computes and in what dtype, as the manifest records it.

    ``device``: ``"cpu"``, ``"cuda:N"`` (one GPU) or ``"cuda"`` (every GPU torch sees, the model
    placed over them by accelerate). ``dtype``: one of :data:`DTYPES`, or ``"auto"``, the
    checkpoint's own. ``why``: the choice in words (given, or the default and its reason).
    """

    device: str
    dtype: str
    why: str

    @property
    def spread(self) -> bool:
        """Whether the model is placed over several GPUs (accelerate's ``device_map="auto"``)."""
        return self.device == "cuda" and gpu_count() > 1

    @property
    def main_device(self) -> str:
        """The device inputs go to and a one-device model (a proxy, a resident layer) lives on."""
        return "cuda:0" if self.device == "cuda" else self.device

    def torch_dtype(self) -> torch.dtype | str:
        """What ``from_pretrained`` takes as ``dtype``: a torch dtype, or ``"auto"``."""
        import torch

        return self.dtype if self.dtype == AUTO_DTYPE else getattr(torch, self.dtype)

    def load_options(self, max_memory: int | None = None) -> dict[str, Any]:
        """``from_pretrained``'s placement keywords: none on the CPU (loaded as always), the GPU
        as ``device_map``, or, over several GPUs, ``device_map="auto"`` with ``max_memory`` per
        GPU (``max_memory`` bytes each where given, else accelerate's default: what each has free)."""
        if self.device == "cpu":
            return {}
        if not self.spread:
            return {"device_map": self.main_device}
        options: dict[str, Any] = {"device_map": "auto"}
        if max_memory is not None:
            options["max_memory"] = dict.fromkeys(range(gpu_count()), max_memory)
        return options

    def to_dict(self) -> dict[str, str]:
        return {"device": self.device, "dtype": self.dtype, "compute_why": self.why}


ON_CPU = Compute("cpu", AUTO_DTYPE, "the CPU, in the checkpoint's own dtype")
"""Where a caller that names no device runs: what every export did before ``--device``."""


def choose_compute(
    device: str | None = None, dtype: str | None = None, *, stored: str | None = None
) -> Compute:
    """The device and dtype a model runs on: the ones given, checked, else the defaults.

    ``stored`` is the checkpoint's own dtype name (its config's ``dtype``), which the rule of
    :func:`default_dtype` reads on an older GPU.

    Example
    -------
    >>> choose_compute("cpu").dtype, choose_compute("cpu", "bf16").dtype
    ('auto', 'bfloat16')
    """
    named = check_device(device) if device is not None else default_device()
    how = "given" if device is not None else ("a GPU is present" if named != "cpu" else "no GPU present")
    if dtype is None:
        chosen, why = default_dtype(named, stored)
        return Compute(named, chosen, f"device {named} ({how}); {why}")
    chosen = check_dtype(named, dtype)
    return Compute(named, chosen, f"device {named} ({how}); dtype {chosen} (given)")


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    return "cuda" if gpu_count() else "cpu"


def default_dtype(device: str, stored: str | None = None) -> tuple[str, str]:
    """The compute dtype for ``device`` when none is asked for, with the reason in words.

    The one rule: bfloat16 where the device multiplies it natively (a CUDA GPU of compute
    capability 8.0 or above), half the memory of float32 at tensor-core speed; on an older GPU
    float16 for a float16 checkpoint, else float32 (bfloat16 is emulated there, and a model
    trained in bfloat16 can overflow float16's range); on the CPU the checkpoint's own dtype,
    so an export on a machine without a GPU is the one it always was (float32 for a float32
    checkpoint, such as the embedded models). ``stored``: the checkpoint's dtype name.

    Example
    -------
    >>> default_dtype("cpu")
    ('auto', "the checkpoint's own dtype on the CPU")
    """
    if device == "cpu":
        return AUTO_DTYPE, "the checkpoint's own dtype on the CPU"
    capability = _capability(device)
    shown = ".".join(map(str, capability))
    if capability >= NATIVE_BF16_CAPABILITY:
        return "bfloat16", f"bfloat16, native on compute capability {shown}"
    if stored == "float16":
        return "float16", f"float16 as stored (compute capability {shown} has no native bfloat16)"
    return "float32", f"float32 (compute capability {shown} has no native bfloat16)"


def check_device(device: str) -> str:
    """``device`` as moescope names it (``"cpu"``, ``"cuda"``, ``"cuda:N"``), refused in one
    sentence where torch does not know it or does not see it here."""
    text = device.strip().lower()
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu"
    if kind not in ("cuda", "gpu") or (index and not index.isdigit()):
        raise MoescopeError(
            f"unknown device {device!r}; give cpu, cuda (every GPU) or cuda:N (one GPU), or leave "
            "--device out (a GPU when one is present, else the CPU)."
        )
    count = gpu_count()
    if not count:
        raise MoescopeError(
            f"--device {device} asks for a GPU, and torch sees none on this machine (no CUDA device, "
            "or a CPU-only torch); give --device cpu, or leave --device out."
        )
    if index and int(index) >= count:
        raise MoescopeError(
            f"--device {device} names GPU {index}, and torch sees {count} (cuda:0 to cuda:{count - 1}); "
            "name one of those, or cuda for all of them."
        )
    return f"cuda:{int(index)}" if index else "cuda"


def check_dtype(device: str, dtype: str) -> str:
    """``dtype`` as one of :data:`DTYPES` (or ``"auto"``), refused in one sentence where it is
    no compute dtype, or where ``device`` cannot run it (bfloat16 on a GPU below compute
    capability 8.0). The CPU runs all three (float16 and bfloat16 forwards, sampling and
    backwards were run on one)."""
    name = _ALIASES.get(dtype.strip().lower(), dtype.strip().lower())
    if name == AUTO_DTYPE:
        return name
    if name not in DTYPES:
        raise MoescopeError(
            f"--dtype {dtype} is no compute dtype moescope runs a model in; give one of "
            f"{', '.join(DTYPES)}, or auto (the checkpoint's own)."
        )
    if name == "bfloat16" and device != "cpu":
        capability = _capability(device)
        if capability < NATIVE_BF16_CAPABILITY:
            shown = ".".join(map(str, capability))
            raise MoescopeError(
                f"{_gpu_name(device)} (compute capability {shown}) has no bfloat16 arithmetic; give "
                "--dtype float16 or float32, or leave --dtype out."
            )
    return name


def device_memory(compute: Compute) -> int | None:
    """Bytes the weights may take on ``compute``'s GPUs (what they have free, summed over the
    GPUs a spread model uses); ``None`` on the CPU, whose budget is the memory available."""
    if compute.device == "cpu":
        return None
    import torch

    indices = range(gpu_count()) if compute.spread else [int(compute.main_device.partition(":")[2])]
    return sum(torch.cuda.mem_get_info(index)[0] for index in indices)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _capability(device: str) -> tuple[int, int]:
    """Compute capability of ``device``'s GPU (for ``"cuda"``, the least of them all: accelerate
    places layers on every one, so each must run the dtype)."""
    import torch

    indices = range(gpu_count()) if device == "cuda" else [int(device.partition(":")[2] or 0)]
    return min(tuple(torch.cuda.get_device_capability(index)) for index in indices)  # type: ignore[return-value]


def _gpu_name(device: str) -> str:
    import torch

    index = int(device.partition(":")[2] or 0)
    return f"{device} ({torch.cuda.get_device_name(index)})"


def free_memory(model: Any) -> int:
    """Bytes free where ``model`` computes: its GPU's free memory for a model on a GPU (what a
    layer-sequential pass sizes its batches by, the activations living there), else the memory
    available to this process."""
    from moescope._util.memory import available_memory
    from moescope.models.resident import execution_device

    device = execution_device(model)
    if device.type != "cuda":
        return available_memory()
    import torch

    return int(torch.cuda.mem_get_info(device)[0])
