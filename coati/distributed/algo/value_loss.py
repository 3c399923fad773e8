"""The critic's loss: regression of V(s_t) onto the estimator's returns, clipped as PPO clips the policy.

``value_loss(values, old_values, returns, mask, clip) -> (token_loss [B, T], metrics)``; aggregated like the policy's
loss (``aggregation``), over the valid tokens of the step's global minibatch. ``old_values`` are the critic's values
when the rollout was scored (those GAE used); with ``clip`` a new value may move at most ``clip`` from them:
l_t = 1/2 max((V_t - R_t)^2, (V_old + clip(V_t - V_old, -c, c) - R_t)^2). ``explained_variance`` says how much of
the returns' variance the values account for: 1 - Var[R - V] / Var[R] (1 perfect, 0 a constant, < 0 worse).
"""

from __future__ import annotations

import torch

from coati.distributed.algo.policy_loss import _masked_mean


def value_loss(values, old_values, returns, mask, clip: float | None):
    """Token losses [B, T] and namespaced metrics (``critic/``) of one micro-batch."""
    unclipped = (values - returns) ** 2
    metrics = {}
    if clip is None:
        loss = 0.5 * unclipped
        metrics["critic/clipfrac"] = torch.zeros((), dtype=values.dtype)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (clipped_values - returns) ** 2
        loss = 0.5 * torch.maximum(unclipped, clipped)
        metrics["critic/clipfrac"] = _masked_mean((clipped > unclipped).float(), mask)
    metrics["critic/value_mean"] = _masked_mean(values.detach(), mask)
    return loss, {k: v.detach() for k, v in metrics.items()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[R - V] / Var[R] over the valid tokens (nan where the returns do not vary)."""
    m = mask.double() > 0
    r, v = returns.double()[m], values.double()[m]
    if r.numel() < 2:
        return float("nan")
    var = r.var()
    return float(1.0 - (r - v).var() / var) if var > 0 else float("nan")
