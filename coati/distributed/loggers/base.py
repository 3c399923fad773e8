"""The logger seam: what a logging backend receives from the reporter."""

from __future__ import annotations

import importlib
from pathlib import Path


def require(module: str, package: str):
    """``module``, imported for the logger of that package, or an ImportError with the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"report_to has {package} but it is not installed: pip install {package}") from e


class Logger:
    """One backend. ``out`` is the run folder (backends write under it), ``append`` whether a resumed run adds to an
    earlier run's files."""

    REQUIRES: tuple[str, str] | None = None
    """(module, pip package) the backend imports, checked when the reporter is made"""

    def __init__(self, out: Path, project: str, config: dict, append: bool):
        self.out = out

    def log(self, step: int, scalars: dict) -> None:
        """A step's scalar metrics (step 0: the evaluation before training)."""
        raise NotImplementedError

    def completions(self, step: int, rows: list[dict]) -> None:
        """Sample completions of a step: dicts with prompt, response, reward, policy_version."""
        raise NotImplementedError

    def truncate(self, from_step: int) -> None:
        """Forget what was logged for ``from_step`` and later: a resumed or restarted run trains those steps again
        from its checkpoint, and each step must appear once. Backends that cannot rewrite history keep it."""

    def close(self) -> None:
        pass
