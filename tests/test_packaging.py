"""The set-up files agree with each other: pyproject is the one list of dependencies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ENVIRONMENT = yaml.safe_load((ROOT / "environment.yml").read_text())


def _makefile_torch_pin() -> str:
    match = re.search(r"^TORCH_SPEC\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert match, "the Makefile must pin torch in TORCH_SPEC"
    return match.group(1)


def _pip_section() -> list[str]:
    sections = [d["pip"] for d in ENVIRONMENT["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1
    return sections[0]


def test_environment_python_satisfies_requires_python() -> None:
    python = next(d for d in ENVIRONMENT["dependencies"] if isinstance(d, str) and d.startswith("python"))
    version = python.split("=", 1)[1]
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(f"{version}.0")


def test_environment_installs_this_package_with_existing_extras() -> None:
    installs = [line for line in _pip_section() if line.startswith("-e")]
    assert len(installs) == 1
    extras = re.search(r"\[(.*)\]", installs[0]).group(1).split(",")
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"])


def test_environment_lists_no_dependency_of_its_own() -> None:
    """Besides the torch build choice, every dependency comes from pyproject."""
    others = [line for line in _pip_section() if not line.startswith("-e")]
    assert [Requirement(line).name for line in others] == ["torch"]


def test_torch_pin_is_the_same_everywhere_and_inside_the_range() -> None:
    pin = _makefile_torch_pin()
    assert pin in _pip_section()
    torch_req = next(
        Requirement(r) for r in PYPROJECT["project"]["dependencies"] if Requirement(r).name == "torch"
    )
    assert torch_req.specifier.contains(pin.split("==")[1])


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_subpackage_ships_in_a_wheel() -> None:
    """The package list is explicit (notebooks/ ships as moescope.notebooks), so a new
    subpackage must be added to it, or a wheel install would lack it."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "moescope").rglob("__init__.py")
        if "checkpoint" not in init.parts
    }
    assert found <= listed, sorted(found - listed)


def test_every_embedded_checkpoint_ships_in_a_wheel() -> None:
    """Each embedded model's checkpoint (weights, tokenizer, card) is package data of its subpackage."""
    from moescope.models.embedded import EMBEDDED

    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert {f"moescope.models.{package}" for package in EMBEDDED.values()} <= set(data)
    assert all(data[f"moescope.models.{package}"] == ["checkpoint/*"] for package in EMBEDDED.values())
