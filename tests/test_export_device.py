"""Where an export computes: ``--device`` and ``--dtype``, the default rule (with ``torch.cuda``
faked where a GPU is needed), the placement over several GPUs, and real CPU runs in other dtypes."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from moescope.cli import main
from moescope.errors import MoescopeError
from moescope.export.gather import IN_MEMORY, LAYER_SEQUENTIAL, choose_placement
from moescope.export.manifest import read_manifest
from moescope.models import device as D
from moescope.models.loading import load_model

QUICK = ["--keep", "1/4", "--method", "frequency", "--calibration", "tasks", "--n-tokens", "500"]
QUICK += ["--no-fidelity", "--min-capability", "0"]


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """``gpus(count, capability)``: torch.cuda as a machine with that many GPUs of that compute
    capability would answer it."""

    def fake(count: int, capability: tuple[int, int] = (9, 0)) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Fake GPU")

    return fake


def test_without_a_gpu_the_default_is_the_cpu_in_the_checkpoints_dtype(gpus) -> None:
    gpus(0)
    compute = D.choose_compute()
    assert (compute.device, compute.dtype) == ("cpu", "auto")
    assert compute.torch_dtype() == "auto" and compute.load_options(10**9) == {}  # loaded as ever
    assert "no GPU present" in compute.why


@pytest.mark.parametrize(
    ("capability", "stored", "expected"),
    [
        ((9, 0), "float32", "bfloat16"),
        ((8, 0), "bfloat16", "bfloat16"),
        ((7, 5), "float16", "float16"),
        ((7, 0), "bfloat16", "float32"),
        ((6, 1), "float32", "float32"),
    ],
)
def test_the_default_dtype_on_a_gpu_is_bfloat16_where_it_is_native(
    gpus, capability: tuple[int, int], stored: str, expected: str
) -> None:
    gpus(1, capability)
    compute = D.choose_compute(stored=stored)
    assert (compute.device, compute.dtype, compute.torch_dtype()) == (
        "cuda",
        expected,
        getattr(torch, expected),
    )
    assert compute.load_options() == {"device_map": "cuda:0"} and not compute.spread


def test_several_gpus_are_placed_by_accelerate_with_max_memory_each(gpus) -> None:
    gpus(4)
    spread, one = D.choose_compute("cuda"), D.choose_compute("cuda:2", "fp16")
    assert spread.spread and spread.main_device == "cuda:0"
    assert spread.load_options(8 << 30) == {
        "device_map": "auto",
        "max_memory": dict.fromkeys(range(4), 8 << 30),
    }
    assert spread.load_options() == {"device_map": "auto"}  # accelerate's default: what each has free
    assert (one.device, one.dtype, one.load_options()) == ("cuda:2", "float16", {"device_map": "cuda:2"})
    # the budget is per GPU: 4 × 4 B hold an original of 10 B and its half proxy
    assert choose_placement(10, 0.5, streaming=None, max_memory=4, devices=4).mode == IN_MEMORY
    assert choose_placement(10, 0.5, streaming=None, max_memory=4, devices=1).mode == LAYER_SEQUENTIAL
    assert "GPU memory free" in choose_placement(10, 0.5, streaming=None, max_memory=None, available=9).why


@pytest.mark.parametrize(
    ("device", "dtype", "count", "capability", "says"),
    [
        ("cuda:4", None, 2, (9, 0), "names GPU 4, and torch sees 2 (cuda:0 to cuda:1)"),
        (
            "cuda",
            "bfloat16",
            1,
            (7, 0),
            "cuda (Fake GPU) (compute capability 7.0) has no bfloat16 arithmetic",
        ),
        ("cuda", None, 0, (9, 0), "asks for a GPU, and torch sees none"),
        ("npu", None, 1, (9, 0), "unknown device 'npu'"),
        ("cpu", "int4", 0, (9, 0), "--dtype int4 is no compute dtype"),
    ],
)
def test_a_device_or_dtype_that_cannot_run_is_one_sentence(
    gpus, device: str, dtype: str | None, count: int, capability: tuple[int, int], says: str
) -> None:
    gpus(count, capability)
    with pytest.raises(MoescopeError, match=r"; (give|name)") as caught:
        D.choose_compute(device, dtype)
    assert says in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("dtype", "max_memory"), [("bfloat16", None), ("float16", "4MB")])
def test_another_dtype_really_runs_on_the_cpu_and_writes_its_proxy(
    dtype: str, max_memory: str | None, tmp_path: Path, capsys
) -> None:
    """bfloat16 and float16 both run on a CPU (forward passes and, layer-sequentially, the shard
    cut); the manifest and the console say where and in what, the proxy is written in it."""
    budget = ["--max-memory", max_memory] if max_memory else []
    argv = ["export", "toy", *QUICK, *budget, "--device", "cpu", "--dtype", dtype]
    assert main([*argv, "--out", str(tmp_path / "p")]) == 0
    original = read_manifest(tmp_path / "p")["original"]
    assert (original["device"], original["dtype"]) == ("cpu", dtype)
    assert original["read"] == (LAYER_SEQUENTIAL if max_memory else IN_MEMORY)
    assert f"compute: cpu, {dtype} (device cpu (given); dtype {dtype} (given))" in capsys.readouterr().out
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proxy, _ = load_model(tmp_path / "p", dtype="auto", with_tokenizer=False)
    if not max_memory:  # computed in dtype, written in it; a cut from the shards keeps the stored float32
        assert config["dtype"] == dtype and proxy.dtype == getattr(torch, dtype)


def test_the_default_export_records_the_cpu_and_the_checkpoints_own_dtype(tmp_path: Path) -> None:
    from moescope.export.pipeline import export_proxy

    options = {"keep": "1/4", "method": "random", "fidelity": False, "min_capability": 0, "progress": False}
    result = export_proxy("toy", tmp_path / "p", **options)
    original = result.manifest["original"]
    assert (original["device"], original["dtype"]) == ("cpu", "float32")
    assert result.manifest["config"]["device"] is None and result.manifest["config"]["dtype"] is None


def test_a_pass_on_a_gpu_sizes_its_batches_by_the_gpus_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The activations of a layer-sequential pass on a GPU live there: its free memory bounds a
    batch, not the host's (which stays the bound on the CPU)."""
    from moescope._util import memory
    from moescope.models.zoo import tiny

    model = tiny("mixtral")
    monkeypatch.setattr(memory, "available_memory", lambda: 7)
    assert D.free_memory(model) == 7
    monkeypatch.setattr("moescope.models.resident.execution_device", lambda _: torch.device("cuda", 1))
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda device: (11 if device == torch.device("cuda", 1) else 0, 99)
    )
    assert D.free_memory(model) == 11
