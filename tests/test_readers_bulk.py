"""The bulk path of reading a long log (line templates) gives what the line-by-line path gives."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from moescope.analyze.diagnosis import diagnose
from moescope.analyze.readers import _template, read_log, read_runs, records
from moescope.traces import Trace

_PATH = Path(__file__).resolve().parents[1] / "bench" / "diagnose_read.py"
_SPEC = importlib.util.spec_from_file_location("diagnose_read", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _typed(trace: Trace) -> list[list[tuple[str, type, object]]]:
    """Every step's items with their types: ``1 == 1.0``, but a read int must stay an int."""
    return [[(k, type(v), repr(v)) for k, v in step.items()] for step in trace.steps]


def _both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple, tuple, list[int]]:
    """What read_log and diagnose give with the bulk path and without, and how many lines the
    templates read in each chunk. Every template row is used as made (none is checked against the slow read),
    so a template that reads a line otherwise would show here."""
    taken = []
    made = _template._rows

    def rows(*args: object) -> dict:
        found = made(*args)
        taken.append(len(found))
        return found

    monkeypatch.setattr(_template, "_rows", rows)
    monkeypatch.setattr(_template, "CHECKED", 0)
    monkeypatch.setattr(_template, "EVERY", 1 << 62)
    monkeypatch.setattr(_template, "CHUNK", 97)  # many chunk ends, some inside a record or a run
    out = []
    for least in (100, 1 << 62):
        monkeypatch.setattr(_template, "MIN_LINES", least)
        trace = read_log(path)
        runs = [run.notes for run in read_runs(path)]
        out.append((_typed(trace), trace.notes, trace.header, diagnose(trace), runs))
    return out[0], out[1], taken


@pytest.mark.parametrize("fmt", list(bench.FORMATS))
def test_each_bench_format_reads_the_same_in_bulk(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"{fmt}.log"
    lines = bench.write_log(path, fmt, 0.1)
    bulk, slow, taken = _both_ways(path, monkeypatch)
    assert bulk == slow
    if fmt == "records":
        assert sum(taken) == 2 * lines  # every line a template line, in both reads: the bulk path read them


def _mutated(line: str, rng: random.Random) -> str:
    """``line`` with a few characters a log could hold put in, taken out or replaced."""
    for _ in range(rng.choice([1, 1, 2, 3])):
        at, what = rng.randrange(len(line) + 1), rng.choice(" .:-,|;[]()=\t0123456789eEnaif+/%_sX")
        head, tail = line[:at], line[at:]
        line = rng.choice([head + what + tail, head + tail[1:], head + what + tail[1:]])
    return line


@pytest.mark.parametrize("seed", range(6))
def test_mmengine_lines_with_faults_read_the_same_in_bulk(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    words = ["nan", "inf", "-inf", "NaN", "5.", "1e400", "-0", "+3", "00012", ".5", "-.5e-3"]
    lines = []
    for i in range(1, 400):
        value = rng.choice(words) if rng.random() < 0.05 else f"{rng.uniform(-2, 2):.4f}"
        line = bench.FORMATS["records"](i, rng).replace("loss: ", f"loss: {value}  extra: ", 1)
        lines.append(_mutated(line, rng) if rng.random() < 0.2 else line)
        if rng.random() < 0.03:
            lines.append(rng.choice(["", "Bad grad_norm detected (grad_norm=nan)", "some prose, loss 0.5"]))
    path = tmp_path / "faults.log"
    path.write_text("\n".join(lines) + "\n")
    bulk, slow, taken = _both_ways(path, monkeypatch)
    assert bulk == slow and sum(taken) > 0


def test_a_template_that_reads_a_line_otherwise_falls_back_to_the_slow_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "records.log"
    bench.write_log(path, "records", 0.1)
    monkeypatch.setattr(_template, "MIN_LINES", 1 << 62)
    slow = read_log(path)
    right = records.template

    def wrong(line: str) -> _template.Template | None:
        found = right(line)
        return found and _template.Template(found.pattern, found.keys[::-1], found.tag)  # names swapped

    monkeypatch.setattr(records, "template", wrong)
    monkeypatch.setattr(_template, "MIN_LINES", 100)
    bulk = read_log(path)
    assert (_typed(bulk), bulk.notes) == (_typed(slow), slow.notes)
