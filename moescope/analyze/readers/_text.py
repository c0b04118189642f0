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
from itertools import compress, pairwise
from pathlib import Path
from typing import Any

from moescope._util.numbers import DECIMAL
from moescope.errors import MoescopeError

SNIFF_BYTES = 256 * 1024
MAX_LINE = 1 << 20  # bytes of one line that are read; the rest of a longer line is passed over
BLOCK = 1 << 22  # bytes read, decoded and split at a time
MAX_PIECES = 512  # a 10 kB verl line wrapped at 80 columns is 125 pieces
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RANK_LABEL = re.compile(
    r"^(?: {0,3}\d{1,4}: |\[(?:rank|default)\d{1,5}\]:\s?|\[\d{1,5},\d{1,5}\]<std(?:out|err)>:\s?)"
)
RANK_STARTS = frozenset(" [0123456789")
# full-width punctuation a CJK input method types ("Loss：1.98，lr：1e-4"), as ASCII with the space a
# field separator needs: every reader then splits and labels such a line as any other
FULL_WIDTH = str.maketrans({"\uff1a": ": ", "\uff0c": ", ", "\uff1d": "=", "\uff5c": "|", "\uff1b": "; "})
# characters that show as nothing yet split a key from its colon when a log is copied from a web
# page: an emoji's variation selectors, zero-width spaces and joiners, a byte-order mark mid-text
INVISIBLE = "".join(map(chr, [*range(0xFE00, 0xFE10), 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF]))
_CLEANED = FULL_WIDTH | str.maketrans(dict.fromkeys(INVISIBLE))
_TO_CLEAN = re.compile("[" + "".join(map(chr, _CLEANED)) + "]")
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
    ".nan": math.nan,  # YAML's spellings: RLlib's results as it prints them ("episode_reward_mean: .nan")
    ".inf": math.inf,
    "+.inf": math.inf,
    "-.inf": -math.inf,
    "none": None,
    "null": None,
    "true": True,
    "false": False,
}
# what may trail a NaN or an infinity and leaves it one: "nan.0", "nanxxx", and the digits a longer
# number printed before it left behind on a status line redrawn over itself with "\r" ("nan.08")
_ZERO_TAIL = re.compile(r"(?<=nan|inf)(?:\.0+|x+)$|(?<=nan)\.?\d+$")
# a NaN or an infinity as Microsoft's C runtime prints it (CNTK on Windows: "1.#QNAN000",
# "-1.#IND00", "1.#INF00"; rounded to a few decimals, "1.#R" or "1.#J")
_MSVC_NONFINITE = re.compile(r"^([-+]?)1\.#([A-Z]+)\d*$")
_INT = re.compile(r"^[-+]?\d{1,300}$")  # longer digit runs are read as floats (inf)
# a step, layer or expert number: 15 digits at most, so int() never meets Python's digit limit
INT = r"\d{1,15}(?!\d)"
# a tqdm bar up to the bracket after its count, the count captured: "14%|█▍ | 378/2724 ["
BAR_HEAD = rf"(?<!\d)\d+%\|[^|\n]*\|\s*({INT})/{INT}\s*\["
_FLOAT = re.compile(rf"^[-+]?{DECIMAL}$")
# one number as the frameworks print it (Python's repr, E-notation, numpy>=2 reprs); callers build
# their line patterns from it, and parse_number reads whatever it matches
# (Lightning's progress bar, as NeMo runs it, prints a NaN as "nan.0": NeMo#5928; PaddleOCR formats
# its values "{:x<6f}", so a NaN fills to six characters with x: "loss: nanxxx")
_PLAIN = (
    r"[-+]?(?:(?i:\.?nan(?:\.0+|x+|\.?\d+)?|\.?inf(?:inity|\.0+|x+)?)|1\.#[A-Z]+\d*"
    rf"|{DECIMAL})"
)
NUMBER = rf"np\.[a-z]+\d*_?\(\s*{_PLAIN}\s*\)|np\.(?:True|False)_|{_PLAIN}"
Number = int | float | bool | None
# a number with thousands separators, "1,568,987.96": only as a whole value token (a ","-separated
# list "key:1,key2:2" or a CSV row has no three-digit groups after every comma)
GROUPED = r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?"
_GROUPED = re.compile(GROUPED)


