"""Each actor's start-up marks, for the run's start-up account (``summary.json``'s ``startup.actors``): when its
process started (by the kernel's record), when its class's module and imports were done (its ``__init__`` runs), when
its ``setup`` began, when its engine was built (the model loaded: an inference engine or the trainer's booster) and when
it was ready. Times are wall-clock seconds since the epoch, so the driver can set marks from several processes (and,
as far as their clocks agree, several nodes) on its own account's time line."""

from __future__ import annotations

import os
import time
from pathlib import Path

MARKS = ("imported", "setup", "engine", "ready")
"""the marks an actor sets, in order (``process``, its start, is read from the kernel)"""

_marks: dict[str, float] = {}


def process_age_s() -> float | None:
    """Seconds since this process started, from the kernel's record of it (None where there is no /proc)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


def mark(name: str) -> None:
    """Set mark ``name`` (one of ``MARKS``) to now."""
    assert name in MARKS, name
    _marks[name] = time.time()


def marks() -> dict[str, float]:
    """This process's marks so far, with ``process`` (its start) where the kernel says it."""
    age = process_age_s()
    return {**({"process": time.time() - age} if age is not None else {}), **_marks}
