"""Loss aggregation: token losses of one micro-batch -> the scalar whose gradients, summed over every micro-batch and
averaged over DP ranks (as data parallelism does), give the gradient of the loss over the whole optimizer-step batch.

The denominators come from ``LossNorm``, counted once over the global batch of the step, so the gradient is the same
whether that batch is processed whole, in micro-batches, or across DP ranks. Sequences with no valid token (for
example truncated responses that DAPO masks) count in no denominator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from coati.registry import Registry

LOSS_AGGREGATIONS: Registry = Registry("loss aggregation")


@dataclass(frozen=True)
class LossNorm:
    """Denominators of one optimizer step, over all its micro-batches and all DP ranks."""

    num_tokens: float
    """valid (loss-mask) tokens in the global step batch"""
    num_seqs: float
    """sequences with at least one valid token in the global step batch"""
    max_response_len: int
    """the generation budget L (max_new_tokens), the constant of seq-mean-token-sum-norm"""
    dp_size: int = 1
    """data-parallel ranks whose gradients are averaged; the loss is scaled by it so the average becomes a sum"""

    @classmethod
    def from_mask(cls, mask: torch.Tensor, max_response_len: int, dp_size: int = 1) -> LossNorm:
        """Count the denominators from the loss mask [B, T] of the whole global step batch."""
        m = mask.to(torch.float64)
        return cls(float(m.sum()), float((m.sum(-1) > 0).sum()), int(max_response_len), int(dp_size))


def _safe(x: float) -> float:
    return max(x, 1.0)


@LOSS_AGGREGATIONS.register("token-mean")
def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """sum_{i,t} l_{i,t} / N_tokens: every token weighs the same (DAPO)."""
    return (token_loss * mask).sum() * norm.dp_size / _safe(norm.num_tokens)


@LOSS_AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """sum_i (sum_t l_{i,t} / |o_i|) / N_seqs: every sequence weighs the same (GRPO paper, GSPO)."""
    per_seq_tokens = mask.sum(-1)
    per_seq = (token_loss * mask).sum(-1) / per_seq_tokens.clamp(min=1)
    return per_seq.sum() * norm.dp_size / _safe(norm.num_seqs)


@LOSS_AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(token_loss: torch.Tensor, mask: torch.Tensor, norm: LossNorm) -> torch.Tensor:
    """sum_{i,t} l_{i,t} / (N_seqs * L): a constant denominator, free of length bias (Dr. GRPO)."""
    return (token_loss * mask).sum() * norm.dp_size / (_safe(norm.num_seqs) * norm.max_response_len)


def aggregate_loss(token_loss: torch.Tensor, mask: torch.Tensor, mode: str, norm: LossNorm) -> torch.Tensor:
    """Apply the aggregation registered as ``mode``."""
    return LOSS_AGGREGATIONS.get(mode)(token_loss, mask.to(token_loss.dtype), norm)
