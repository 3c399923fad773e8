"""A mixture-of-experts router's auxiliary losses and load statistics, from one layer's router logits and the
experts it sent each token to (real tokens only; padding is left out by the caller). Pure tensor functions; the
trainer collects the logits with ``model/routing.router_stats`` and adds the losses it is configured to weigh.

- load balancing (Switch Transformer, Fedus et al. 2021, for top-k as transformers' ``load_balancing_loss_func``
  counts it): ``E * sum_e f_e * P_e`` with ``f_e`` the share of the T tokens that chose expert e among their k and
  ``P_e`` its mean router probability; k when both are uniform (1 for Switch's top-1), so a coefficient means
  what it means to transformers and TRL.
- z-loss (ST-MoE, Zoph et al. 2022): ``mean_t logsumexp(logits_t)^2``, which keeps router logits small.
"""

from __future__ import annotations

import torch


def load_balancing_loss(logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """logits [T, E], experts [T, k] (the chosen indices) -> scalar ``E * sum_e f_e * P_e`` (module docstring)."""
    num_experts = logits.shape[-1]
    share = torch.bincount(experts.reshape(-1), minlength=num_experts).to(logits.dtype) / max(experts.shape[0], 1)
    probs = torch.softmax(logits.float(), dim=-1).mean(0)
    return num_experts * (share.float() * probs).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """logits [T, E] -> scalar ``mean_t logsumexp(logits_t)^2``."""
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def expert_load(experts: torch.Tensor, num_experts: int) -> float:
    """experts [T, k] -> the busiest expert's assignments over the mean per expert (1: perfectly even; E / k when
    every token goes to the same k experts)."""
    counts = torch.bincount(experts.reshape(-1), minlength=num_experts).double()
    return float(counts.max() / counts.mean().clamp(min=1e-12))


def router_entropy(logits: torch.Tensor) -> float:
    """logits [T, E] -> mean entropy of the router's distribution over experts, in nats (log E: uniform)."""
    logp = torch.log_softmax(logits.detach().float(), dim=-1)
    return float(-(logp.exp() * logp).sum(-1).mean())
