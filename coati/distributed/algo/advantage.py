"""Advantage estimators: turn the scalar reward of each completion into a per-token advantage.

One signature for all: ``fn(rewards[B], group_ids[B], response_mask[B,T], cfg, *, values=None, token_rewards=None)
-> AdvantageOutput``. ``values`` [B,T] are a critic's V(s_t) before each response token, ``token_rewards`` [B,T]
per-token additions to the reward (the KL penalty of ``kl_reward``); the group baselines take neither. Inputs cover
the whole global batch of one optimizer step (every DP rank, and the critic, computes the same advantages and returns
from the same rewards, then keeps its shard), so whitening never happens per micro-batch. Nothing carries gradient.
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
    returns: torch.Tensor | None = None
    """[B, T] float32, the critic's regression targets (estimators with values), zero where response_mask is 0"""


def _finish(adv_per_seq: torch.Tensor, rewards, group_ids, response_mask) -> AdvantageOutput:
    mask = response_mask.to(torch.float32)
    adv = (adv_per_seq.to(torch.float32)[:, None] * mask).detach()
    return AdvantageOutput(adv)


def _check_inputs(rewards, group_ids, response_mask, values=None, token_rewards=None, group: bool = True) -> None:
    assert rewards.dim() == 1 and group_ids.shape == rewards.shape, (rewards.shape, group_ids.shape)
    assert response_mask.dim() == 2 and response_mask.shape[0] == rewards.shape[0], response_mask.shape
    if group:  # a group baseline has no per-token reward or value to take: refused by AlgorithmConfig
        assert values is None and token_rewards is None, "group baselines take no values or token rewards"
    for extra in (values, token_rewards):
        assert extra is None or extra.shape == response_mask.shape, (extra.shape, response_mask.shape)


@ADVANTAGE_ESTIMATORS.register("grpo")
@torch.no_grad()
def grpo_advantage(rewards, group_ids, response_mask, cfg, *, values=None, token_rewards=None) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean_g(r)) / (std_g(r) + eps), broadcast over tokens.

    std is the Bessel-corrected sample std of the group (as TRL and verl); a group with equal rewards gets A = 0.
    """
    _check_inputs(rewards, group_ids, response_mask, values, token_rewards)
    r = rewards.double()
    mean, std = group_mean_std(r, group_ids)
    return _finish((r - mean) / (std + cfg.adv_eps), rewards, group_ids, response_mask)


@ADVANTAGE_ESTIMATORS.register("none")
@torch.no_grad()
def no_advantage(rewards, group_ids, response_mask, cfg, *, values=None, token_rewards=None) -> AdvantageOutput:
    """No reward term: A = 0 everywhere. On-policy distillation's estimator (OPD): its advantage is the teacher's
    per-token term alone (``distill.distill_advantages``, added by the trainer with ``distill_coef``); the rewards
    are still scored and logged."""
    _check_inputs(rewards, group_ids, response_mask, values, token_rewards)
    return _finish(torch.zeros_like(rewards, dtype=torch.float64), rewards, group_ids, response_mask)


@ADVANTAGE_ESTIMATORS.register("drgrpo")
@torch.no_grad()
def drgrpo_advantage(rewards, group_ids, response_mask, cfg, *, values=None, token_rewards=None) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean_g(r), no std division.

    Dividing by the group std up-weights near-solved and near-failed prompts; Dr. GRPO drops it.
    """
    _check_inputs(rewards, group_ids, response_mask, values, token_rewards)
    r = rewards.double()
    mean, _ = group_mean_std(r, group_ids)
    return _finish(r - mean, rewards, group_ids, response_mask)


