"""KL to the reference as a per-token reward penalty (the classic RLHF reward, Ziegler et al. 2019; OpenRLHF's
``--init_kl_coef``), its coefficient fixed or steered by an adaptive controller, and the running reward statistics
``normalize_reward`` scales by. Pure: the driver keeps the controller's and the statistics' state (saved with every
checkpoint) and hands each step's values to the trainers with its batch.

- ``kl_penalty``: token_rewards[B, T] = -coef * KL_t(pi_old || pi_ref), KL_t one of the ``kl`` estimators
- ``KLController``: coef fixed, or multiplied by 1 + clip(KL / target - 1, -0.2, 0.2) * n / horizon after each step
- ``RunningMoments``: mean and variance over every reward seen so far (Chan et al.'s parallel update)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from coati.distributed.algo.kl import KL_ESTIMATORS


def kl_penalty(old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, coef: float, estimator: str):
    """(token_rewards [B, T] = -coef * KL_t on the valid tokens, KL per completion [B] = sum_t KL_t): the policy
    that sampled (its log-probs before the step's update) against the reference."""
    kl = KL_ESTIMATORS.get(estimator)(old_logprobs.double(), ref_logprobs.double()) * mask.double()
    return (-coef * kl).detach(), kl.sum(-1).detach()


@dataclass
class KLController:
    """The KL-in-reward coefficient: ``value`` stays at its start without ``target``; with one, each step's mean KL
    per completion moves it by the proportional error, clipped to +-20%, scaled by the step's completions over
    ``horizon`` (Ziegler et al. 2019's adaptive controller)."""

    value: float
    target: float | None = None
    horizon: int = 10000

    def update(self, kl_per_completion: float, completions: int) -> None:
        if self.target is None or not math.isfinite(kl_per_completion):
            return
        error = min(max(kl_per_completion / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * completions / self.horizon

    def state(self) -> dict:
        return {"value": self.value}

    def restore(self, state: dict) -> None:
        self.value = float(state["value"])


@dataclass
class RunningMoments:
    """Mean and (population) variance of every value seen, updated batch by batch."""

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0
    """sum of squared deviations from the mean"""

    def update(self, values) -> None:
        x = torch.as_tensor(values, dtype=torch.float64).flatten()
        n = float(x.numel())
        if not n:
            return
        batch_mean = float(x.mean())
        batch_m2 = float(((x - batch_mean) ** 2).sum())
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * n / total
        self.m2 += batch_m2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 1.0

    def normalize(self, values, eps: float = 1e-8):
        """``values`` as (x - mean) / (std + eps) under the statistics so far."""
        return (torch.as_tensor(values, dtype=torch.float64) - self.mean) / (self.std + eps)

    def state(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def restore(self, state: dict) -> None:
        self.count, self.mean, self.m2 = float(state["count"]), float(state["mean"]), float(state["m2"])
