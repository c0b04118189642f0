"""Whitespace-column files that a deployment guide greps with ``awk``.

- ``entropy-log`` (``entropy_log.txt``, read as ``awk '{print $1,$NF}'``): the step is the first
  column and the entropy the **last** → ``actor/entropy``; columns in between are ignored.
- ``expert-load`` (``expert_load.log``, read as ``awk '{print $3}' | sort | uniq -c``): one line
  per routed token or per record, the expert id in the **third** column. The step is the first
  column when it is a number. A column labelled ``layer`` — by a header line such as
  ``# step layer expert count`` or by the token itself (``layer=3``, ``L3``) — gives the layer,
  otherwise the file is one layer; a column labelled ``count`` / ``tokens`` / ``load`` weights
  the line, otherwise each line counts once. Per step this gives ``moe/expert_load`` (one row
  of token shares per layer, indexed by expert id; ``moe/expert_load_layers`` names the layer
  ids when they are not 0…L-1), ``moe/max_load_share``, ``moe/dead_experts`` (summed over
  layers) and ``moe/load_cv`` (std/mean of the shares, averaged over layers) — the replay's own
  definitions. Dead experts and the CV are taken over ``num_experts`` experts when that is
  given, otherwise over the expert ids seen anywhere in the file (an expert never routed to in
  the whole log cannot be told from one that does not exist; a note says so).

A token may carry a label (``step=12``, ``entropy:0.53``); the label is dropped from the value.
Lines starting with ``#`` are comments.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from moescope import schema as S
from moescope.analyze.readers._rows import STEP_KEYS, Parsed, Row, scan
from moescope.analyze.readers._text import INT, LogFile, Number, as_step, number_or_none, unlabel
from moescope.analyze.readers.records import is_metric
from moescope.errors import MoescopeError

_LAYER_TOKEN = re.compile(rf"(?i)(?:layer|l)[_=:]?({INT})")
_EXPERT_TOKEN = re.compile(rf"(?i)(?:expert|e)?[_=:]?({INT})")
_WEIGHT_LABELS = {"count", "tokens", "load", "n", "num_tokens"}
LAYERS = S.EXPERT_LOAD_LAYERS
MAX_ID = 4096  # a larger expert or layer id is taken for some other number (no MoE has that many)
RAW_LINES = 200  # raw text kept per step; a per-token log can have millions of lines


def _number(token: str) -> Number:
    return number_or_none(unlabel(token)[1])


def _columns(line: str) -> list[str] | None:
    """The tokens of a data line (not blank, not a comment)."""
    tokens = line.split()
    return tokens if tokens and not tokens[0].startswith("#") else None


def _opens_with_a_step(token: str) -> bool:
    """A bare step number, or one labelled as a step (``step=7``): a parallelism line before a
    pasted log (``tp=1 pp=1 dp=4 cp=1``) is integer columns too, but no data row."""
    label, _ = unlabel(token)
    return as_step(_number(token)) is not None and (label is None or label in STEP_KEYS)


def _names_another_metric(token: str) -> bool:
    """A token labelled with a metric's name other than the entropy (``loss=15.50``)."""
    label, _ = unlabel(token)
    return label is not None and "entropy" not in label.lower() and is_metric(label)


def kind(line: str) -> str | None:
    """``"expert-load"`` for three or more integer columns, ``"entropy-log"`` for a step and a
    number, else ``None`` (the file name breaks ties; see :mod:`moescope.analyze.readers.detect`)."""
    tokens = _columns(line)
    if not tokens or len(tokens) < 2 or not _opens_with_a_step(tokens[0]):
        return None
    values = [_number(t) for t in tokens]
    if any(v is None and is_metric(t.rstrip(":,")) for t, v in zip(tokens, values, strict=True)):
        return None  # a metric's name among the numbers ("0 | loss 11.62", "20. … loss: 4.9"): a record
    if any(_names_another_metric(t) for t in tokens[1:]):
        return None  # "step=1  loss=15.50  gnorm=42.7" is a record, its last column no entropy
    if len(tokens) >= 3 and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "expert-load"
    last = values[-1]
    return "entropy-log" if isinstance(last, float | int) and not isinstance(last, bool) else None


def read_entropy(log: LogFile) -> Parsed:
    """``step … entropy`` lines."""

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        tokens = _columns(lines[i])
        if not tokens or len(tokens) < 2:
            return None
        step, entropy = as_step(_number(tokens[0])), _number(tokens[-1])
        if step is None or not isinstance(entropy, int | float) or isinstance(entropy, bool):
            return None
        return [Row(step, {S.ENTROPY: entropy}, lines[i], i + 1)], i + 1

    return scan(log.lines, parse_at)


@dataclass
class LoadTally:
    """Tokens per step, layer and expert as a log's lines name them, and each step's raw text."""

    counts: dict[int | None, dict[int, dict[int, float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict))
    )
    raws: dict[int | None, list[str]] = field(default_factory=lambda: defaultdict(list))
    lines_of: dict[int | None, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, step: int | None, layer: int, experts: dict[int, float], line: str) -> None:
        """Count one line's ``{expert: tokens}`` into ``step``'s ``layer``."""
        by_expert = self.counts[step][layer]
        for expert, weight in experts.items():
            by_expert[expert] = by_expert.get(expert, 0.0) + weight
        self.lines_of[step] += 1
        if len(self.raws[step]) < RAW_LINES:
            self.raws[step].append(line)

    def finish(self, parsed: Parsed, log: LogFile) -> Parsed:
        """``parsed`` with one row per step holding the load metrics of every layer."""
        parsed.rows, notes = load_rows(self.counts, self.raws, self.lines_of, log)
        parsed.notes += notes
        return parsed


