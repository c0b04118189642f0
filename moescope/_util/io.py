"""Atomic output: every file and directory moescope writes appears whole or not at all.

Results are written to a temporary sibling (same file system, so the final rename is
atomic) and renamed into place; a crash or a kill leaves the old output, or none, never a
half-written one. An existing output is replaced only when the caller says so.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moescope.errors import MoescopeError


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to a temporary sibling of ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_output_dir(out: str | Path, *, overwrite: bool = False) -> Path:
    """Refuse an existing non-empty ``out`` unless ``overwrite``; return its absolute path.

    Call it before long work too, so that a mistake costs seconds rather than a whole run.
    """
    out = Path(out).expanduser().absolute()
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise MoescopeError(f"{out} already exists and is not empty; pass --overwrite to replace it.")
    return out


def fresh_sibling(out: Path, prefix: str) -> Path:
    """A new empty directory beside ``out`` (same file system, so renames are atomic).

    Its name carries this process's id, so the leftovers of a killed run (a ``kill -9`` cannot
    clean up) are recognised and removed by the next run that writes the same output.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out.parent, prefix)
    while True:
        candidate = out.parent / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate


def _remove_stale(parent: Path, prefix: str) -> None:
    """Remove ``prefix<pid>-*`` directories whose process is gone."""
    for path in parent.glob(f"{glob.escape(prefix)}*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            remove(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def swap_into_place(work: Path, out: Path) -> None:
    """Rename the finished ``work`` directory to ``out``; an old ``out`` is removed last."""
    if not out.exists():
        work.rename(out)
        return
    old = work.with_name(f"{work.name}.old")
    out.rename(old)
    work.rename(out)
    remove(old)


def replace_dir(out: str | Path, fill: Callable[[Path], object], *, overwrite: bool = False) -> Path:
    """Create directory ``out`` atomically: ``fill(tmp)`` writes a temporary sibling, then a rename.

    Raises
    ------
    MoescopeError
        If ``out`` exists and is not an empty directory, unless ``overwrite``.
    """
    out = check_output_dir(out, overwrite=overwrite)
    work = fresh_sibling(out, f".{out.name}.partial-")
    try:
        fill(work)
        swap_into_place(work, out)
    except BaseException:
        remove(work)
        raise
    return out


def readable(directory: Path) -> None:
    """Give the files of a finished output ordinary permissions (some writers create them private)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in directory.rglob("*"):
        path.chmod((0o755 if path.is_dir() else 0o644) & ~mask)


def remove(path: Path) -> None:
    """Delete a file or a directory tree, if present."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON file that must hold one object; anything else is one sentence ending in ``fix``."""
    if not path.is_file():
        raise MoescopeError(f"{path} does not exist; {fix}.")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MoescopeError(f"{path} is not valid JSON ({exc}); {fix}.") from None
    if not isinstance(data, dict):
        raise MoescopeError(f"{path} holds a JSON {type(data).__name__}, not an object; {fix}.")
    return data


def json_line(line: str, where: str) -> Any:
    """One line of a ``.jsonl`` file, refused in one sentence naming ``where`` (``file:line``)
    when it is no JSON."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        message = f"{where} is not valid JSON ({err.msg}); write one JSON object per line."
        raise MoescopeError(message) from None
