"""Reading a large training log, measured against reading its lines without parsing them.

A log of ``--mb`` megabytes is generated per format (verl's console, Megatron's iteration lines,
mmengine / XTuner records), each line a realistic record with a NaN now and then. Each file is
read three ways, in alternation, ``--repeats`` times:

- **lines**: the file read line by line and decoded, nothing parsed (the floor any reader pays);
- **read_log**: :func:`moescope.analyze.readers.read_log`, detection included (a log of one
  line shape read column-wise: :mod:`moescope.analyze.readers.vectorized`);
- **line reader**: ``read_log`` with that fast path switched off (every line read in Python);
- **diagnose**: ``read_log`` and then :func:`moescope.analyze.diagnosis.diagnose`;
- **rules**: ``diagnose`` alone, on the file's trace read once before (diagnose's own share).

Prints the CPU, then per format the median of each, read_log's speed, and the ratio to lines
of read_log (against the 2x goal), the line reader, diagnose and rules, by wall-clock time and
by the process's CPU time (steadier where other work shares the CPUs), and the peak Python
memory of one read_log over the file's size. It reports; it does not pass or fail.

    .venv/bin/python bench/diagnose_read.py [--mb 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

GOAL = 2.0


def _verl(i: int, r: random.Random) -> str:
    values = {
        "actor/entropy": r.uniform(0.2, 0.8),
        "actor/pg_loss": r.gauss(0, 0.01),
        "actor/pg_clipfrac": r.uniform(0, 0.01),
        "actor/ppo_kl": r.uniform(0, 1e-3),
        "actor/grad_norm": _grad(r),
        "actor/lr": 1e-06,
        "critic/score/mean": r.random(),
        "response_length/mean": r.uniform(300, 900),
        "response_length/clip_ratio": r.uniform(0, 0.05),
        "timing_s/gen": r.uniform(10, 20),
    }
    return f"(TaskRunner pid=4242) step:{i}" + "".join(f" - {k}:{v}" for k, v in values.items()) + "\n"


def _megatron(i: int, r: random.Random) -> str:
    values = {
        "consumed samples": i * 256,
        "elapsed time per iteration (ms)": f"{r.uniform(3900, 4100):.1f}",
        "learning rate": "1.500000E-04",
        "lm loss": f"{r.uniform(2, 4):.6E}",
        "load_balancing_loss": f"{r.uniform(1.0, 1.1):.6E}",
        "loss scale": 1.0,
        "grad norm": _grad(r),
        "number of skipped iterations": 0,
    }
    fields = "".join(f" {k}: {v} |" for k, v in values.items())
    return f" [2025-06-02 08:14:51] iteration {i:8d}/ 2000000 |{fields}\n"


def _records(i: int, r: random.Random) -> str:
    values = {"lr": "1.9125e-04", "eta": "1:07:12", "time": f"{r.uniform(2.9, 3.0):.4f}", "memory": 14872}
    values |= {"loss": f"{r.uniform(0.5, 0.9):.4f}", "grad_norm": _grad(r)}
    fields = "".join(f"  {k}: {v}" for k, v in values.items())
    return f"2024/06/12 09:31:02 - mmengine - INFO - Iter(train) [{i:6d}/9999999]{fields}\n"


FORMATS: dict[str, Callable[[int, random.Random], str]] = {
    "verl-console": _verl,
    "megatron": _megatron,
    "records": _records,
}


def _grad(r: random.Random) -> str:
    return "nan" if r.random() < 0.001 else f"{r.uniform(0.1, 2.0):.4f}"


def write_log(path: Path, fmt: str, mb: float) -> int:
    """A log of about ``mb`` megabytes in ``fmt``; returns its lines."""
    r, size, i = random.Random(0), 0, 1
    with path.open("w", encoding="utf-8") as f:
        while size < mb * 1e6:
            line = FORMATS[fmt](i, r)
            f.write(line)
            size, i = size + len(line), i + 1
    return i - 1


def read_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.decode("utf-8", errors="replace"))


def line_reader(path: Path) -> object:
    """``read_log`` with the column-wise fast path off: what every log took before it."""
    from moescope.analyze.readers import read_log, vectorized

    vectorized.ENABLED = False
    try:
        return read_log(path)
    finally:
        vectorized.ENABLED = True


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def peak_mib(path: Path) -> float:
    """Peak Python memory of one read_log (tracemalloc), in a fresh process, in MiB."""
    import subprocess

    code = (
        "import sys, tracemalloc\nfrom moescope.analyze.readers import read_log\n"
        "tracemalloc.start()\nread_log(sys.argv[1])\nprint(tracemalloc.get_traced_memory()[1] / 2**20)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def cpu_model() -> str:
    """The CPU's model name, as ``lscpu`` gives it (Linux), else what ``platform`` knows."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0]} x{len(names)}" if names else platform.processor() or platform.machine()


def _against_lines(name: str, med: dict[str, float], cpu: dict[str, float]) -> str:
    """``name``'s median time and its ratio to reading the lines, by wall clock and by CPU."""
    return f"{name} {med[name]:.2f} s ({med[name] / med['lines']:.1f}x; CPU {cpu[name] / cpu['lines']:.1f}x)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64.0, help="size of each generated log (MB)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from moescope.analyze.diagnosis import diagnose
    from moescope.analyze.readers import read_log

    print(f"cpu: {cpu_model()}; goal: read_log within {GOAL:g}x of reading the lines without parsing")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            path = Path(tmp) / f"{fmt}.log"
            lines = write_log(path, fmt, args.mb)
            trace = read_log(path)
            runs = {
                "lines": lambda p=path: read_lines(p),
                "read_log": lambda p=path: read_log(p),
                "line reader": lambda p=path: line_reader(p),
                "diagnose": lambda p=path: diagnose(read_log(p)),
                "rules": lambda t=trace: diagnose(t),
            }
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
            for _ in range(args.repeats):
                for name, run in runs.items():
                    times[name].append(timed(run))
            del trace, runs
            med = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
            cpu = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
            ratio = med["read_log"] / med["lines"]
            mib = path.stat().st_size / 2**20
            verdict = "" if ratio <= GOAL else ", misses the goal"
            print(
                f"{fmt}: {mib:.0f} MiB, {lines} lines; lines {med['lines']:.2f} s, read_log "
                f"{med['read_log']:.2f} s = {mib / med['read_log']:.0f} MiB/s ({ratio:.1f}x lines{verdict}; "
                f"CPU {cpu['read_log'] / cpu['lines']:.1f}x), {_against_lines('line reader', med, cpu)}, "
                f"{_against_lines('diagnose', med, cpu)} "
                f"of which {_against_lines('rules', med, cpu)}; "
                f"peak memory {peak_mib(path) / mib:.1f}x the file"
            )
            if not math.isfinite(ratio):
                sys.exit(1)


if __name__ == "__main__":
    main()
