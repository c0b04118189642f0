"""The trace format: header, one line per step, exact NaN/Inf round trip, crash-safe reading."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from moescope.errors import MoescopeError
from moescope.traces import TraceWriter, read_trace


def test_non_finite_values_round_trip_exactly(tmp_path: Path) -> None:
    values = [float("nan"), float("inf"), -float("inf"), -0.0, 1e-310, 0.1 + 0.2, 2.0**70]
    with TraceWriter(tmp_path / "t.jsonl", {"model": "toy", "config": {"lr": 1e-5}}) as writer:
        for step, value in enumerate(values):
            writer.write_step(step, {"actor/loss": value, "moe/expert_load": [[value, 1.0]]})
    trace = read_trace(tmp_path / "t.jsonl")
    assert trace.header["model"] == "toy" and trace.header["config"] == {"lr": 1e-5}
    for step, value in zip(trace.steps, values, strict=True):
        got = step["actor/loss"]
        if math.isnan(value):
            assert math.isnan(got) and math.isnan(step["moe/expert_load"][0][0])
        else:
            assert got == value and math.copysign(1, got) == math.copysign(1, value)
    assert trace.to_frame().index.tolist() == list(range(len(values)))


def test_a_line_cut_by_a_crash_is_skipped_and_resume_truncates(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, {"model": "toy"}) as writer:
        for step in range(4):
            writer.write_step(step, {"actor/loss": float(step)})
    with path.open("a") as handle:
        handle.write('{"kind": "step", "step": 4, "actor/lo')  # the step in flight when killed
    trace = read_trace(path)
    assert len(trace) == 4 and "cut short" in trace.notes[0]
    with TraceWriter(path, {"model": "ignored"}, resume=True, resume_from=2) as writer:
        writer.write_step(2, {"actor/loss": 20.0})
    trace = read_trace(path)
    assert [s["step"] for s in trace.steps] == [0, 1, 2] and trace.steps[2]["actor/loss"] == 20.0
    assert trace.header["model"] == "toy" and not trace.notes


def test_other_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MoescopeError, match="no trace"):
        read_trace(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(MoescopeError, match="empty"):
        read_trace(tmp_path / "empty.jsonl")
    (tmp_path / "log.txt").write_text("step:1 - loss:0.5\n")
    with pytest.raises(MoescopeError, match="not a moescope trace"):
        read_trace(tmp_path / "log.txt")
