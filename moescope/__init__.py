"""moescope: cheap proxy models of Mixture-of-Experts LLMs for reproducing RL post-training failures.

The top level holds the journey's verbs and result types, in the order a user meets them::

    model ─► collect_routing ─► embed_experts ─► select_experts ─► export_proxy ─► replay
          ─► read_log / diagnose ─► compare ─► widgets and the report

Everything else lives in its stage package, in the same order: ``moescope.models``,
``moescope.explore``, ``moescope.export``, ``moescope.replay``, ``moescope.analyze``,
``moescope.display``, ``moescope.report``. Names are imported on first use, so ``import
moescope`` stays fast (torch and transformers cost seconds) and the command line starts quickly.

>>> import moescope
>>> "export_proxy" in moescope.__all__
True
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from moescope._version import __version__
from moescope.errors import MoescopeError

# public name -> the stage module that defines it
_PUBLIC = {
    # models
    "load_model": "moescope.models.loading",
    "summarize": "moescope.models.summary",
    "load_toy": "moescope.models.toy",
    # explore
    "collect_routing": "moescope.explore.routing",
    "RoutingStats": "moescope.explore.stats",
    "embed_experts": "moescope.explore.embeddings",
    "ExpertEmbeddings": "moescope.explore.embeddings",
    "select_experts": "moescope.explore.clustering",
    "Selection": "moescope.explore.selection",
    # export
    "export_proxy": "moescope.export.pipeline",
    "ExportConfig": "moescope.export.config",
    "ExportResult": "moescope.export.result",
    "cost_table": "moescope.export.cost.table",
    # replay
    "replay": "moescope.replay",
    "ReplayConfig": "moescope.replay.config",
    "Trace": "moescope.traces",
    # analyze
    "read_log": "moescope.analyze.readers",
    "diagnose": "moescope.analyze.diagnosis",
    "Finding": "moescope.analyze.findings",
    "compare": "moescope.analyze.verdict",
    "compare_healthy": "moescope.analyze.verdict",
    "validate": "moescope.analyze.validation",
    # display and report
    "ExpertMap": "moescope.display.widgets",
    "RoutingHistogram": "moescope.display.widgets",
    "TraceBoard": "moescope.display.widgets",
    "EntropyFlow": "moescope.display.widgets",
    "setup_notebook": "moescope.display.notebook",
    "run_report": "moescope.report.pipeline",
}

# names the top level used to carry: still found, with a warning naming their stage module
_MOVED = {
    "ArchSpec": "moescope.models.table",
    "supported_architectures": "moescope.models.table",
    "MoEModel": "moescope.models.view",
    "adapt": "moescope.models.view",
    "resolve_model": "moescope.models.loading",
    "ModelSummary": "moescope.models.summary",
    "tiny": "moescope.models.zoo",
    "toy_path": "moescope.models.toy",
    "toy_card": "moescope.models.toy",
    "write_toy": "moescope.models.toy",
    "evaluate_tasks": "moescope.models.evaluation",
    "observe_routing": "moescope.explore.routing",
    "ExpertClusterer": "moescope.explore.clustering",
    "parse_keep": "moescope.keep",
    "build_proxy": "moescope.export.surgery",
    "ModelShape": "moescope.export.cost.shape",
    "TrainingMemory": "moescope.export.cost.memory",
    "device_profile": "moescope.export.cost.profiles",
    "RLWorkload": "moescope.export.cost.step",
    "step_time": "moescope.export.cost.step",
    "reference_models": "moescope.export.cost.shape",
    "read_trace": "moescope.traces",
}

__all__ = ["MoescopeError", "__version__", *sorted(_PUBLIC)]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    if name in _MOVED:
        home = _MOVED[name]
        warnings.warn(
            f"moescope.{name} moved to {home}; import it from there.", DeprecationWarning, stacklevel=2
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'moescope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
