"""Policy losses: one input record in, token-level loss and namespaced metrics out.

``fn(inp: LossInput, cfg) -> (token_loss [B, T], metrics)``; the loss is to be minimised, padding positions are
ignored by the aggregation that follows. Ratios are taken against ``old_logprobs`` (the policy that the step's
batch is trained from), clip ranges are asymmetric: [1 - clip_eps_low, 1 + clip_eps_high]. Every log-ratio is clamped
to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before it is exponentiated: a ratio of e^100 on a negative advantage would make
the loss inf (NaN under dual clip); at the bound the ratio is e^20 ~ 4.9e8, finite in float32, and a token beyond it
gets no gradient through its ratio.
"""

from __future__ import annotations

import torch

from coati.registry import Registry

POLICY_LOSSES: Registry = Registry("policy loss")
LOG_RATIO_BOUND = 20.0


def clamped_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """log pi_theta - log pi_old, clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND]."""
    return (logprobs - old_logprobs).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(inp, cfg):
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher (DAPO) and optional dual clip (Ye et al. 2020):
    l = max(-A r, -A clip(r, 1-eps_low, 1+eps_high)), r = exp(logp - logp_old); when A < 0 and dual_clip_c is set,
    l = min(l, -A c), bounding the loss of a very large ratio on a negative advantage.
    """
    log_ratio = clamped_log_ratio(inp.logprobs, inp.old_logprobs)
    ratio = torch.exp(log_ratio)
    adv = inp.advantages
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    loss = torch.maximum(unclipped, clipped)
    mask = inp.mask
    metrics = {"loss/clipfrac": _masked_mean((clipped > unclipped).float(), mask)}
    if cfg.dual_clip_c is not None:
        dual = -adv * cfg.dual_clip_c
        use_dual = (adv < 0) & (loss > dual)
        loss = torch.where(adv < 0, torch.minimum(loss, dual), loss)
        metrics["loss/dual_clipfrac"] = _masked_mean(use_dual.float(), mask)
    metrics.update(_ratio_metrics(ratio, log_ratio, mask))
    return loss, metrics


@POLICY_LOSSES.register("gspo")
def gspo_loss(inp, cfg):
    """GSPO (Zheng et al. 2025): one importance ratio per sequence, s_i = exp(mean_t(logp - logp_old)) over its valid
    tokens, clipped to [1-eps_low, 1+eps_high]: l_i = max(-A_i s_i, -A_i clip(s_i)). Written per token as
    s_{i,t} = sg(s_i) * exp(logp_t - sg(logp_t)), whose value is s_i and whose gradient is s_i * grad(mean_t logp_t)
    after seq-mean-token-mean aggregation.
    """
    mask = inp.mask
    log_ratio = clamped_log_ratio(inp.logprobs, inp.old_logprobs)
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    seq_ratio = torch.exp(seq_log_ratio.detach())[:, None]
    token_ratio = seq_ratio * torch.exp(inp.logprobs - inp.logprobs.detach())
    adv = inp.advantages
    unclipped = -adv * token_ratio
    clipped = -adv * torch.clamp(token_ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {"loss/clipfrac": _masked_mean((clipped > unclipped).float(), mask)}
    metrics.update(_ratio_metrics(token_ratio.detach(), log_ratio, mask))
    return loss, metrics


@POLICY_LOSSES.register("cispo")
def cispo_loss(inp, cfg):
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight, so no token's gradient is
    ever dropped: l = -sg(clip(r, 1-eps_low, 1+eps_high)) * A * logp. Unlike PPO-clip, clipped tokens still learn.
    """
    log_ratio = clamped_log_ratio(inp.logprobs, inp.old_logprobs)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high).detach()
    loss = -weight * inp.advantages * inp.logprobs
    mask = inp.mask
    metrics = {"loss/clipfrac": _masked_mean((weight != ratio.detach()).float(), mask)}
    metrics.update(_ratio_metrics(ratio, log_ratio, mask))
    return loss, metrics


def _ratio_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    r = ratio.detach()
    valid = mask > 0
    big = torch.finfo(r.dtype).max
    has = bool(valid.any())
    lr = log_ratio.detach()
    return {
        "loss/ratio_mean": _masked_mean(r, mask),
        "loss/ratio_max": torch.where(valid, r, torch.full_like(r, -big)).max() if has else r.new_tensor(1.0),
        "loss/ratio_min": torch.where(valid, r, torch.full_like(r, big)).min() if has else r.new_tensor(1.0),
        # k3 estimate of KL(pi_old || pi_theta) on the sampled tokens (the log-ratio already clamped).
        "loss/approx_kl": _masked_mean(torch.expm1(lr) - lr, mask),
    }
