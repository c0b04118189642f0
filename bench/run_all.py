"""``make bench``: run every bench script once, side by side measurements only, and summarise.

Each script prints its own ratios (and says where a figure misses its goal); this runner
captures what each printed, its exit status and wall time, and writes ``bench/results.md`` and
``bench/results.json``. It fails only when a script crashes.

    .venv/bin/python bench/run_all.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS: dict[str, list[str]] = {
    "export": ["export.py", "--gb", "4.0", "--repeats", "7"],
    "calibration": ["calibration.py", "--repeats", "5"],
    "sequential": ["sequential.py", "--gb", "4.0"],
    "taylor_sequential": ["taylor_sequential.py"],  # --gb 4.0 adds about 15 min on 2 cores
    "export_beyond_memory": ["export_beyond_memory.py", "--gb", "4.0"],
    "replay": ["replay.py", "--steps", "8"],
    "sharded": ["sharded.py"],
    "trl_fsdp2": ["trl_fsdp2.py", "--rounds", "4", "--steps", "8"],
    "clustering": ["clustering.py"],
    "charts": ["charts.py"],
    "diagnose_read": ["diagnose_read.py", "--mb", "32", "--repeats", "3"],
    "activation_memory": ["activation_memory.py", "--real"],
}
QUICK = {
    "export": ["export.py", "--gb", "4.0"],
    "replay": ["replay.py", "--steps", "4"],
    "trl_fsdp2": ["trl_fsdp2.py", "--rounds", "2", "--steps", "4"],
    "diagnose_read": ["diagnose_read.py", "--mb", "8", "--repeats", "1"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps where a script allows it")
    args = parser.parse_args()
    results = {}
    for name, argv in SCRIPTS.items():
        argv = QUICK.get(name, argv) if args.quick else argv
        start = time.perf_counter()
        run = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], capture_output=True, text=True)
        results[name] = {
            "command": "python bench/" + " ".join(argv),
            "returncode": run.returncode,
            "wall_s": round(time.perf_counter() - start, 1),
            "output": run.stdout.strip(),
            "error": run.stderr.strip()[-2000:] if run.returncode else "",
        }
        print(f"{name}: {results[name]['wall_s']} s, exit {run.returncode}", file=sys.stderr)
    (HERE / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# Bench results",
        "",
        "Regenerate with `make bench`. Every figure is a ratio measured in one run.",
        "",
    ]
    for name, r in results.items():
        lines += [
            f"## {name}",
            "",
            f"`{r['command']}` — {r['wall_s']} s",
            "",
            "```",
            r["output"] or r["error"],
            "```",
            "",
        ]
    (HERE / "results.md").write_text("\n".join(lines))
    print((HERE / "results.md").read_text())
    return 1 if any(r["returncode"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
