"""Learning-rate schedules: the factor a consumer multiplies ``learning_rate`` by at each optimizer step. Pure.

Positions count optimizer steps (a training step makes ``num_iterations * train_batch_size / train_minibatch_size``
of them). A linear warmup rises over the first ``warmup`` of them to the full rate, reaching it at the warmup's last
step (never 0, so no step is wasted); then the rate stays (``constant``), or decays to ``min_ratio`` of it over the
rest of ``total`` steps, in a straight line (``linear``) or half a cosine (``cosine``).
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, total: int, kind: str, warmup: int = 0, min_ratio: float = 0.0) -> float:
    """Factor at optimizer step ``step`` (0-based) of ``total``: ``(step + 1) / warmup`` while ``step < warmup``,
    then with p = (step - warmup) / (total - warmup): 1 (constant), 1 - (1 - m) p (linear), or
    m + (1 - m)(1 + cos(pi p)) / 2 (cosine), m = ``min_ratio``."""
    if kind not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {SCHEDULES}, got {kind!r}")
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    p = min((step - warmup) / max(total - warmup, 1), 1.0)
    if kind == "linear":
        return 1.0 - (1.0 - min_ratio) * p
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
