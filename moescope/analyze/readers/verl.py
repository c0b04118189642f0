"""verl's console logger: ``step:N - key:value - key:value …``, one line per training step.

verl prints every numeric metric of a step as ``key:value`` joined by ``" - "``
(``aggregate_logger.concat_dict_to_str``). What a pasted log adds on top, and how it is read:

- numbers: ``f"{v:.3f}"`` before verl PR #2303 (``actor/lr:0.000``), ``pprint.pformat`` after it
  (full precision, and ``np.float64(0.5)`` / ``np.int64(3)`` with numpy 2); ``nan``, ``inf`` and
  ``-inf`` become those floats;
- Ray's ``(TaskRunner pid=…)`` / ``(main_task pid=…)`` prefix (and its colour codes) and its
  ``[repeated Nx across cluster]`` suffix are ignored;
- a line a terminal wrapped, even inside a key (``critic`` / ``/rewards/min:0.0``) or a
  number (``235.7`` / ``8125``), is rejoined: a following line continues the record while the
  joined text still reads as ``key:value`` pairs (or a prefix of one);
- the validation line verl prints for the same step is merged into it (see ``_rows``).
- a ``step:N`` line with no pair after it takes the ``key:value`` lines below it (a step's
  metrics copied one a line, from a W&B panel or a console).
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from itertools import repeat

from moescope.analyze.readers._rows import Parsed, Row, scan
from moescope.analyze.readers._text import INT, NUMBER, LogFile, gather, parse_number, plain_numbers

# "step:" not after a word or "/": the literal first (the boundary looked back at once it is
# found), so a search skips along the line instead of trying the lookbehind at every character
STEP_START = re.compile(rf"step:(?<=(?<![\w/])step:)({INT})(?=\s*-|\s*$)")
RAY_PREFIX = re.compile(r"^\s*\([\w.:-]+ pid=\d+(?:, ip=[^)]*)?\)")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_KEY = r"[A-Za-z_][^\s:]*"
_VALUE = rf"{NUMBER}|True|False|None"
_PAIR = re.compile(rf"\s*-\s*({_KEY}):({_VALUE})(?=\s*-|\s*$)")
_KEY_ONLY = re.compile(_KEY)
_ONE_PAIR = re.compile(rf"\s*({_KEY}):({_VALUE})\s*")
_PAIRS = re.compile(rf"(?:{_PAIR.pattern})*")  # a run of pairs, found in one call


@cache
def _partial() -> re.Pattern[str]:
    """What may stand at the end of a wrapped piece: the start of one more ``key:value`` pair."""
    words = ("nan", "inf", "infinity", "True", "False", "None")
    prefixes = "|".join(sorted({w[:i] for w in words for i in range(1, len(w) + 1)}, key=len, reverse=True))
    number = r"[-+]?(?:\d+(?:\.\d*)?|\.\d*)?(?:[eE][-+]?\d*)?"
    value = rf"np(?:\.(?:\w+(?:\(\s*(?:{number}|[-+]?(?:{prefixes}))\s*)?)?)?|[-+]?(?:{prefixes})|{number}"
    return re.compile(rf"\s*-?\s*(?:{_KEY}(?::(?:{value}))?)?")


def pairs(text: str, pos: int) -> tuple[list[tuple[str, str]], str]:
    """The ``key:value`` pairs from ``pos`` on, and the text after the last one."""
    end = _PAIRS.match(text, pos).end()
    return _PAIR.findall(text, pos, end), text[end:]


def plain_pairs(rest: str) -> dict[str, int | float] | None:
    """The pairs of a record's ``rest`` when it is nothing but `` - key:value`` pairs with plain
    numbers, read by ``str.split`` (what :func:`pairs` finds, at a fraction of its cost); ``None``
    for anything else, which :func:`pairs` then reads."""
    pieces = rest.split(" - ")
    body = pieces[1:]
    if not body or pieces[0] or set(map(str.count, body, repeat(":"))) != {1}:  # one colon a pair
        return None
    flat = ":".join(body).split(":")
    keys, values = flat[0::2], flat[1::2]
    if not _are_keys(tuple(keys)):
        return None
    numbers = plain_numbers(values)
    return None if numbers is None else dict(zip(keys, numbers, strict=True))


@lru_cache(maxsize=1 << 12)  # a log repeats one or a few key lists
def _are_keys(keys: tuple[str, ...]) -> bool:
    return all(_KEY_ONLY.fullmatch(key) is not None for key in keys)


def is_record(line: str) -> bool:
    """A verl console step line (the start of one, if a terminal wrapped it)."""
    return STEP_START.search(line) is not None


def _readable(text: str) -> bool:
    match = STEP_START.search(text)
    if match is None:
        return False
    rest = pairs(_unrepeated(text), match.end())[1]
    return _partial().fullmatch(rest) is not None


def _unrepeated(text: str) -> str:
    """``text`` without Ray's ``[repeated Nx across cluster]`` suffix."""
    return _REPEATED.sub("", text) if "[repeated" in text else text


def _continues(joined: str, piece: str) -> bool:
    return not RAY_PREFIX.match(piece) and not is_record(piece) and _readable(joined)


def read(log: LogFile) -> Parsed:
    """Every ``step:N - …`` record of a verl console log."""
    unread: list[int] = []

    def parse_at(lines: list[str], i: int) -> tuple[list[Row], int] | None:
        match = STEP_START.search(lines[i])
        if match is None:
            return None
        text, end = gather(lines, i, lambda _: False, _continues)
        text = _unrepeated(text)
        metrics = plain_pairs(text[match.end() :])  # text starts with lines[i]
        if metrics is None:
            found, rest = pairs(text, match.end())
            if rest.strip(" -"):
                unread.append(i + 1)
            metrics = {key: parse_number(value) for key, value in found}
        if not metrics:  # "step:2" alone: the step's pairs pasted one a line below it
            while end < len(lines) and (pair := _ONE_PAIR.fullmatch(lines[end])):
                metrics[pair.group(1)] = parse_number(pair.group(2))
                end += 1
        return [Row(int(match.group(1)), metrics, "\n".join(lines[i:end]), i + 1)], end

    parsed = scan(log.lines, parse_at)
    parsed.framework = "verl"
    if unread:
        parsed.notes.append(
            f"{len(unread)} step lines end in text that is no key:value pair "
            f"(the first is line {unread[0]}); the pairs before it were read"
        )
    return parsed