@ADVANTAGE_ESTIMATORS.register("rloo")
@torch.no_grad()
def rloo_advantage(rewards, group_ids, response_mask, cfg, *, values=None, token_rewards=None) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024): A_i = r_i - (sum_g(r) - r_i) / (G - 1), the mean of the other G-1 samples.

    Equals G/(G-1) * (r_i - mean_g); the baseline excludes the sample itself, so the estimate is unbiased.
    A group of one sample gets A = 0.
    """
    _check_inputs(rewards, group_ids, response_mask, values, token_rewards)
    r = rewards.double()
    sums, counts = group_sum_count(r, group_ids)
    baseline = (sums - r) / (counts - 1).clamp(min=1)
    adv = torch.where(counts > 1, r - baseline, torch.zeros_like(r))
    return _finish(adv, rewards, group_ids, response_mask)


@ADVANTAGE_ESTIMATORS.register("reinforce_ppb")
@torch.no_grad()
def reinforce_pp_baseline_advantage(
    rewards, group_ids, response_mask, cfg, *, values=None, token_rewards=None
) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu et al. 2025): a_i = r_i - mean_g(r), then whitened over all response tokens of the
    global batch: A_{i,t} = (a_i - mu) / sqrt(sigma^2 + eps), mu and sigma^2 the masked mean and variance over every
    valid token (the epsilon inside the root, as the paper's whitening).

    Unlike a known bug of its namesake's port, the whitening divides by sigma (never multiplies) and runs once over the
    global batch, not per micro-batch.
    """
    _check_inputs(rewards, group_ids, response_mask, values, token_rewards)
    r = rewards.double()
    mean, _ = group_mean_std(r, group_ids)
    mask = response_mask.double()
    tok = (r - mean)[:, None] * mask
    n = mask.sum()
    if n == 0:
        return _finish(torch.zeros_like(r), rewards, group_ids, response_mask)
    return AdvantageOutput(whiten(tok, mask, cfg.adv_eps).to(torch.float32).detach())


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mu) / sqrt(sigma^2 + eps) * mask, mu and sigma^2 the masked mean and unbiased variance over every valid
    token of the batch (zeros where no token is valid)."""
    n = mask.sum()
    if n == 0:
        return torch.zeros_like(x)
    mu = (x * mask).sum() / n
    var = (((x - mu) * mask) ** 2).sum() / (n - 1).clamp(min=1)
    return ((x - mu) / (var + eps).sqrt()) * mask


def token_level_rewards(rewards: torch.Tensor, mask: torch.Tensor, token_rewards=None) -> torch.Tensor:
    """[B, T] float64: each completion's scalar reward on its last valid token, plus ``token_rewards`` (masked)."""
    r = torch.zeros_like(mask) if token_rewards is None else token_rewards.double() * mask
    valid = mask > 0
    last = torch.where(valid, torch.arange(mask.shape[1], device=mask.device), -1).max(-1).values
    rows = torch.nonzero(last >= 0).squeeze(-1)
    r[rows, last[rows]] += rewards.double()[rows]
    return r


def discounted(deltas: torch.Tensor, mask: torch.Tensor, discount: float) -> torch.Tensor:
    """y_t = delta_t + discount * y_{t'} over each row's valid tokens, t' the next valid token after t (masked tokens
    are skipped, not steps: an environment's tokens inside an episode neither earn nor discount); 0 where masked."""
    out = torch.zeros_like(deltas)
    carry = torch.zeros_like(deltas[:, 0])
    for t in reversed(range(deltas.shape[1])):
        m = mask[:, t] > 0
        y = deltas[:, t] + discount * carry
        out[:, t] = torch.where(m, y, torch.zeros_like(y))
        carry = torch.where(m, y, carry)
    return out


def next_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T]: V at each valid token's next valid token, 0 after a row's last one (the episode ends there)."""
    out = torch.zeros_like(values)
    carry = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        m = mask[:, t] > 0
        out[:, t] = carry
        carry = torch.where(m, values[:, t], carry)
    return out


@ADVANTAGE_ESTIMATORS.register("gae")
@torch.no_grad()
def gae_advantage(rewards, group_ids, response_mask, cfg, *, values=None, token_rewards=None) -> AdvantageOutput:
    """GAE (Schulman et al. 2016) over per-token rewards: r_t = token_rewards_t (+ the completion's reward on its last
    token), delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1} (V after the last token: 0).

    The policy's advantages use ``lam`` and are whitened over every valid token of the global batch; the critic's
    returns are A_t(critic_lam) + V_t, unwhitened: VAPO's decoupled GAE (Yue et al. 2025) when critic_lam differs
    (its 1.0 gives the critic the unbiased Monte-Carlo return). ``values`` None: a zero critic.
    """
    _check_inputs(rewards, group_ids, response_mask, values, token_rewards, group=False)
    mask = response_mask.double()
    v = torch.zeros_like(mask) if values is None else values.double() * mask
    r = token_level_rewards(rewards, mask, token_rewards)
    deltas = (r + cfg.gamma * next_values(v, mask) - v) * mask
    adv = discounted(deltas, mask, cfg.gamma * cfg.lam)
    critic_lam = cfg.lam if cfg.critic_lam is None else cfg.critic_lam
    critic_adv = adv if critic_lam == cfg.lam else discounted(deltas, mask, cfg.gamma * critic_lam)
    returns = (critic_adv + v) * mask
    return AdvantageOutput(
        whiten(adv, mask, cfg.adv_eps).to(torch.float32).detach(), returns.to(torch.float32).detach()
    )


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
@torch.no_grad()
def reinforce_pp_advantage(rewards, group_ids, response_mask, cfg, *, values=None, token_rewards=None):
    """REINFORCE++ (Hu et al. 2025) without a baseline: per-token discounted returns G_t = sum_{k>=t} gamma^(k-t) r_k
    of the per-token rewards (the completion's reward on its last token plus the KL penalty of ``init_kl_coef``),
    whitened over every valid token of the global batch."""
    _check_inputs(rewards, group_ids, response_mask, values, token_rewards, group=False)
    assert values is None, "reinforce_pp takes no critic"
    mask = response_mask.double()
    returns = discounted(token_level_rewards(rewards, mask, token_rewards), mask, cfg.gamma)
    return AdvantageOutput(whiten(returns, mask, cfg.adv_eps).to(torch.float32).detach())
