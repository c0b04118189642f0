"""What a log says about its run's setup, where it bears on the diagnosis: sequence-level ratios.

GSPO (and TRL's ``importance_sampling_level="sequence"``) clips a whole sequence's
length-normalised ratio, and clips about a hundred times more tokens than token-level GRPO **by
design**; a high clip fraction there is not a fault (``rl-mismatch`` reference). Logs rarely say
so in their metrics, but the config most frameworks print at start-up does: verl's
``policy_loss.loss_mode=gspo``, TRL's ``importance_sampling_level='sequence'`` (or
``sequence_token``), ms-swift's ``--importance_sampling_level sequence``, slime's
``--advantage-estimator gspo``. The first such line sets the trace header's ``ratio_level``.
"""

from __future__ import annotations

import re

__all__ = ["RATIO_LEVEL", "SEQUENCE_LEVEL", "ratio_level"]

RATIO_LEVEL = "ratio_level"  # the trace header key: "sequence" when the log says so
_SEP = r"""['"]?\s*[=:\s]\s*['"]?"""  # key=value, key: value, "key": "value", --key value
SEQUENCE_LEVEL = re.compile(
    rf"(?:loss[-_]mode|advantage[-_]estimator|policy[-_]loss|\balgo(?:rithm)?){_SEP}gspo\b"
    rf"|importance[-_]sampling[-_]level{_SEP}sequence",
    re.IGNORECASE,
)


def ratio_level(lines: list[str]) -> tuple[str, int] | None:
    """``("sequence", line number)`` when a line sets sequence-level ratios, else ``None``."""
    for number, line in enumerate(lines, 1):
        if SEQUENCE_LEVEL.search(line):
            return "sequence", number
    return None
