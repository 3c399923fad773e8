"""A training step's metrics, reduced over micro-batches and then over data-parallel ranks, each by its kind.

A key ending in ``_max`` is a maximum (the largest value any micro-batch on any rank saw), ``_min`` a minimum, any
other key a mean weighted by the tokens each micro-batch contributed. Every consumer returns the same reduced values,
so the step's metrics describe the whole global batch, not DP rank 0's shard.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import torch


def metric_kind(key: str) -> str:
    if key.endswith("_max"):
        return "max"
    if key.endswith("_min"):
        return "min"
    return "mean"


class StepMetrics:
    def __init__(self):
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)
        self.extremes: dict[str, float] = {}

    def add(self, key: str, value: float, weight: float) -> None:
        """One micro-batch's value of ``key``; ``weight`` is its number of loss tokens (for means)."""
        kind = metric_kind(key)
        value = float(value)
        if kind == "mean":
            self.sums[key] += value * weight
            self.weights[key] += weight
        elif key not in self.extremes:
            self.extremes[key] = value
        else:
            self.extremes[key] = max(self.extremes[key], value) if kind == "max" else min(self.extremes[key], value)

    def reduce(self, all_reduce: Callable[[torch.Tensor, str], None] | None = None) -> dict[str, float]:
        """The reduced metrics; ``all_reduce(tensor, op)`` (op: "sum", "max" or "min", in place) combines them across
        data-parallel ranks, which must have added the same keys."""
        means = sorted(self.sums)
        maxes = sorted(k for k in self.extremes if metric_kind(k) == "max")
        mins = sorted(k for k in self.extremes if metric_kind(k) == "min")
        sums = torch.tensor([[self.sums[k] for k in means], [self.weights[k] for k in means]], dtype=torch.float64)
        hi = torch.tensor([self.extremes[k] for k in maxes], dtype=torch.float64)
        lo = torch.tensor([self.extremes[k] for k in mins], dtype=torch.float64)
        if all_reduce is not None:
            for tensor, op in ((sums, "sum"), (hi, "max"), (lo, "min")):
                if tensor.numel():
                    all_reduce(tensor, op)
        out = {k: float(sums[0, i] / max(float(sums[1, i]), 1e-9)) for i, k in enumerate(means)}
        out.update({k: float(hi[i]) for i, k in enumerate(maxes)})
        out.update({k: float(lo[i]) for i, k in enumerate(mins)})
        return out
