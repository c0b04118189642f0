"""A decimal number as text: the one pattern the log readers, the rules and the replay's reward
parser build theirs from."""

from __future__ import annotations

# digits, then a point and more, or a point and digits, and an exponent: written so that a digit is
# matched one way only and never started within a run of digits (a search through a line of 4,000
# digits, which "\d+\.?\d*" splits every way at every start, took minutes; now its length)
DECIMAL = r"(?:(?<!\d)\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