def read_expert_load(log: LogFile) -> Parsed:
    """Expert-id lines, counted per step and layer."""
    header, labels = _header(log.lines)
    tally = LoadTally()

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        if i == header:
            return [], i + 1
        record = _record(_columns(lines[i]) or [], labels)
        if record is None:
            return None
        step, layer, expert, weight = record
        tally.add(step, layer, {expert: weight}, lines[i])
        return [], i + 1

    return tally.finish(scan(log.lines, parse_at), log)


def _header(lines: list[str]) -> tuple[int | None, dict[int, str]]:
    """The header line's index (``None`` for a ``#`` comment) and its column labels by position,
    from the first line whose tokens are all words; none if data comes first."""
    for i, line in enumerate(lines):
        tokens = line.strip().lstrip("#").split()
        if not tokens:
            continue
        comment = line.lstrip().startswith("#")
        if all(re.fullmatch(r"[A-Za-z_][\w()/-]*", t) for t in tokens):
            return (None if comment else i), {j: t.lower() for j, t in enumerate(tokens)}
        if not comment:
            break
    return None, {}


def _record(tokens: list[str], labels: dict[int, str]) -> tuple[int | None, int, int, float] | None:
    """``(step, layer, expert, weight)`` of one line, or ``None`` when it is not one."""
    if len(tokens) < 3:
        return None
    names = {i: unlabel(t)[0] or labels.get(i) for i, t in enumerate(tokens)}
    expert = _EXPERT_TOKEN.fullmatch(unlabel(tokens[2])[1])
    if expert is None:
        return None
    layer, weight = 0, 1.0
    for i, token in enumerate(tokens):
        bare = unlabel(token)[1]
        tagged = _LAYER_TOKEN.fullmatch(bare) if not bare.isdigit() else None
        if i != 2 and (names[i] == "layer" or tagged):
            found = tagged or re.fullmatch(f"({INT})", bare)
            if found is None:
                return None
            layer = int(found.group(1))
        elif names[i] in _WEIGHT_LABELS:
            weight = _number(token)
            if not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
                return None
    step = as_step(_number(tokens[0])) if names[0] != "layer" else None
    if layer >= MAX_ID or int(expert.group(1)) >= MAX_ID:
        return None
    return step, layer, int(expert.group(1)), float(weight)


def load_rows(
    counts: dict[int | None, dict[int, dict[int, float]]],
    raws: dict[int | None, list[str]],
    lines_of: dict[int | None, int],
    log: LogFile,
) -> tuple[list[Row], list[str]]:
    """One row per step with the load metrics of every layer."""
    layers = sorted({layer for by_layer in counts.values() for layer in by_layer})
    seen = sorted({e for by_layer in counts.values() for by_e in by_layer.values() for e in by_e})
    notes, num_experts = [], log.num_experts
    if num_experts is None:
        universe, width = seen, (seen[-1] + 1 if seen else 0)
        notes.append(
            f"the expert count is not known; dead experts and the load CV are taken over the {len(seen)} "
            "expert ids seen in the file (pass num_experts=... to count all)"
        )
    else:
        if seen and seen[-1] >= num_experts:
            raise MoescopeError(
                f"{log.path} names expert {seen[-1]}, but num_experts={num_experts}; "
                "pass the model's expert count."
            )
        universe, width = list(range(num_experts)), num_experts
    rows = []
    for step, by_layer in counts.items():
        metrics = _load_metrics([by_layer.get(layer, {}) for layer in layers], universe, width)
        if layers != list(range(len(layers))):
            metrics[LAYERS] = layers
        more = lines_of[step] - RAW_LINES
        raw = "\n".join(raws[step]) + (f"\n… {more} more lines" if more > 0 else "")
        rows.append(Row(step, metrics, raw))
    return rows, notes


def _load_metrics(per_layer: list[dict[int, float]], universe: list[int], width: int) -> dict[str, Any]:
    """Shares per layer and the summary metrics over the layers that routed any token."""
    shares, cvs, dead, peak = [], [], 0, 0.0
    for by_expert in per_layer:
        total = sum(by_expert.values())
        row = [by_expert.get(e, 0.0) / total if total else 0.0 for e in range(width)]
        shares.append(row)
        if not total:
            continue
        mine = [row[e] for e in universe]
        dead += sum(1 for v in mine if v == 0.0)
        peak = max(peak, max(mine))
        mean = statistics.fmean(mine)
        cvs.append(statistics.pstdev(mine) / mean if mean else 0.0)
    metrics: dict[str, Any] = {S.EXPERT_LOAD: shares}
    if cvs:
        metrics.update({S.LOAD_CV: statistics.fmean(cvs), S.MAX_LOAD_SHARE: peak, S.DEAD_EXPERTS: dead})
    return metrics
