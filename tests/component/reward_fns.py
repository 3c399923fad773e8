"""User reward functions for the pool tests (resolved by dotted path in worker processes)."""

import os

from coati.distributed.reward.base import RewardResult


def crashy(completions, **fields):
    out = []
    for c in completions:
        if c == "crash":
            os._exit(3)
        if c == "raise":
            raise ValueError("bad sample")
        out.append(RewardResult(1.0, True, True))
    return out
