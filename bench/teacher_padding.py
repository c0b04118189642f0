"""The teacher's distributions of a layer-sequential original with and without its rows' padding cut off.

Healing a proxy of a model larger than memory computes the original's top-k next-token
distributions on the healing rows (:func:`moescope.export.teacher.build_teacher_cache`), one
forward with every decoder layer read once; the rows are right-padded to the longest. The forward
runs them longest first, and each layer's chunk on its rows' real positions alone
(:func:`moescope.models.row_chunks.trailing_padding`). This bench writes the synthetic
Qwen3-MoE-shaped checkpoint of ``bench/export.py`` (random weights), draws ``--rows`` rows of 16 to
256 tokens in batches of 16 (each batch padded to its longest, as healing's are), and times the
cache built layer-sequentially, chunks sized within 2 GiB, alternately as it is and with the cut
left out (the rows padded to the forward's width in every layer, as before), ``--repeats`` times
each. Prints the medians, their ratio and the largest difference of the two caches'
log-probabilities. It reports; it does not pass or fail.

    PYTHONPATH=. .venv/bin/python bench/teacher_padding.py [--gb 0.5] [--rows 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export import write_checkpoint  # bench/export.py: the same synthetic checkpoint

from moescope.explore.calibration import pad_scored
from moescope.explore.sequential import layer_sequential
from moescope.export import teacher
from moescope.export.teacher import build_teacher_cache


def healing_rows(vocab: int, rows: int) -> list[dict[str, torch.Tensor]]:
    """``rows`` rows of 16 to 256 tokens (the last 8 scored), in right-padded batches of 16."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 257, (rows,), generator=g).tolist()
    pairs = [
        (
            torch.randint(5, vocab, (n - 8,), generator=g).tolist(),
            torch.randint(5, vocab, (8,), generator=g).tolist(),
        )
        for n in lengths
    ]
    return [pad_scored(pairs[i : i + 16], 0) for i in range(0, rows, 16)]


def timed_cache(checkpoint: Path, batches: list, trim: bool) -> tuple[float, torch.Tensor]:
    untrimmed = mock.patch.object(teacher, "trailing_padding", lambda _: contextlib.nullcontext())
    with layer_sequential(checkpoint, available=2 * 2**30) as original, contextlib.ExitStack() as stack:
        if not trim:
            stack.enter_context(untrimmed)
        start = time.perf_counter()
        cache = build_teacher_cache(original, batches, k=64, rows=len(batches) * 16)
        return time.perf_counter() - start, cache.log_probs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=0.5, help="synthetic checkpoint size")
    parser.add_argument("--rows", type=int, default=64, help="healing rows (a multiple of 16)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        write_checkpoint(checkpoint, args.gb)
        vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
        batches = healing_rows(vocab, args.rows)
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        padded = sum(b["attention_mask"].numel() for b in batches)
        print(f"{args.rows} rows, {real / padded:.2f} of their padded positions real, one thread")
        times: dict[bool, list[float]] = {True: [], False: []}
        probs = {}
        for _ in range(args.repeats):
            for trim in (False, True):
                seconds, probs[trim] = timed_cache(checkpoint, batches, trim)
                times[trim].append(seconds)
    cut, whole = statistics.median(times[True]), statistics.median(times[False])
    gap = (probs[True] - probs[False]).abs().max().item()
    print(
        f"padding cut off {cut:.1f} s, padded {whole:.1f} s (medians of {args.repeats}): "
        f"{whole / cut:.2f}x faster"
    )
    print(f"largest log-probability difference between the two caches: {gap:.2g}")


if __name__ == "__main__":
    main()
