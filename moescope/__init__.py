"""moescope: cheap proxy models of Mixture-of-Experts LLMs for reproducing RL post-training failures.

The package is a thin library over stock ``transformers`` classes. Heavy submodules are
imported on first use, so ``import moescope`` stays fast and the command line starts quickly.
"""

from __future__ import annotations

import importlib
from typing import Any

from moescope.errors import MoescopeError

__version__ = "0.1.0"

# public name -> submodule that defines it (imported lazily: torch/transformers cost ~5 s)
_LAZY = {
    "ArchSpec": "moescope.arch",
    "MoEModel": "moescope.arch",
    "adapt": "moescope.arch",
    "supported_architectures": "moescope.arch",
    "load_model": "moescope.loading",
    "resolve_model": "moescope.loading",
    "summarize": "moescope.summary",
    "ModelSummary": "moescope.summary",
    "tiny": "moescope.zoo",
    "toy_path": "moescope.toy",
    "load_toy": "moescope.toy",
    "toy_card": "moescope.toy",
    "write_toy": "moescope.toy",
    "evaluate_tasks": "moescope.evaluation",
    "RoutingStats": "moescope.routing",
    "collect_routing": "moescope.routing",
    "observe_routing": "moescope.routing",
    "ExpertEmbeddings": "moescope.embeddings",
    "embed_experts": "moescope.embeddings",
    "ExpertClusterer": "moescope.clustering",
    "Selection": "moescope.clustering",
    "select_experts": "moescope.clustering",
    "parse_keep": "moescope.keep",
    "run_report": "moescope.report",
    "export_proxy": "moescope.proxy",
    "build_proxy": "moescope.proxy",
    "cost_table": "moescope.cost",
    "ModelShape": "moescope.cost",
    "TrainingMemory": "moescope.cost",
    "reference_models": "moescope.cost",
    "ExpertMap": "moescope.widgets",
    "RoutingHistogram": "moescope.widgets",
    "setup_notebook": "moescope._notebook",
    "replay": "moescope.replay",
    "diagnose": "moescope.diagnosis",
    "Finding": "moescope.findings",
    "compare": "moescope.verdict",
    "read_log": "moescope.readers",
    "TraceBoard": "moescope.widgets",
    "EntropyFlow": "moescope.widgets",
    "ReplayConfig": "moescope.replay",
    "read_trace": "moescope.traces",
    "Trace": "moescope.traces",
}

__all__ = ["MoescopeError", "__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'moescope' has no attribute {name!r}")
