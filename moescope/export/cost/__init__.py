"""Accelerator cost: how many devices RL post-training of a model needs, full vs proxy.

``sources`` reads a checkpoint or config, ``formulas`` counts parameters from published
dimensions, ``shape`` holds a model's dimensions and parameters by role (:class:`ModelShape`),
``memory`` the bytes per parameter of each training state and the devices they fill (the
assumptions, and what the model ignores, are written there), ``profiles`` the accelerators and
``step`` the time of one RL step on them (rollout, training, all-to-all, pipeline bubble,
optimizer, weight sync), ``paper`` the paper's cost table against it, ``assumptions`` their
``KEY=VALUE`` overrides, ``table`` the full-vs-proxy table, ``render`` its text and JSON, and
``report`` the table with its assumptions (:class:`CostReport`, what ``moescope cost`` prints).

Parameters are counted exactly for a Hugging Face config (the model is built on the ``meta``
device, no weight read; :mod:`moescope.models.summary`) and by the analytic formulas of
:func:`analytic_params` for the published models of ``moescope/data/moe_configs.json``.

Examples
--------
>>> from moescope.export.cost import cost_table, reference_models
>>> table = cost_table(reference_models()[5])  # DeepSeek-V3
>>> table["devices"].tolist(), table["reduction_pct"].round(1).tolist()
([267, 137, 72, 40], [0.0, 48.7, 73.0, 85.0])
"""

from __future__ import annotations

from moescope.export.cost.formulas import analytic_params, entry_from_config
from moescope.export.cost.memory import ROUNDINGS, TrainingMemory, devices_needed, memory_breakdown
from moescope.export.cost.paper import PAPER_ROWS, PUBLISHED_STEPS, paper_comparison, published_comparison
from moescope.export.cost.profiles import PROFILES, DeviceProfile, device_profile
from moescope.export.cost.render import cost_json, cost_text
from moescope.export.cost.report import CostReport, cost_report
from moescope.export.cost.shape import ModelShape, reference_entries, reference_models
from moescope.export.cost.step import RLWorkload, StepTime, step_time
from moescope.export.cost.table import DEFAULT_KEEPS, cost_table, reference_table

__all__ = [
    "DEFAULT_KEEPS",
    "PAPER_ROWS",
    "PROFILES",
    "PUBLISHED_STEPS",
    "ROUNDINGS",
    "CostReport",
    "DeviceProfile",
    "ModelShape",
    "RLWorkload",
    "StepTime",
    "TrainingMemory",
    "analytic_params",
    "cost_json",
    "cost_report",
    "cost_table",
    "cost_text",
    "device_profile",
    "devices_needed",
    "entry_from_config",
    "memory_breakdown",
    "paper_comparison",
    "published_comparison",
    "reference_entries",
    "reference_models",
    "reference_table",
    "step_time",
]
