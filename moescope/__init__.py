"""moescope: cheap proxy models of Mixture-of-Experts LLMs for reproducing RL post-training failures.

The package is a thin library over stock ``transformers`` classes. Heavy submodules are
imported on first use, so ``import moescope`` stays fast and the command line starts quickly.
"""

from __future__ import annotations

import importlib
from typing import Any

from moescope._version import __version__
from moescope.errors import MoescopeError

# public name -> submodule that defines it (imported lazily: torch/transformers cost ~5 s)
_LAZY = {
    "ArchSpec": "moescope.models.arch",
    "MoEModel": "moescope.models.arch",
    "adapt": "moescope.models.arch",
    "supported_architectures": "moescope.models.arch",
    "load_model": "moescope.models.loading",
    "resolve_model": "moescope.models.loading",
    "summarize": "moescope.models.summary",
    "ModelSummary": "moescope.models.summary",
    "tiny": "moescope.models.zoo",
    "toy_path": "moescope.models.toy",
    "load_toy": "moescope.models.toy",
    "toy_card": "moescope.models.toy",
    "write_toy": "moescope.models.toy",
    "evaluate_tasks": "moescope.models.evaluation",
    "RoutingStats": "moescope.explore.routing",
    "collect_routing": "moescope.explore.routing",
    "observe_routing": "moescope.explore.routing",
    "ExpertEmbeddings": "moescope.explore.embeddings",
    "embed_experts": "moescope.explore.embeddings",
    "ExpertClusterer": "moescope.explore.clustering",
    "Selection": "moescope.explore.clustering",
    "select_experts": "moescope.explore.clustering",
    "parse_keep": "moescope.keep",
    "run_report": "moescope.report.pipeline",
    "export_proxy": "moescope.proxy",
    "build_proxy": "moescope.proxy",
    "cost_table": "moescope.export.cost.model",
    "ModelShape": "moescope.export.cost.model",
    "TrainingMemory": "moescope.export.cost.model",
    "reference_models": "moescope.export.cost.model",
    "ExpertMap": "moescope.display.widgets",
    "RoutingHistogram": "moescope.display.widgets",
    "setup_notebook": "moescope.display.notebook",
    "replay": "moescope.replay",
    "diagnose": "moescope.analyze.diagnosis",
    "Finding": "moescope.analyze.findings",
    "compare": "moescope.analyze.verdict",
    "read_log": "moescope.analyze.readers",
    "TraceBoard": "moescope.display.widgets",
    "EntropyFlow": "moescope.display.widgets",
    "ReplayConfig": "moescope.replay",
    "read_trace": "moescope.traces",
    "Trace": "moescope.traces",
}

__all__ = ["MoescopeError", "__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'moescope' has no attribute {name!r}")
