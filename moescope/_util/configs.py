"""Config dataclasses read back from their dicts (a trace header, a manifest, a ``--config`` file)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from moescope.errors import MoescopeError

Config = TypeVar("Config")


def config_from_dict(cls: type[Config], d: dict[str, Any], noun: str) -> Config:
    """``cls(**d)``, where an unknown field or a value of the wrong type is one sentence naming
    the fix (``noun``: ``"replay"``, ``"export"``)."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise MoescopeError(
            f"Unknown {noun} config field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}."
        )
    try:
        return cls(**d)
    except TypeError as err:  # a string where a number belongs, and the like
        raise MoescopeError(
            f"{noun.capitalize()} config has a field of the wrong type ({err}); see {cls.__name__}'s fields."
        ) from None
