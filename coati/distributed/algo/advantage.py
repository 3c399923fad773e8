"""Advantage estimators: turn the scalar reward of each completion into a per-token advantage.

One signature for all: ``fn(rewards[B], group_ids[B], response_mask[B,T], cfg) -> AdvantageOutput``. Inputs cover the
whole global batch of one optimizer step (every DP rank computes the same advantages from the same rewards, then keeps
its shard), so whitening never happens per micro-batch. Advantages never carry gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coati.distributed.algo.grouping import group_mean_std, group_sum_count
from coati.registry import Registry

ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor
    """[B, T] float32, zero where response_mask is 0, detached."""


def _finish(adv_per_seq: torch.Tensor, rewards, group_ids, response_mask) -> AdvantageOutput:
    mask = response_mask.to(torch.float32)
    adv = (adv_per_seq.to(torch.float32)[:, None] * mask).detach()
    return AdvantageOutput(adv)


def _check_inputs(rewards: torch.Tensor, group_ids: torch.Tensor, response_mask: torch.Tensor) -> None:
    assert rewards.dim() == 1 and group_ids.shape == rewards.shape, (rewards.shape, group_ids.shape)
    assert response_mask.dim() == 2 and response_mask.shape[0] == rewards.shape[0], response_mask.shape


@ADVANTAGE_ESTIMATORS.register("grpo")
@torch.no_grad()
def grpo_advantage(rewards, group_ids, response_mask, cfg) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean_g(r)) / (std_g(r) + eps), broadcast over tokens.

    std is the Bessel-corrected sample std of the group (as TRL and verl); a group with equal rewards gets A = 0.
    """
    _check_inputs(rewards, group_ids, response_mask)
    r = rewards.double()
    mean, std = group_mean_std(r, group_ids)
    return _finish((r - mean) / (std + cfg.adv_eps), rewards, group_ids, response_mask)


@ADVANTAGE_ESTIMATORS.register("drgrpo")
@torch.no_grad()
def drgrpo_advantage(rewards, group_ids, response_mask, cfg) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_g(r), no std division.

    Dividing by the group std up-weights near-solved and near-failed prompts; Dr. GRPO drops it.
    """
    _check_inputs(rewards, group_ids, response_mask)
    r = rewards.double()
    mean, _ = group_mean_std(r, group_ids)
    return _finish(r - mean, rewards, group_ids, response_mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
@torch.no_grad()
def rloo_advantage(rewards, group_ids, response_mask, cfg) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024): A_i = r_i - (sum_g(r) - r_i) / (G - 1), the mean of the other G-1 samples.

    Equals G/(G-1) * (r_i - mean_g); the baseline excludes the sample itself, so the estimate is unbiased.
    A group of one sample gets A = 0.
    """
    _check_inputs(rewards, group_ids, response_mask)
    r = rewards.double()
    sums, counts = group_sum_count(r, group_ids)
    baseline = (sums - r) / (counts - 1).clamp(min=1)
    adv = torch.where(counts > 1, r - baseline, torch.zeros_like(r))
    return _finish(adv, rewards, group_ids, response_mask)


@ADVANTAGE_ESTIMATORS.register("reinforce_ppb")
@torch.no_grad()
def reinforce_pp_baseline_advantage(rewards, group_ids, response_mask, cfg) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu et al. 2025): a_i = r_i - mean_g(r), then whitened over all response tokens of the
    global batch: A_{i,t} = (a_i - mu) / sqrt(sigma^2 + eps), mu and sigma^2 the masked mean and variance over every
    valid token (the epsilon inside the root, as the paper's whitening).

    Unlike a known bug of its namesake's port, the whitening divides by sigma (never multiplies) and runs once over the
    global batch, not per micro-batch.
    """
    _check_inputs(rewards, group_ids, response_mask)
    r = rewards.double()
    mean, _ = group_mean_std(r, group_ids)
    mask = response_mask.double()
    tok = (r - mean)[:, None] * mask
    n = mask.sum()
    if n == 0:
        return _finish(torch.zeros_like(r), rewards, group_ids, response_mask)
    mu = tok.sum() / n
    var = (((tok - mu) * mask) ** 2).sum() / (n - 1).clamp(min=1)
    adv = ((tok - mu) / (var + cfg.adv_eps).sqrt()) * mask
    return AdvantageOutput(adv.to(torch.float32).detach())
