"""User reward functions for the pool tests (resolved by dotted path in worker processes)."""

import os
import time

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


def nan_on_q1(completions, **fields):
    """NaN for the prompt 'q1' (found by its row's label), else 0.5."""
    return [float("nan") if label == "q1" else 0.5 for label in fields["label"]]


def always_raises(completions, **fields):
    raise KeyError("gold")


def raises_on_q1(completions, label, **fields):
    """A bug that hits one prompt in sixteen: 4 of 64 completions of a 16-prompt draw."""
    if label[0] == "q1":
        raise ZeroDivisionError("division by zero in the scorer")
    return [0.25 * (i % 4) for i in range(len(completions))]


def trl_style(prompts, completions, scale: float = 1.0, shout: bool = False, **kwargs):
    """Written for TRL (prompts first, completions by name) with typed options: scale x (2 if shout) when the prompt
    is 'q3', else 0."""
    return [scale * (2.0 if shout else 1.0) if p == "q3" else 0.0 for p in prompts]


def gt_as_reward(completions, gt_answer, **fields):
    """The row's reference answer as the reward (to check that a mapped answer column reaches the reward)."""
    return [RewardResult(float(a), True, float(a) > 0) for a in gt_answer]


def batch_sizes(completions, **fields):
    """Each completion's reward is the number of completions in its call ("hang" sleeps a minute, "raise" raises)."""
    import time

    if "hang" in completions:
        time.sleep(60)
    if "raise" in completions:
        raise ValueError("bad sample")
    return [float(len(completions))] * len(completions)


def by_text(completions, **fields):
    """A TRL-style verdict read from the completion: "none" -> no score, "boom" -> raises, "slow" -> sleeps past any
    short time limit, else its number."""
    if "boom" in completions:
        raise RuntimeError("boom in the scorer")
    if "slow" in completions:
        time.sleep(30)
    return [None if c == "none" else float(c) for c in completions]
