"""User-facing errors.

A :class:`MoescopeError` is a mistake the user can fix (a wrong path, an unsupported model, an
impossible keep ratio). Its message is one sentence that names the problem and the fix; the
command line prints it without a traceback and exits with status 2. Anything else is a bug.
"""

from __future__ import annotations


class MoescopeError(Exception):
    """A problem with the user's input, explained in one sentence with the fix."""


class ModelLoadError(MoescopeError):
    """The path given as a model is not a loadable Hugging Face checkpoint."""


class UnsupportedArchitectureError(MoescopeError):
    """The model is not a Mixture-of-Experts architecture moescope knows."""
