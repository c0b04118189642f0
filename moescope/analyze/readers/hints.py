"""What a log says about its run's setup, where it bears on the diagnosis: sequence-level ratios.

GSPO (and TRL's ``importance_sampling_level="sequence"``) clips a whole sequence's
length-normalised ratio, and clips about a hundred times more tokens than token-level GRPO **by
design**; a high clip fraction there is not a fault (``rl-mismatch`` reference). Logs rarely say
so in their metrics, but the config most frameworks print at start-up does: verl's
``policy_loss.loss_mode=gspo``, TRL's ``importance_sampling_level='sequence'`` (or
``sequence_token``), ms-swift's ``--importance_sampling_level sequence``, slime's
``--advantage-estimator gspo``. The first such line sets the trace header's ``ratio_level``.

Activation recompute bears on Megatron's load-balancing loss, which older Megatron counted twice
under it: a line that turns it on (``--moe-layer-recompute``, ``recompute_granularity: full``)
sets the header's ``recompute``, and the load rule halves that loss before judging it.
"""

from __future__ import annotations

import re

__all__ = ["RATIO_LEVEL", "RECOMPUTE", "SEQUENCE_LEVEL", "ratio_level", "recompute"]

RATIO_LEVEL = "ratio_level"  # the trace header key: "sequence" when the log says so
_SEP = r"""['"]?[ \t]*[=: \t][ \t]*['"]?"""  # key=value, key: value, "key": "value", --key value
SEQUENCE_LEVEL = re.compile(
    rf"(?:loss[-_]mode|advantage[-_]estimator|policy[-_]loss|\balgo(?:rithm)?){_SEP}gspo\b"
    rf"|importance[-_]sampling[-_]level{_SEP}sequence",
    re.IGNORECASE,
)


RECOMPUTE = "recompute"  # the trace header key: True when the log says activations are recomputed
# Megatron's --moe-layer-recompute / --recompute-granularity / --recompute-activations (and the
# config keys they set), unless the value says it is off
RECOMPUTING = re.compile(
    r"(?:moe[-_]layer[-_]recompute|recompute[-_](?:granularity|activations|method|num[-_]layers))"
    r"(?!['\"]?[ \t]*[=:][ \t]*['\"]?(?:none|null|false|0)\b)",
    re.IGNORECASE,
)


def recompute(lines: list[str]) -> int | None:
    """The number of the first line that turns activation recompute on, else ``None``.

    Megatron before its fix (Megatron-LM#1330, #1478, #1514) recorded the load-balancing loss in
    the recompute forward pass too, so a balanced router logs about twice its true value.
    """
    return _first_line(RECOMPUTING, ("recompute",), lines)


def ratio_level(lines: list[str]) -> tuple[str, int] | None:
    """``("sequence", line number)`` when a line sets sequence-level ratios, else ``None``."""
    number = _first_line(SEQUENCE_LEVEL, ("gspo", "sequence"), lines)
    return None if number is None else ("sequence", number)


BLOCK = 4096  # lines searched as one lower-cased text for the patterns' words


def _first_line(pattern: re.Pattern[str], words: tuple[str, ...], lines: list[str]) -> int | None:
    """The number of the first line ``pattern`` matches. A case-insensitive pattern that starts
    with alternatives searches slowly, so it runs only on the lines of a block that hold one of
    its ``words`` (every match contains one); the patterns match within a line."""
    for start in range(0, len(lines), BLOCK):
        block = lines[start : start + BLOCK]
        text = "\n".join(block).lower()
        if not any(word in text for word in words):
            continue
        for offset, line in enumerate(block):
            if any(word in line.lower() for word in words) and pattern.search(line):
                return start + offset + 1
    return None
