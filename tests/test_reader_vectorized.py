"""The column-wise fast path of read_log gives the line reader's trace, and declines what it cannot."""

from __future__ import annotations

import importlib.util
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest

from moescope.analyze.readers import read_log, read_runs, vectorized
from moescope.traces import Trace

_PATH = Path(__file__).resolve().parents[1] / "bench" / "diagnose_read.py"
_SPEC = importlib.util.spec_from_file_location("diagnose_read", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)

GATE = 80_000  # the size gate in these tests: small logs, a few hundred lines each
FORMATS = list(bench.FORMATS)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each read took the fast path (the gate lowered to :data:`GATE`)."""
    seen: list[bool] = []
    read = vectorized.read

    def spy(*args: Any) -> Trace | None:
        trace = read(*args)
        if vectorized.ENABLED:  # not the line reader's reads the tests compare with
            seen.append(trace is not None)
        return trace

    monkeypatch.setattr(vectorized, "read", spy)
    monkeypatch.setattr(vectorized, "MIN_BYTES", GATE)
    return seen


def _slow(path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Trace:
    """The line reader's trace, the fast path switched off."""
    with monkeypatch.context() as m:
        m.setattr(vectorized, "ENABLED", False)
        return read_log(path, **kwargs)


def _items(trace: Trace) -> list[list[tuple[str, type, Any]]]:
    """Every step's items in order with their types; NaN as a marker, so that NaN equals NaN."""
    return [
        [(k, type(v), "NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in step.items()]
        for step in trace.steps
    ]


def _assert_same(fast: Trace, slow: Trace) -> None:
    assert fast.header == slow.header
    assert fast.notes == slow.notes
    assert fast.path == slow.path
    assert len(fast.steps) == len(slow.steps)
    for mine, theirs in zip(_items(fast), _items(slow), strict=True):
        assert mine == theirs


def _log(tmp_path: Path, fmt: str, count: int = 600) -> tuple[Path, list[str]]:
    """A bench log of ``count`` lines (detection reads 500), a NaN gradient norm on the fourth."""
    r = random.Random(0)
    lines = [bench.FORMATS[fmt](i, r) for i in range(1, count + 1)]
    lines[3] = re.sub(r"(grad[_ ]norm: ?)[0-9.]+", r"\g<1>nan", lines[3])
    path = tmp_path / f"{fmt}.log"
    path.write_text("".join(lines))
    return path, lines


@pytest.mark.parametrize("fmt", FORMATS)
def test_fast_path_gives_the_line_readers_trace(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: list[bool]
) -> None:
    path, lines = _log(tmp_path, fmt)
    assert path.stat().st_size >= GATE
    fast = read_log(path)
    assert taken == [True]
    slow = _slow(path, monkeypatch)
    _assert_same(fast, slow)
    assert len(fast.steps) == len(lines)
    assert any(isinstance(v, float) and math.isnan(v) for step in fast.steps for v in step.values())
    assert fast.steps[5]["raw"] == lines[5].rstrip("\n")
    _assert_same(read_log(path, format=fmt), slow)  # the format given, not detected
    assert [len(t.steps) for t in read_runs(path)] == [len(lines)]
    assert taken == [True, True, True]


@pytest.mark.parametrize("fmt", FORMATS)
def test_chunks_and_a_last_line_without_newline(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: list[bool]
) -> None:
    monkeypatch.setattr(vectorized, "CHUNK", 97)  # many chunks, the last one short
    path, lines = _log(tmp_path, fmt)
    path.write_text("".join(lines).rstrip("\n"))
    fast = read_log(path)
    assert taken == [True]
    _assert_same(fast, _slow(path, monkeypatch))
    assert fast.steps[-1]["raw"] == lines[-1].rstrip("\n")


@pytest.mark.parametrize("fmt", FORMATS)
def test_small_logs_keep_the_line_reader(fmt: str, tmp_path: Path, taken: list[bool]) -> None:
    path, _ = _log(tmp_path, fmt, 200)
    assert path.stat().st_size < GATE
    read_log(path)
    assert taken == [False]


def _odd(fmt: str, lines: list[str], case: str) -> list[str]:
    """``lines`` with one odd line (or value) in the middle."""
    i = len(lines) // 2
    line = lines[i]
    out = list(lines)
    if case == "warning":
        out.insert(i, "WARNING: the step took longer than expected\n")
    elif case == "duplicate":
        out.insert(i, line)
    elif case == "restart":
        out.insert(i, lines[0])
    elif case == "nan.0":
        value = {"verl-console": "actor/entropy:", "megatron": "lm loss: ", "records": "loss: "}[fmt]
        start = line.index(value) + len(value)
        end = min(p for p in (line.find(s, start) for s in (" ", "\n")) if p >= 0)
        out[i] = line[:start] + "nan.0" + line[end:]
    elif case == "wrapped":
        out[i : i + 1] = [line[:80] + "\n", line[80:]]
    elif case == "overflow":
        out.insert(
            i, "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 1\n"
        )
    elif case == "colour":
        out[i] = "\x1b[36m" + line
    elif case == "crlf":
        out[i] = line.replace("\n", "\r\n")
    elif case == "rank":
        out[i] = "[rank0]: " + line
    elif case == "gspo":
        out.insert(0, "config: actor.policy_loss.loss_mode=gspo\n")
    elif case == "lost key":  # Megatron drops a NaN loss from its line
        key = {"verl-console": " - actor/lr:", "megatron": " lm loss:", "records": "  loss:"}[fmt]
        start = line.index(key)
        end = line.find(key[:2] if fmt != "megatron" else "|", start + len(key))
        out[i] = line[:start] + line[end + (1 if fmt == "megatron" else 0) :]
    elif case == "int among floats":
        key = {"verl-console": "actor/entropy:", "megatron": "lm loss: ", "records": "loss: "}[fmt]
        start = line.index(key) + len(key)
        end = min(p for p in (line.find(s, start) for s in (" ", "\n")) if p >= 0)
        out[i] = line[:start] + "1" + line[end:]
    return out


CASES = [
    "warning",
    "duplicate",
    "restart",
    "nan.0",
    "wrapped",
    "overflow",
    "colour",
    "crlf",
    "rank",
    "gspo",
    "lost key",
    "int among floats",
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_odd_lines_fall_back_to_the_line_reader(
    fmt: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: list[bool]
) -> None:
    monkeypatch.setattr(vectorized, "MIN_BYTES", 0)
    path, lines = _log(tmp_path, fmt, 300)
    read_log(path, format=fmt)  # as written, the fast path takes it
    path.write_bytes("".join(_odd(fmt, lines, case)).encode())
    slow = _slow(path, monkeypatch, format=fmt)
    fast = read_log(path, format=fmt)
    assert taken == [True, False]
    _assert_same(fast, slow)


_MUTATIONS = (
    lambda line, r: line.replace(":", ": ", 1),
    lambda line, r: line.replace(" ", "  ", 1),
    lambda line, r: line.replace("0", "O", 1),
    lambda line, r: line.replace(".", "", 1),
    lambda line, r: line.replace("1", "+1", 1),
    lambda line, r: line.replace("e", "E", 1),
    lambda line, r: line[: r.randrange(len(line))] + "\n",
    lambda line, r: line.rstrip("\n") + " \n",
    lambda line, r: line.replace("|", "| x |", 1),
    lambda line, r: line.replace("nan", "NaN"),
    lambda line, r: line.replace("nan", "inf"),
    lambda line, r: line.replace("4", "4.", 1),
    lambda line, r: line.replace("2", "2e3", 1),
    lambda line, r: line.replace("-", "_", 1),
    lambda line, r: line.replace("(", "[", 1),
)


@pytest.mark.parametrize("fmt", FORMATS)
def test_whatever_the_fast_path_takes_it_reads_as_the_line_reader(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: list[bool]
) -> None:
    """Random small changes to random lines: the fast path declines the file or reads it as
    the line reader does (the gate at 0: tiny files)."""
    monkeypatch.setattr(vectorized, "MIN_BYTES", 0)
    r = random.Random(7)
    _, lines = _log(tmp_path, fmt, 300)
    for trial in range(10):
        changed = list(lines)
        for _ in range(r.choice((1, 1, 3))):
            i = r.randrange(len(changed))
            changed[i] = r.choice(_MUTATIONS)(changed[i], r)
        path = tmp_path / f"{fmt}-{trial}.log"
        path.write_text("".join(changed))
        slow = _slow(path, monkeypatch, format=fmt)
        _assert_same(read_log(path, format=fmt), slow)
    assert len(taken) == 10


def test_one_huge_line_is_declined_before_the_file_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: list[bool]
) -> None:
    """A step line followed by 3 MiB without a newline: declined a block in, and read by the line
    reader (which reads 1 MiB of such a line) as with the fast path off."""
    path, lines = _log(tmp_path, "verl-console", 300)
    path.write_text("".join(lines) + "x" * (3 << 20) + "\n")
    reads: list[Path] = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or b"")
    assert not vectorized._plain_text(path)
    fast = read_log(path)
    assert taken == [False] and reads == []
    _assert_same(fast, _slow(path, monkeypatch))
