"""The consumer's loss for one micro-batch: policy loss (x off-policy correction weight) (+ beta * KL), aggregated.

All inputs are per sampled token, [B, T] over the response positions; ``mask`` is the loss mask the inference backend
returned (response tokens up to and including EOS), possibly zeroed further by DAPO's truncation masking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coati.distributed.algo.aggregation import LossNorm, aggregate_loss
from coati.distributed.algo.correction import OFF_POLICY_CORRECTIONS
from coati.distributed.algo.kl import KL_ESTIMATORS
from coati.distributed.algo.policy_loss import POLICY_LOSSES, _masked_mean


@dataclass
class LossInput:
    logprobs: torch.Tensor
    """[B, T] log pi_theta of the sampled tokens, with gradient"""
    old_logprobs: torch.Tensor
    """[B, T] log-probs under the policy the step starts from (the PPO 'old' policy), no gradient"""
    advantages: torch.Tensor
    """[B, T] from an advantage estimator, no gradient"""
    mask: torch.Tensor
    """[B, T] 1.0 on tokens that count, 0.0 on padding and masked tokens"""
    ref_logprobs: torch.Tensor | None = None
    """[B, T] log-probs under the frozen reference policy; required when beta > 0"""
    rollout_logprobs: torch.Tensor | None = None
    """[B, T] log-probs reported by the inference engine at sampling time (the behaviour policy); None when the
    engine's are not valid for the sampling settings. Used by the off-policy correction and the gap metric"""

    def __post_init__(self):
        shape = self.logprobs.shape
        for name in ("old_logprobs", "advantages", "mask", "ref_logprobs", "rollout_logprobs"):
            value = getattr(self, name)
            assert value is None or value.shape == shape, f"{name} has shape {tuple(value.shape)}, expected {shape}"


def compute_policy_loss(inp: LossInput, cfg, norm: LossNorm) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Return (scalar loss to backpropagate for this micro-batch, metrics as detached scalars).

    ``cfg`` is an ``AlgorithmConfig``. When the batch carries the engine's log-probs, each token's loss is weighted by
    the off-policy correction ``cfg.off_policy_correction`` (``correction.py``) of pi_prox (``old_logprobs``) against
    the behaviour policy (``rollout_logprobs``).
    """
    mask = inp.mask.to(inp.logprobs.dtype)
    token_loss, metrics = POLICY_LOSSES.get(cfg.policy_loss)(inp, cfg)
    if inp.rollout_logprobs is not None:
        gap = (inp.old_logprobs - inp.rollout_logprobs).detach()
        metrics["rollout/logprob_gap_abs"] = _masked_mean(gap.abs(), mask)
        weight, correction = OFF_POLICY_CORRECTIONS.get(cfg.off_policy_correction)(
            inp.old_logprobs, inp.rollout_logprobs, mask, cfg
        )
        metrics.update(correction)
        token_loss = token_loss * weight
    if cfg.beta > 0:
        if inp.ref_logprobs is None:
            raise ValueError(f"beta={cfg.beta} > 0 needs ref_logprobs from a reference model")
        kl = KL_ESTIMATORS.get(cfg.kl_estimator)(inp.logprobs, inp.ref_logprobs)
        metrics["loss/kl"] = _masked_mean(kl.detach(), mask)
        token_loss = token_loss + cfg.beta * kl
    loss = aggregate_loss(token_loss, mask, cfg.loss_agg_mode, norm)
    metrics["loss/policy"] = loss.detach()
    return loss, {k: v.detach() for k, v in metrics.items()}
