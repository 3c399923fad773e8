"""Per-token estimators of KL(pi_theta || pi_ref) from log-probs of the sampled tokens (Schulman, "Approximating KL
divergence", 2020). With log-ratio x = log pi_ref(a) - log pi_theta(a), sampled from pi_theta:

- k1 = -x                    unbiased, high variance, can be negative
- k2 = x^2 / 2               biased, low variance; its gradient is the gradient of the reverse KL
- k3 = exp(x) - x - 1        unbiased, always >= 0 (GRPO's choice); x is clamped to [-KL_LOG_RATIO_BOUND, +bound]
                             first, so a token the policy has left far behind gives a large finite value, not inf
"""

from __future__ import annotations

import torch

from coati.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")
KL_LOG_RATIO_BOUND = 20.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log pi(a) - log pi_ref(a)."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = (log pi(a) - log pi_ref(a))^2 / 2."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(x) - x - 1 with x = log pi_ref(a) - log pi(a), clamped to [-20, 20]."""
    x = (ref_logprobs - logprobs).clamp(-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND)
    return torch.expm1(x) - x
