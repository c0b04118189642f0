"""Shared test set-up: offline, quiet, deterministic, and the tiny-model fixtures."""

from __future__ import annotations

import os
import tempfile
import warnings

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# The original's measured accuracy is kept for later exports; the suite keeps it to itself.
os.environ["MOESCOPE_CACHE"] = tempfile.mkdtemp(prefix="moescope-cache-")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# OpenMP threads that spin while they wait take the cores a CLI subprocess or a second process
# needs: on 2 busy cores a toy export ran 10x slower. Passive waiting costs nothing measurable alone.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

# Under pytest-xdist each worker takes its share of the cores; alone, the suite takes two.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // _WORKERS))
warnings.filterwarnings("ignore", module="transformers")

# Modules holding the longest tests (the whole report, 4 min; notebooks in JupyterLab; TRL runs;
# CLI exports), started first so that under pytest-xdist none is left to run alone at the end.
# Each module stays in one piece, so its module fixtures are set up once.
LONGEST_FIRST = (
    "test_report.py",
    "test_browser.py",
    "test_docs.py",
    "test_trl.py",
    "test_proxy.py",
    "test_multimodal.py",
    "test_replay_runs.py",
    "test_diagnosis.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and on shared busy cores OpenMP threads
    waiting for each other make every forward 10-100x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """Save a tiny model of an architecture once per session; returns a factory ``arch -> Path``."""
    from moescope.models.zoo import tiny

    cache: dict[tuple[str, bool], object] = {}

    def make(arch: str, *, fused: bool = False):
        key = (arch, fused)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"{arch}{'-fused' if fused else ''}")
            tiny(arch).save_pretrained(path, save_original_format=not fused)
            cache[key] = path
        return cache[key]

    return make