def grouped_number(token: str) -> int | float | None:
    """``1,568,987.96`` → ``1568987.96`` (a pasted W&B / dashboard figure), ``None`` for any
    token that is not one number with thousands separators throughout."""
    return plain_number(token.replace(",", "")) if _GROUPED.fullmatch(token) else None


def quoted_number(value: Any) -> Any:
    """A number a logger wrote as a string (fairseq's JSON log quotes every value: ``"train_loss":
    "nan"``, ``"lr": "5e-05"``) as that number; any other value as it is."""
    if not isinstance(value, str) or len(value) > 40:
        return value
    try:
        number = parse_number(value)
    except ValueError:
        return value
    return value if number is None or isinstance(number, bool) else number


def parse_number(text: str) -> Number:
    """A logged number: ints, floats, E-notation, ``nan``/``inf``, numpy reprs, ``None``/``null``.

    ``None`` (a logged null) is returned as ``None``, distinct from NaN; text that is not a
    number raises ``ValueError``.
    """
    token = text.strip()
    fast = plain_number(token)
    if fast is not None:
        return fast
    if token in _NP_BOOL:
        return _NP_BOOL[token]
    call = _NP_CALL.match(token)
    if call:
        token = call.group(1).strip()
    word = _ZERO_TAIL.sub("", token.lower())  # "nan.0", "nanxxx" and "nan.08" are nan
    if word in _WORDS:
        return _WORDS[word]
    msvc = _MSVC_NONFINITE.match(token)
    if msvc:
        return (-math.inf if msvc.group(1) == "-" else math.inf) if msvc.group(2) == "INF" else math.nan
    if _INT.match(token):
        return int(token)
    if _FLOAT.match(token):
        return float(token)
    raise ValueError(f"not a number: {text!r}")


def number_or_none(text: str) -> Number:
    """:func:`parse_number`, with ``None`` for text that is no number (a cell, a field's last word)."""
    try:
        return parse_number(text)
    except ValueError:
        return None


def plain_number(token: str) -> int | float | None:
    """A plain decimal number, read by ``float`` / ``int`` alone: the common case, taken before
    any pattern runs (a log has millions of them). ``None`` for anything else."""
    if "_" in token:  # float("1_0") is 10; a logged "1_0" is no number
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    digits = token[1:] if token[:1] in "+-" else token
    if digits.isdigit() and len(digits) <= 300:  # as _INT: an integer; longer digit runs stay floats
        return int(token)
    # NaN as the one object the words give, so that records holding it compare equal
    return value if value == value else math.nan


