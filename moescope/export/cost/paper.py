"""The paper's cost table against the step-time model, row by row.

The paper measured two proxies on Ascend NPUs: Qwen3-30B-A3B (128 → 48 experts, 16 → 8 NPUs,
128.93 → 114.83 s per step) and DeepSeek-V3.2 (256 → 16 experts, 512 → 64 NPUs, ~50 → ~12 min).
:func:`paper_comparison` predicts both on the same device counts with
:func:`~moescope.export.cost.step.step_time` and sets the figures side by side. DeepSeek-V3.2
is costed as DeepSeek-V3, whose dimensions it keeps (its sparse-attention indexer adds under
1 % of the parameters).

:func:`published_comparison` checks the model against a full-size step measured by others with
its whole workload published: verl's DeepSeek-V3 GRPO benchmark on 96 H20 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from moescope.export.cost.memory import devices_needed, memory_of
from moescope.export.cost.profiles import DeviceProfile, device_profile
from moescope.export.cost.shape import reference_models
from moescope.export.cost.step import RLWorkload, step_time

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class PaperRow:
    """One measured row of the paper's cost table."""

    model: str  # the reference model costed
    label: str  # as the paper names it
    experts_kept: int
    devices: tuple[int, int]  # full, proxy
    step_s: tuple[float, float]  # full, proxy


PAPER_ROWS = (
    PaperRow("Qwen3-30B-A3B", "Qwen3-30B-A3B", 48, (16, 8), (128.93, 114.83)),
    PaperRow("DeepSeek-V3", "DeepSeek-V3.2", 16, (512, 64), (50 * 60.0, 12 * 60.0)),
)


@dataclass(frozen=True)
class PublishedStep:
    """A full-size model's RL step measured and published with its layout and workload."""

    source: str
    model: str  # the reference model costed
    device: str  # a built-in profile
    devices: int
    workload: RLWorkload
    step_s: float
    rollout_s: float


# verl docs/perf/dpsk.md (benchmark table) with examples/grpo_trainer/run_deepseek_v3_671b_vllm_megatron.sh:
# 96 prompts × 8, responses up to 8,192 tokens (mean 1,960 measured), vLLM at 60 % of memory
# with tensor parallelism 32, MFU 0.19 measured; prompts (DAPO-Math) taken as 256 tokens.
PUBLISHED_STEPS = (
    PublishedStep(
        "verl DeepSeek-V3 671B benchmark",
        "DeepSeek-V3",
        "h20",
        96,
        RLWorkload(
            prompts=96,
            samples_per_prompt=8,
            prompt_tokens=256,
            response_tokens=8192,
            mean_response_share=1960 / 8192,
            mfu=0.19,
            rollout_memory_fraction=0.6,
            weight_share=0.75,  # 1.34 TB of weights over the script's 32-way tensor parallelism
        ),
        1700.0,
        1050.0,
    ),
)


def published_comparison() -> pd.DataFrame:
    """Each published full-size step (:data:`PUBLISHED_STEPS`) measured and predicted: the step,
    the rollout, and ``factor`` = predicted ÷ measured step.

    Examples
    --------
    >>> published_comparison()[["model", "devices", "step_s"]].values.tolist()
    [['DeepSeek-V3', '96 × h20', 1700.0]]
    """
    import pandas as pd

    shapes = {shape.name: shape for shape in reference_models()}
    rows = []
    for run in PUBLISHED_STEPS:
        step = step_time(shapes[run.model], run.devices, device_profile(run.device), run.workload)
        rows.append(
            {
                "source": run.source,
                "model": run.model,
                "devices": f"{run.devices} × {run.device}",
                "step_s": run.step_s,
                "rollout_s": run.rollout_s,
                "step_predicted_s": step.total_s,
                "rollout_predicted_s": step.rollout_s,
                "factor": step.total_s / run.step_s,
                "layout": step.layout(),
                "workload": run.workload.text(),
            }
        )
    return pd.DataFrame(rows)


def paper_comparison(
    profile: DeviceProfile | str = "ascend-910b", workload: RLWorkload | None = None
) -> pd.DataFrame:
    """The paper's rows and the model's predictions on the paper's device counts.

    Columns: ``devices`` as the paper ran them and ``devices_model`` as the memory model would
    choose them (rounded up to a power of two), step seconds measured and predicted for the full
    model and the proxy, and the device-hour ratios (full ÷ proxy) with ``factor`` = predicted ÷
    measured ratio.

    Examples
    --------
    >>> table = paper_comparison()
    >>> table["label"].tolist(), table["ratio_paper"].round(2).tolist()
    (['Qwen3-30B-A3B', 'DeepSeek-V3.2'], [2.25, 33.33])
    """
    import pandas as pd

    profile = device_profile(profile)
    memory, shapes = memory_of(None, profile), {shape.name: shape for shape in reference_models()}
    rows = []
    for row in PAPER_ROWS:
        full = shapes[row.model]
        proxy = full.with_keep(row.experts_kept)
        (d_full, d_proxy), (s_full, s_proxy) = row.devices, row.step_s
        t_full = step_time(full, d_full, profile, workload).total_s
        t_proxy = step_time(proxy, d_proxy, profile, workload).total_s
        predicted = d_full * t_full / (d_proxy * t_proxy)
        measured = d_full * s_full / (d_proxy * s_proxy)
        rows.append(
            {
                "label": row.label,
                "experts": f"{full.routed_experts} → {row.experts_kept}",
                "devices": f"{d_full} → {d_proxy}",
                "devices_model": " → ".join(str(devices_needed(s, memory, "pow2")) for s in (full, proxy)),
                "step_paper_s": (s_full, s_proxy),
                "step_predicted_s": (t_full, t_proxy),
                "ratio_paper": measured,
                "ratio_predicted": predicted,
                "factor": predicted / measured,
            }
        )
    return pd.DataFrame(rows)
