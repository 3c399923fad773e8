"""Off-policy corrections: per-token weights that account for rows sampled by a policy other than the one the step
trains from.

Three policies meet in a step (the decoupled objective, Hilton et al. 2021, "Batch size-invariance for policy
optimization"; as AReaL uses it for asynchronous RL):
- the behaviour policy mu, which sampled the row: the inference engine's log-probs (``rollout_logprobs``), possibly
  several weight versions old, and computed by a different engine in a different precision;
- the proximal policy pi_prox: the trainer's log-probs of the weights the step starts from (``old_logprobs``);
- pi_theta, being trained. The policy loss clips the ratio pi_theta / pi_prox, never against mu, so a stale row does
  not make the clip range meaningless; the correction below reweights each token's loss by rho = pi_prox / mu.

``fn(old_logprobs, rollout_logprobs, mask, cfg) -> (weight [B, T], metrics)``; the weight has no gradient. All
log-ratios are clamped to +-20 before they are exponentiated.
"""

from __future__ import annotations

import torch

from coati.distributed.algo.policy_loss import _masked_mean, clamped_log_ratio
from coati.registry import Registry

OFF_POLICY_CORRECTIONS: Registry = Registry("off-policy correction")


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    valid = mask > 0
    return torch.where(valid, x, torch.full_like(x, -torch.inf)).max() if bool(valid.any()) else x.new_tensor(1.0)


def log_rho(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor) -> torch.Tensor:
    """log(pi_prox / mu) per token, clamped as every log-ratio is (``policy_loss.clamped_log_ratio``)."""
    return clamped_log_ratio(old_logprobs, rollout_logprobs).detach()


def _metrics(rho: torch.Tensor, weight: torch.Tensor, changed: torch.Tensor, mask: torch.Tensor) -> dict:
    return {
        "loss/is_weight_mean": _masked_mean(weight, mask),
        "loss/is_weight_max": _masked_max(weight, mask),
        "loss/is_ratio_max": _masked_max(rho, mask),
        "loss/is_corrected_frac": _masked_mean(changed.to(mask.dtype), mask),
    }


@OFF_POLICY_CORRECTIONS.register("none")
def no_correction(old_logprobs, rollout_logprobs, mask, cfg):
    """w = 1: every token counts as if sampled by the proximal policy (the metrics still report rho = pi_prox / mu)."""
    rho = torch.exp(log_rho(old_logprobs, rollout_logprobs))
    weight = torch.ones_like(rho)
    return weight, _metrics(rho, weight, torch.zeros_like(mask, dtype=torch.bool), mask)


@OFF_POLICY_CORRECTIONS.register("tis")
def truncated_importance_sampling(old_logprobs, rollout_logprobs, mask, cfg):
    """Truncated importance sampling (Ionides 2008; for the engine/trainer mismatch, Yao et al. 2025):
    w_t = min(rho_t, tis_cap) with rho_t = pi_prox(a_t) / mu(a_t). Unbiased up to the truncation, which bounds the
    variance; tokens the engine over-sampled (rho < 1) are down-weighted, never dropped."""
    rho = torch.exp(log_rho(old_logprobs, rollout_logprobs))
    weight = rho.clamp(max=cfg.tis_cap)
    return weight, _metrics(rho, weight, rho > cfg.tis_cap, mask)


@OFF_POLICY_CORRECTIONS.register("icepop")
def icepop_token_masking(old_logprobs, rollout_logprobs, mask, cfg):
    """Token-level double-sided masking (IcePop, Ling team 2025): w_t = rho_t when is_mask_low <= rho_t <=
    is_mask_high, else 0: a token whose probability the two policies disagree on too much gives no gradient at all."""
    rho = torch.exp(log_rho(old_logprobs, rollout_logprobs))
    keep = (rho >= cfg.is_mask_low) & (rho <= cfg.is_mask_high)
    weight = torch.where(keep, rho, torch.zeros_like(rho))
    return weight, _metrics(rho, weight, ~keep, mask)


@OFF_POLICY_CORRECTIONS.register("seq_mask")
def sequence_masking(old_logprobs, rollout_logprobs, mask, cfg):
    """Sequence-level masked importance sampling (MIS-style, Liu et al. 2025): a whole response is dropped (w = 0 on
    all its tokens) when its geometric-mean ratio g_i = exp(mean_t log rho_{i,t}) leaves [is_mask_low,
    is_mask_high]; kept responses get w_t = min(rho_t, tis_cap). Unlike per-token masking, a response is trained on
    all of its tokens or none."""
    lr = log_rho(old_logprobs, rollout_logprobs)
    rho = torch.exp(lr)
    g = torch.exp((lr * mask).sum(-1) / mask.sum(-1).clamp(min=1))[:, None]
    keep = ((g >= cfg.is_mask_low) & (g <= cfg.is_mask_high)).expand_as(rho)
    weight = torch.where(keep, rho.clamp(max=cfg.tis_cap), torch.zeros_like(rho))
    return weight, _metrics(rho, weight, ~keep | (rho > cfg.tis_cap), mask)
