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


def digit_fraction(completions, **fields):
    """Fraction of the response's characters that are digits: an easy signal for a tiny random model to climb."""
    out = []
    for c in completions:
        frac = sum(ch.isdigit() for ch in c) / max(len(c), 1)
        out.append(RewardResult(frac, True, frac > 0.5))
    return out


def plain_floats(completions, **fields):
    return [float(len(c)) for c in completions]


def wrong_type(completions, **fields):
    return ["1.0" for _ in completions]
