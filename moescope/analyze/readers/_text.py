"""Shared text handling: loading a log as clean lines, reading numbers, rejoining wrapped lines.

Every reader sees the same lines: decoded as UTF-8 (bad bytes replaced; UTF-16 when a byte
order mark says so, as PowerShell's ``>`` writes), ANSI colour codes removed (Ray colours its
``(TaskRunner pid=…)`` prefix), Windows line ends folded, but ``\\r`` inside a line kept,
because tqdm glues progress bars to log lines with it.
"""

from __future__ import annotations

import codecs
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from moescope.errors import MoescopeError

SNIFF_BYTES = 256 * 1024
MAX_LINE = 1 << 20  # bytes of one line that are read; the rest of a longer line is passed over
MAX_PIECES = 512  # a 10 kB verl line wrapped at 80 columns is 125 pieces
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RANK_LABEL = re.compile(
    r"^(?: {0,3}\d{1,4}: |\[(?:rank|default)\d{1,5}\]:\s?|\[\d{1,5},\d{1,5}\]<std(?:out|err)>:\s?)"
)
RANK_STARTS = frozenset(" [0123456789")
_NP_CALL = re.compile(r"^np\.[a-z]+\d*_?\((.*)\)$")
_NP_BOOL = {"np.True_": True, "np.False_": False}
_WORDS: dict[str, float | bool | None] = {
    "nan": math.nan,
    "-nan": math.nan,
    "+nan": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-inf": -math.inf,
    "-infinity": -math.inf,
    "none": None,
    "null": None,
    "true": True,
    "false": False,
}
_INT = re.compile(r"^[-+]?\d{1,300}$")  # longer digit runs are read as floats (inf)
# a step, layer or expert number: 15 digits at most, so int() never meets Python's digit limit
INT = r"\d{1,15}(?!\d)"
_FLOAT = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")
# one number as the frameworks print it (Python's repr, E-notation, numpy>=2 reprs); callers build
# their line patterns from it, and parse_number reads whatever it matches
_PLAIN = r"[-+]?(?:(?i:nan|inf(?:inity)?)|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
NUMBER = rf"np\.[a-z]+\d*_?\(\s*{_PLAIN}\s*\)|np\.(?:True|False)_|{_PLAIN}"
Number = int | float | bool | None


def parse_number(text: str) -> Number:
    """A logged number: ints, floats, E-notation, ``nan``/``inf``, numpy reprs, ``None``/``null``.

    ``None`` (a logged null) is returned as ``None``, distinct from NaN; text that is not a
    number raises ``ValueError``.
    """
    token = text.strip()
    if token in _NP_BOOL:
        return _NP_BOOL[token]
    call = _NP_CALL.match(token)
    if call:
        token = call.group(1).strip()
    if token.lower() in _WORDS:
        return _WORDS[token.lower()]
    if _INT.match(token):
        return int(token)
    if _FLOAT.match(token):
        return float(token)
    raise ValueError(f"not a number: {text!r}")


def as_step(value: object) -> int | None:
    """A step number from a logged value (``3``, ``3.0``, ``"3"``, ``"3/100"``), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 0 else None
    if isinstance(value, str):
        match = re.fullmatch(rf"\s*({INT})(?:\s*/\s*\d+)?\s*", value)
        return int(match.group(1)) if match else None
    return None


@dataclass
class LogFile:
    """One log on disk, read once and shared by detection and the reader.

    Lines are read one at a time with a length cap (``MAX_LINE`` bytes): a longer line keeps its
    head and the rest is passed over unread, so a 1 GB line costs a megabyte, not a gigabyte.
    The launchers' rank labels in front of a line (``srun -l``'s `` 0: ``, torchrun's
    ``[rank3]:`` / ``[default0]:``, mpirun's ``[1,0]<stdout>:``) are removed.
    """

    path: Path
    num_experts: int | None = None  # the model's routed experts, for expert-load logs
    cut: int = 0  # lines longer than MAX_LINE, kept only in part

    @cached_property
    def data(self) -> bytes:
        """The first ``SNIFF_BYTES`` of the file: enough to tell what it is."""
        try:
            with self.path.open("rb") as f:
                return f.read(SNIFF_BYTES)
        except OSError as err:
            raise MoescopeError(
                f"cannot read {self.path} ({err.strerror}); check the path and its permissions."
            ) from None

    @cached_property
    def text(self) -> str:
        return "\n".join(self.lines)

    @cached_property
    def lines(self) -> list[str]:
        head = self.data
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # PowerShell's `>` writes UTF-16
            text = self.path.read_bytes().decode("utf-16", errors="replace").replace("\r\n", "\n")
            raw = text.split("\n")
        elif looks_binary(head):
            raise MoescopeError(
                f"{self.path} is binary, not a text log; pass a text training log, a trainer_state.json "
                "or a TensorBoard event file (events.out.tfevents.*)."
            )
        else:
            raw = list(self._read_capped())
        if raw:
            raw[0] = raw[0].removeprefix("\ufeff")
        if not any(line.strip() for line in raw):
            raise MoescopeError(f"{self.path} is empty; pass a training log that has at least one step.")
        return [_clean(line) for line in raw]

    def _read_capped(self) -> Iterator[str]:
        with self.path.open("rb") as f:
            while chunk := f.readline(MAX_LINE):
                if not chunk.endswith(b"\n") and len(chunk) == MAX_LINE:  # an overlong line: skip its rest
                    self.cut += 1
                    while (rest := f.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                        pass
                yield chunk.decode("utf-8", errors="replace").rstrip("\n").removesuffix("\r")


def _clean(line: str) -> str:
    """A line without colour codes and without a launcher's rank label in front."""
    if "\x1b" in line:
        line = ANSI.sub("", line)
    if line[:1] in RANK_STARTS:
        line = RANK_LABEL.sub("", line, count=1)
    return line


def looks_binary(sample: bytes) -> bool:
    """A NUL byte, or more than a tenth of undecodable or control bytes, means it is not a text log."""
    if b"\x00" in sample:
        return True
    text = sample.decode("utf-8", errors="replace")
    odd = sum(1 for c in text if c == "\ufffd" or (ord(c) < 32 and c not in "\n\r\t\x1b\x0c"))
    return odd > max(len(text) // 10, 1) or (odd > 0 and len(text) < 4)


def gather(
    lines: list[str], start: int, complete: Callable[[str], bool], fits: Callable[[str, str], bool]
) -> tuple[str, int]:
    """The record that starts at ``lines[start]`` rejoined, and the index of the line after it.

    A terminal wraps a long line at its width, even inside a key or a number, so the pieces
    are rejoined by plain concatenation; a following line counts as a piece only while the text
    so far is not ``complete`` and ``fits(joined, piece)`` says the joined text still follows the
    record's grammar. At most ``MAX_PIECES`` lines are joined, so a runaway record stays cheap.
    """
    text, end = lines[start], start + 1
    while end < len(lines) and end - start < MAX_PIECES and lines[end].strip() and not complete(text):
        joined = text + lines[end]
        if not fits(joined, lines[end]):
            break
        text, end = joined, end + 1
    return text, end


def unlabel(token: str) -> tuple[str | None, str]:
    """``"layer=3"`` / ``"layer:3"`` → ``("layer", "3")``; a bare token has no label."""
    match = re.fullmatch(r"([A-Za-z_][\w./-]*)[=:](.+)", token)
    return (match.group(1).lower(), match.group(2)) if match else (None, token)