def plain_numbers(values: list[str]) -> list[int | float] | None:
    """:func:`plain_number` of every value, or ``None`` when one is not plain (or holds a space):
    ``float`` mapped over the list in one call, and a pass in Python only over the ints, and over
    the list where a NaN may be."""
    joined = "".join(values)
    if "_" in joined or joined.split() != [joined]:  # float() takes "1_0" and spaces; a log's values do not
        return None
    try:
        numbers: list[int | float] = list(map(float, values))
    except ValueError:
        return None
    unsigned = "\0".join(values).replace("-", "").replace("+", "").split("\0")
    for i in compress(range(len(values)), map(str.isdigit, unsigned)):  # ints as ints, exactly
        if len(unsigned[i]) <= 300:  # as plain_number: longer digit runs stay floats
            numbers[i] = int(values[i])
    if "n" in joined or "N" in joined:  # nan / inf: one NaN object, as plain_number gives
        numbers = [math.nan if x != x else x for x in numbers]
    return numbers


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

    def head(self, chars: int = 65536) -> str:
        """The first lines, about ``chars`` characters of them: what detection looks at."""
        taken, size = [], 0
        for line in self.lines:
            if size >= chars:
                break
            taken.append(line)
            size += len(line) + 1
        return "\n".join(taken)

    @cached_property
    def lines(self) -> list[str]:
        head = self.data
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # PowerShell's `>` writes UTF-16
            text = cleaned(self.path.read_bytes().decode("utf-16", errors="replace").replace("\r\n", "\n"))
            raw = text.split("\n")
        elif looks_binary(head):
            raise MoescopeError(
                f"{self.path} is binary, not a text log; pass a text training log, a trainer_state.json "
                "or a TensorBoard event file (events.out.tfevents.*)."
            )
        else:
            raw = []
            for block in self._read_capped():
                raw += block
        if raw:
            raw[0] = raw[0].removeprefix("\ufeff")
        if not any(map(str.strip, raw)):
            raise MoescopeError(f"{self.path} is empty; pass a training log that has at least one step.")
        ranks = not _counted(raw)
        raw = _markdown_unquoted(raw)
        return [
            _unmarked(line, ranks) if line[:1] in _MARKED_STARTS or line[-1:] == "`" or "**" in line else line
            for line in raw
        ]

    def _read_capped(self) -> Iterator[list[str]]:
        """The file's lines, a block of them at a time: one read, one decode and one split per
        ``BLOCK`` bytes, not per line. A line of ``MAX_LINE`` bytes or more keeps only that many,
        and the rest of it is passed over unread."""
        with self.path.open("rb") as f:
            pending, skipping = b"", False
            while block := f.read(BLOCK):
                if skipping:  # the rest of an overlong line
                    newline = block.find(b"\n")
                    if newline < 0:
                        continue
                    block, skipping = block[newline + 1 :], False
                data = pending + block
                end = data.rfind(b"\n")
                if end >= 0:
                    yield self._decode(data[:end])
                    pending = data[end + 1 :]
                else:
                    pending = data
                if len(pending) >= MAX_LINE:  # a line longer than the cap: its head, then skip the rest
                    yield self._decode(pending[:MAX_LINE])
                    pending, skipping = b"", True
            if pending:
                yield self._decode(pending)

    def _decode(self, data: bytes) -> list[str]:
        """Lines of ``data`` (whole lines, without the newline after the last), decoded and cleaned."""
        if _may_hold_overlong(data):  # overlong lines: each cut to the cap, and counted
            parts = data.split(b"\n")
            self.cut += sum(1 for part in parts if len(part) >= MAX_LINE)
            data = b"\n".join(part[:MAX_LINE] for part in parts)
        text = data.decode("utf-8", errors="replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if "\x1b" in text:  # colour codes never span a line end
            text = ANSI.sub("", text)
        text = cleaned(text)
        lines = text.split("\n")
        lines[-1] = lines[-1].removesuffix("\r")
        return lines


def cleaned(text: str) -> str:
    """``text`` with full-width colons, commas, equals signs, bars and semicolons as ASCII (see
    :data:`FULL_WIDTH`) and the :data:`INVISIBLE` characters dropped; text without any is
    returned as is, untouched by the translation."""
    return text.translate(_CLEANED) if _TO_CLEAN.search(text) else text


_SRUN_LABEL = re.compile(r" {0,3}(\d{1,4}): ")


def _counted(lines: list[str]) -> bool:
    """Whether the ``N: `` that opens lines is a loop's counter, not ``srun -l``'s rank label: it
    rises on every such line, three or more, to 32 or beyond (a DCGAN's ``48: [D loss: …]``); a
    rank repeats, and the ranks of a paste seldom reach 32."""
    numbers = [int(found.group(1)) for line in lines[:2000] if (found := _SRUN_LABEL.match(line))]
    return len(numbers) >= 3 and numbers[-1] >= 32 and all(a < b for a, b in pairwise(numbers))


_QUOTE = re.compile(r"^(?:> ?)+")  # a Markdown quote's marks, nested ones too: "> ", "> > ", ">"


def _markdown_unquoted(lines: list[str]) -> list[str]:
    """``lines`` without the Markdown quote a user put around a pasted log (``>       13/20
    8.07G      1.674 …``: the YOLO table's columns read as a quote's text), where two lines or more
    open with ``>`` and they outnumber the others (blank ones aside) twice over: a sentence of the
    user's between two quoted blocks is kept as it is (rlpyt#78: "And after some iterations these
    data become meaningful values:"); a log with a line or two of ``>>>>>>>start training`` is no
    quote."""
    head = [line for line in lines[:2000] if line.strip()]
    quoted = sum(line[:1] == ">" for line in head)
    if quoted < 2 or quoted <= 2 * (len(head) - quoted):
        return lines
    return [_QUOTE.sub("", line) if line[:1] == ">" else line for line in lines]


# Markdown bold a user put around a field mid-line (MuseTalk#230: "…, **loss=nan**, lr=4.99e-5"), not
# a banner of asterisks ("***** train metrics *****")
_BOLD = re.compile(r"(?<!\*)\*\*(?![*\s])([^*\n]+?)(?<![*\s])\*\*(?!\*)")


def _unmarked(line: str, ranks: bool = True) -> str:
    """``line`` without a launcher's rank label in front, and without the Markdown bold a user put
    around it, or around a cell of a logger's table, when pasting into an issue (``**Train loss
    12001 0.166141** Grad Norm 0.372761``, ``|    reward    | **-3.8389**  |``): no log line
    opens with ``**``, and no table cell holds one (mid-line, only a bold span is unmarked:
    ``**loss=nan**``); nor with or after a backtick, which a code
    fence left glued to the first or last pasted line (DeepXDE's ```Step      Train loss …``).
    ``ranks``: ``N: `` is a rank's label (not where the file's are a counter, :func:`_counted`)."""
    if line[:1] == "`" or line[-1:] == "`":  # a code fence's backticks glued to the pasted log
        line = line.strip("`")
    label = RANK_LABEL.match(line)
    if label and not ranks and _SRUN_LABEL.match(line):
        label = None  # a counter, kept
    if label and not _DARKNET_REST.match(line, label.end()):
        line = line[label.end() :]
    if "**" not in line:
        return line
    return line.replace("**", "") if line.lstrip()[:1] in ("*", "|") else _BOLD.sub(r"\1", line)


# what follows the iteration and its colon on darknet's (YOLO v2-v4) iteration line: "999: 0.000000,
# 0.000000 avg, 0.009960 rate, 4.79 seconds, 63936 images" (the batch's loss, its running mean, the
# learning rate; AlexeyAB's fork writes "avg loss"). The colon makes it look like a rank label's.
DARKNET_COUNTS = rf"({NUMBER}),\s*({NUMBER})\s+avg(?: loss)?,\s*({NUMBER})\s+rate,"
_DARKNET_REST = re.compile(DARKNET_COUNTS)


_MARKED_STARTS = RANK_STARTS | {"*", "|", "`"}


def _may_hold_overlong(data: bytes) -> bool:
    """Whether a line of ``data`` may be ``MAX_LINE`` bytes or longer: such a line covers a whole
    aligned window of half that size, so windows without a newline are looked for, not lines."""
    half = MAX_LINE // 2
    return any(data.find(b"\n", start, start + half) < 0 for start in range(0, len(data) - half + 1, half))


_CONTROL_BYTES = bytes(b for b in range(32) if chr(b) not in "\n\r\t\x1b\x0c")


def looks_binary(sample: bytes) -> bool:
    """A NUL byte, or more than a tenth of undecodable or control bytes, means it is not a text log."""
    if b"\x00" in sample:
        return True
    text = sample.decode(
        "utf-8", errors="replace"
    )  # a control byte decodes to itself, so it is counted in bytes
    odd = text.count("\ufffd") + len(sample) - len(sample.translate(None, _CONTROL_BYTES))
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
    while (
        end < len(lines)
        and end - start < MAX_PIECES
        and lines[end]
        and not lines[end].isspace()
        and not complete(text)
    ):
        joined = text + lines[end]
        if not fits(joined, lines[end]):
            break
        text, end = joined, end + 1
    return text, end


def unlabel(token: str) -> tuple[str | None, str]:
    """``"layer=3"`` / ``"layer:3"`` → ``("layer", "3")``; a bare token has no label."""
    match = re.fullmatch(r"([A-Za-z_][\w./-]*)[=:](.+)", token)
    return (match.group(1).lower(), match.group(2)) if match else (None, token)
