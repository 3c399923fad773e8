"""Reward functions and an environment of the fault benchmark (``bench_faults.py``), importable by its actors."""

from __future__ import annotations

import os
import time

from coati.distributed.envs.base import Environment, EnvStep


def digits(completions, hang_flag: str = "", **fields):
    """Fraction of each completion's characters that are digits; hangs (an hour) while the file ``hang_flag`` exists."""
    if hang_flag and os.path.exists(hang_flag):
        time.sleep(3600)
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


class HangingEnv(Environment):
    """One turn, rewarded by ``digits``; its step hangs (an hour) while the file ``hang_flag`` exists."""

    name = "hanging"
    max_turns = 1

    def __init__(self, row: dict, hang_flag: str = "", **options):
        super().__init__(row)
        self.hang_flag = hang_flag

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": self.row["prompt"]}]

    def step(self, text: str) -> EnvStep:
        if self.hang_flag and os.path.exists(self.hang_flag):
            time.sleep(3600)
        return EnvStep(done=True, reward=digits([text])[0])
