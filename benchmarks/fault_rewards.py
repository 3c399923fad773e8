"""Reward functions of the fault benchmark (``bench_faults.py``), importable by its reward workers."""

from __future__ import annotations

import os
import time


def digits(completions, hang_flag: str = "", **fields):
    """Fraction of each completion's characters that are digits; hangs (an hour) while the file ``hang_flag`` exists."""
    if hang_flag and os.path.exists(hang_flag):
        time.sleep(3600)
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
