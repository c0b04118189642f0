"""``name: value`` fields as trainers print them in free text (step lines, pasted snapshots).

A field is a name, then ``:`` / ``=`` or a space, then a number and an optional unit:
``Loss: 0.0123``, ``Grad. Norm 0.41``, ``lr=1e-06``, ``Throughput: 1234 tokens/s``,
``MFU 12.3%``, ``kl_divergence_mean: 1,568,987.96`` (thousands separators, after ``:`` or
``=`` and as the whole value only); an aside in parentheses after a value without a unit is
passed over (llm.c's ``loss 2.0 (+nanz)``, a running mean ``total_loss: 1.39e+01 (1.53e+01)``).
A bare duration (``3.21s``, prime-rl's newer trainer line) is the line's ``Time``. A piece that
is none of these but holds ``key: value`` / ``key=value`` pairs with one-word keys (``loss: 0.5
grad_norm: 1.2``) gives those pairs, named after a held-out split that labels the piece (``val:
loss = 3.3`` → ``val loss``). Anything else gives nothing.
"""

from __future__ import annotations

import re
from typing import Any

from moescope.analyze.readers._text import GROUPED, NUMBER, grouped_number, parse_number

_UNIT = r"[A-Za-z%]+(?:/[A-Za-z]+)?"
# a unit, or an aside after a bare value: llm.c's "(+nanz)", a running mean "(1.53e+01)"
_AFTER = rf"(?:\s*(?P<unit>{_UNIT})|\s*\([^()]*\))?"
_FIELD = re.compile(rf"(?P<key>[A-Za-z_][\w .()/@%+\-]*?)\s*(?:[:=]\s*|\s+)(?P<value>{NUMBER}){_AFTER}")
_LABELLED = re.compile(rf"(?P<key>[A-Za-z_][\w .()/@%+\-]*?)\s*[:=]\s*(?P<value>{NUMBER}){_AFTER}")
_GROUPED_FIELD = re.compile(rf"(?P<key>[A-Za-z_][\w .()/@%+\-]*?)\s*[:=]\s*(?P<value>{GROUPED})")
_DURATION = re.compile(rf"(?P<value>{NUMBER})\s*s")
_PAIR = re.compile(rf"(?<![\w./@\-])(?P<key>[A-Za-z_][\w./@\-]*)\s*[:=]\s*(?P<value>{NUMBER})(?![\w.])")
# a number standing alone among a name's words, or a duration or share ("0.813s" of the TF Object
# Detection API's "Step 100 per-step time 0.813s loss=1.396")
_NUMBER_WORD = re.compile(rf"(?:^|\s)(?:{NUMBER})(?:m?s|%)?(?:\s|$)")
_SPACED_PAIR = re.compile(rf"(?P<key>[A-Za-z_][\w./@\-]*)\s+(?P<value>{NUMBER})(?=\s|$)")
_SPACED_PAIRS = re.compile(rf"[A-Za-z_][\w./@\-]*\s+(?:{NUMBER})(?:\s+[A-Za-z_][\w./@\-]*\s+(?:{NUMBER}))+")
# a gap tried from its first space only (from each of a long run's spaces, the run's square)
SEPARATORS = re.compile(r"(?:(?<!\s)\s+)?\|\s*|(?:(?<!\s)\s+)?,\s+|(?<!\s)\s+-\s+|\t+")
DURATION_KEY = "Time"
HELD_OUT = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev"})
# a piece that opens with a held-out split's label: rat-sql's "Step 14100 stats, val: loss = 3.32"
_SPLIT_LABEL = re.compile(r"\s*(?P<split>[A-Za-z]+)\s*:\s*(?=[A-Za-z_])")


_COPULA = re.compile(r"(?<=\w) +(?:is|was|are|were)$", re.IGNORECASE)


def field(piece: str, labelled: bool = False) -> tuple[str, Any] | None:
    """The one ``(name, value)`` field ``piece`` is, or ``None``; ``labelled``: only with a
    ``:`` or ``=`` between them (a line of prose is not a field then). A name with a number among
    its words is no name: ``loss 6.70 grad_norm 1.0`` is two fields (:func:`fields`)."""
    piece = piece.strip()
    match = (_LABELLED if labelled else _FIELD).fullmatch(piece)
    if match and _NUMBER_WORD.search(match.group("key")):
        match = None
    if match and not (match.group("unit") and match.group("value")[-1].isalpha()):  # "info" is no inf + "o"
        # a sentence's verb before the colon is no part of the name: "eval success rate is: 0.000"
        return _COPULA.sub("", match.group("key").strip()), parse_number(match.group("value"))
    grouped = _GROUPED_FIELD.fullmatch(piece)  # "kl_divergence_mean: 1,568,987.96" (torchforge#664)
    if grouped:
        return grouped.group("key").strip(), grouped_number(grouped.group("value"))
    match = None if labelled else _DURATION.fullmatch(piece)
    return (DURATION_KEY, parse_number(match.group("value"))) if match else None


def fields(text: str) -> dict[str, Any]:
    """Every field of ``text``, split at ``|``, ``, ``, `` - `` or tabs; a later name wins; a piece
    of names and values one space apart (``loss 6.70 grad_norm 1.0``) is a field a pair."""
    out: dict[str, Any] = {}
    for piece in SEPARATORS.split(text):
        found = field(piece)
        if found:
            out[found[0]] = found[1]
            continue
        if _SPACED_PAIRS.fullmatch(piece.strip()):
            out.update((m.group("key"), parse_number(m.group("value"))) for m in _SPACED_PAIR.finditer(piece))
            continue
        split = _held_out_split(piece)
        for pair in _PAIR.finditer(piece):
            out[split + pair.group("key")] = parse_number(pair.group("value"))
    return out


def _held_out_split(piece: str) -> str:
    """``"val "`` for a piece labelled ``val: loss = 3.32``, so its pairs keep their own names
    (the bare ``loss`` of a validation line would replace the training loss of its step)."""
    label = _SPLIT_LABEL.match(piece)
    split = label.group("split") if label else ""
    return f"{split} " if split.lower() in HELD_OUT else ""
