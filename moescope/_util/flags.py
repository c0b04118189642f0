"""Command-line flags generated from a config dataclass, so that each default is written once.

A field declared with ``field(default=..., metadata=flag(...))`` carries its help beside its
default (and, where wanted, a metavar, the allowed choices, a flag name other than
``--field-name``, and the words shown for a default whose value says little, such as ``None``).
:func:`add_flags` gives a parser one flag per named field, typed by the field's annotation, with
the default in its help; the flag's own default is ``argparse.SUPPRESS``, so :func:`flag_values`
returns only the flags given on the command line, and a config built from them keeps its
defaults (or a config file's values) for the rest.

Examples
--------
>>> import argparse
>>> from dataclasses import dataclass, field
>>> @dataclass(frozen=True)
... class Run:
...     steps: int = field(default=20, metadata=flag("RL steps", metavar="N"))
...     fast: bool = field(default=False, metadata=flag("skip the checks"))
>>> parser = argparse.ArgumentParser()
>>> add_flags(parser, Run)
>>> flag_values(parser.parse_args([]), Run), flag_values(parser.parse_args(["--steps", "5"]), Run)
({}, {'steps': 5})
>>> parser._option_string_actions["--steps"].help
'RL steps (default: 20)'
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any


def flag(
    help: str,
    *,
    metavar: str | None = None,
    choices: Sequence[str] | None = None,
    name: str | None = None,
    shown: str | None = None,
) -> dict[str, Any]:
    """The metadata of a config field that has a flag: ``field(default=..., metadata=flag(...))``.

    ``name`` replaces ``--field-name``; ``shown`` replaces the default in the help where the value
    alone would not say what it means (``None`` standing for "the model's own", and the like).
    """
    metadata = {"help": help, "metavar": metavar, "choices": choices, "flag": name, "shown": shown}
    return {key: value for key, value in metadata.items() if value is not None}


def shown_default(field: dataclasses.Field) -> str:
    """The default of ``field`` as the help shows it: ``on``/``off`` for a switch, ``none`` for an
    empty tuple, the ``shown`` words where the field has them, else the value."""
    if "shown" in field.metadata:
        return field.metadata["shown"]
    value = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def config_field(config: type, name: str) -> dataclasses.Field:
    """The field ``name`` of the dataclass ``config``."""
    return next(field for field in dataclasses.fields(config) if field.name == name)


def add_flags(parser: argparse.ArgumentParser, config: type) -> None:
    """Add one flag per field of ``config`` declared with :func:`flag` metadata, in field order:
    ``--field-name`` (or the field's own name), typed by its annotation, with its choices and
    metavar, and its default in the help.

    A ``bool`` field that is off by default becomes a switch (``--pivot``); one that is on, or
    ``None`` (decided later), becomes a ``--name/--no-name`` pair.
    """
    hints = typing.get_type_hints(config)
    for field in flagged_fields(config):
        meta, name = field.metadata, field.name
        kind = _flag_type(hints[name])
        text = f"{meta['help']} (default: {shown_default(field)})".replace("%", "%%")
        options: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": text}
        if kind is bool:
            options["action"] = "store_true" if field.default is False else argparse.BooleanOptionalAction
        else:
            options.update(type=kind, metavar=meta.get("metavar"), choices=meta.get("choices"))
        parser.add_argument(meta.get("flag", "--" + name.replace("_", "-")), **options)


def flagged_fields(config: type) -> list[dataclasses.Field]:
    """The fields of ``config`` that have a flag."""
    return [field for field in dataclasses.fields(config) if "help" in field.metadata]


def flag_values(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The fields of ``config`` that flags added by :func:`add_flags` set on the command line."""
    given = vars(args)
    return {field.name: given[field.name] for field in flagged_fields(config) if field.name in given}


def _flag_type(hint: Any) -> type:
    """The type a flag's text is parsed to: the annotation, or the first of its union that is not ``None``."""
    is_union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    members = typing.get_args(hint) if is_union else (hint,)
    return next(member for member in members if member is not type(None))
