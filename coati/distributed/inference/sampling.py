"""Token sampling for the vLLM engine on a CPU: inverse-CDF sampling, used in place of vLLM's Gumbel-max kernel for
plain temperature sampling (no top-k, no top-p, no per-request seed).

vLLM's CPU sampler draws one Gumbel noise value per vocabulary entry per row (``fused_gumbel_argmax``), where this
draws one uniform number per row (``benchmarks/bench_rollout.py`` compares the two in one engine).
The engine computes the processed log-probs of every row anyway (``logprobs_mode="processed_logprobs"``), so one
uniform number per row and a cumulative sum of their exponentials draw the same distribution: token i is drawn with
probability ``exp(logprob_i)``, exactly as the Gumbel-max trick draws it.
"""

from __future__ import annotations

import torch


def inverse_cdf_sample(logprobs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Draw one token per row: the first i with ``sum_{j<=i} p_j > u * sum_j p_j``, ``p = exp(logprobs)``.

    logprobs: [B, V] float32 log-probabilities (-inf for excluded tokens); uniform: [B] in [0, 1). Returns [B] int64.
    A token of probability 0 is never drawn: its cumulative sum equals its predecessor's, which the draw passed
    first. Scaling ``u`` by the row's total makes the float32 sum's rounding (its total is 1 within ~1e-6) harmless.
    """
    cdf = logprobs.exp().cumsum_(-1)
    target = uniform.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)


def inverse_cdf_forward(sampler, own):
    """A ``forward`` for vLLM's ``TopKTopPSampler`` ``sampler`` (run in the processed-log-probs mode coati runs it in)
    that draws plain-temperature rows with ``inverse_cdf_sample``; anything else (top-k, top-p, seeded requests, fp64
    Gumbel noise) goes to ``own``, the sampler's own forward."""
    if sampler.logprobs_mode != "processed_logprobs":
        raise ValueError(
            f"the inverse-CDF sampler needs logprobs_mode='processed_logprobs', got {sampler.logprobs_mode!r}"
        )

    def forward(logits, generators, k, p):
        if k is not None or p is not None or generators or sampler.use_fp64_gumbel:
            return own(logits, generators, k, p)
        logprobs = logits.log_softmax(dim=-1, dtype=torch.float32)
        return inverse_cdf_sample(logprobs, torch.rand(logprobs.shape[0], device=logprobs.device)), logprobs

    return forward