@pytest.fixture(scope="session")
def rl_rows():
    """A factory ``rows -> RLCalibration``: random rows of 8 ids under 128 (the tiny zoo's
    vocabulary), the first 5 the prompt and the last 3 its sampled completion (seeded)."""
    from moescope.explore.rl_data import RLCalibration

    def make(rows: int) -> RLCalibration:
        ids = torch.randint(3, 128, (rows, 8), generator=torch.Generator().manual_seed(1)).tolist()
        return RLCalibration(
            prompts=tuple(tuple(r[:5]) for r in ids),
            completions=tuple(tuple(r[5:]) for r in ids),
            seed=0,
            temperature=1.0,
            max_new_tokens=3,
        )

    return make


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium (else one on PATH), driven by Playwright, never a downloaded browser;
    ``CHROMIUM`` names another build (``make test`` sets it after checking it is there)."""
    import shutil
    from pathlib import Path

    debian_first = f"/usr/bin:{os.environ.get('PATH', '')}"
    found = os.environ.get("CHROMIUM") or shutil.which("chromium", path=debian_first)
    if not found or not Path(found).is_file():
        pytest.fail("browser tests need chromium: `sudo apt-get install chromium` (.ci/run does)")
    return found


# --- exploring clusters: results of a tiny model, and JupyterLab in a browser ------------------------


@pytest.fixture(scope="session")
def explore_results():
    """Routing stats, projected multiview embeddings and a 1/4 cluster selection of a tiny
    16-expert Qwen3-MoE, plus ``proxy``: the stats a faithful proxy of that selection would give
    (each kept expert takes its cluster's tokens, give or take 30 %)."""
    from types import SimpleNamespace

    import numpy as np

    from moescope.explore.clustering import select_experts
    from moescope.explore.embeddings import embed_experts
    from moescope.explore.routing import collect_routing
    from moescope.models.zoo import tiny

    model = tiny("qwen3_moe", num_local_experts=16)
    ids = torch.randint(3, 128, (8, 32), generator=torch.Generator().manual_seed(0))
    stats = collect_routing(model, ids, n_tokens=256, progress=False)
    embeddings = embed_experts(model, "multiview", stats=stats, progress=False).project("pca")
    selection = select_experts(embeddings, "1/4", stats=stats)
    rng = np.random.default_rng(0)
    proxy_counts = []
    for row, entry in enumerate(selection.layers):
        labels = np.asarray(entry.labels)
        cluster = np.array([stats.counts[row, labels == labels[e]].sum() for e in entry.kept])
        noisy = cluster * rng.uniform(0.7, 1.3, len(cluster))
        counts = np.floor(noisy / noisy.sum() * stats.n_tokens * stats.top_k).astype(np.int64)
        counts[0] += stats.n_tokens * stats.top_k - counts.sum()
        proxy_counts.append(counts)
    proxy = _routing_stats_from_counts(np.stack(proxy_counts), stats.layers, stats.top_k)
    return SimpleNamespace(stats=stats, embeddings=embeddings, selection=selection, proxy=proxy)


@pytest.fixture(scope="session")
def make_routing_stats():
    """``make(counts, layers=None, top_k=2)``: a ``RoutingStats`` with the given ``(L, E)`` counts."""
    return _routing_stats_from_counts


def _routing_stats_from_counts(counts, layers=None, top_k: int = 2):
    """A ``RoutingStats`` whose ``(L, E)`` routed-slot ``counts`` are given (other sums made up)."""
    import numpy as np

    from moescope.explore.routing import RoutingStats

    counts = np.asarray(counts, dtype=np.int64)
    n_layers, n_experts = counts.shape
    n_tokens = int(counts[0].sum()) // top_k
    return RoutingStats(
        model_type="synthetic",
        config_hash="synthetic",
        source="synthetic",
        layers=tuple(range(n_layers)) if layers is None else tuple(layers),
        num_experts=n_experts,
        top_k=top_k,
        n_tokens=n_tokens,
        counts=counts,
        prob_mass=counts / top_k,
        coactivation=np.zeros((n_layers, n_experts, n_experts), np.int64),
        saliency_sum=counts * 0.5,
        entropy_sum=np.zeros(n_layers),
        entropy_sq_sum=np.zeros(n_layers),
        entropy_hist=np.zeros((n_layers, 8), np.int64),
        entropy_edges=np.linspace(0.0, np.log(n_experts), 9),
        max_logit=np.zeros(n_layers),
        expert_max_logit=np.zeros((n_layers, n_experts)),
    )


# Calibration tokens of the notebooks JupyterLab serves, for the default's 20,000: the widgets
# draw whatever routing statistics they are given (the report runs notebook 01 on as many).
LAB_N_TOKENS = 4000


@pytest.fixture(scope="module")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory, chromium: str):
    """A JupyterLab server for this test module, serving a copy of the repository's notebooks
    (calibrating on ``LAB_N_TOKENS``).

    Its Jupyter directories and IPYTHONDIR are in a temporary directory; see tests/browser.py.
    """
    import re
    from pathlib import Path

    from browser import JupyterLab

    root = tmp_path_factory.mktemp("lab-root")
    for notebook in (Path(__file__).parents[1] / "notebooks").glob("*.ipynb"):
        text = re.sub(r"\b(n_tokens: int = )\d+", rf"\g<1>{LAB_N_TOKENS}", notebook.read_text())
        (root / notebook.name).write_text(text)
    with JupyterLab.serve(root, tmp_path_factory.mktemp("lab-home")) as lab:
        yield lab


@pytest.fixture
def lab_page(jupyter_lab, chromium: str):
    """A fresh chromium page on the module's JupyterLab; requests off 127.0.0.1 are blocked."""
    from browser import LabPage, chromium_page

    with chromium_page(chromium) as page:
        yield LabPage(jupyter_lab, page)


# --- replay traces ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def toy_trace(tmp_path_factory: pytest.TempPathFactory):
    """A real 6-step GRPO replay of the toy with a NaN injected at step 3 (``nan_op@3``)."""
    import moescope

    config = moescope.ReplayConfig(steps=6, prompts_per_step=4, group_size=4, faults=("nan_op@3",))
    return moescope.replay("toy", config, out=tmp_path_factory.mktemp("toy-trace") / "trace.jsonl")
