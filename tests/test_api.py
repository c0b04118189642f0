"""The top level: the journey's verbs and result types, each found in its stage package."""

from __future__ import annotations

import importlib
import types

import pytest

import moescope


def test_every_public_name_resolves_to_its_stage_module() -> None:
    for name in moescope.__all__:
        value = getattr(moescope, name)
        if name in {"__version__", "MoescopeError"}:
            continue
        if isinstance(value, types.ModuleType):  # moescope.replay: the package is the callable
            assert callable(value), name
            continue
        assert getattr(importlib.import_module(moescope._PUBLIC[name]), name) is value, name


def test_the_public_api_stays_small() -> None:
    assert 20 <= len(moescope.__all__) <= 32


@pytest.mark.parametrize("name", sorted(moescope._MOVED))
def test_a_moved_name_still_resolves_and_says_where_it_lives(name: str) -> None:
    home = moescope._MOVED[name]
    with pytest.warns(DeprecationWarning, match=home.replace(".", r"\.")):
        value = getattr(moescope, name)
    assert value is getattr(importlib.import_module(home), name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        moescope.nothing_here  # noqa: B018
