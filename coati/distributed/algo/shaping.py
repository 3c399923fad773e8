"""DAPO's reward shaping and sample filters (Yu et al. 2025), as pure functions over a batch.

- soft overlong punishment: a length penalty that ramps from 0 to -1 over the last ``buffer`` tokens of the budget
- truncation masking: responses that hit the budget contribute no loss
- the group filter lives in ``grouping.degenerate_groups``
"""

from __future__ import annotations

import torch


def overlong_penalty(
    response_lengths: torch.Tensor, max_response_len: int, buffer_len: int, factor: float = 1.0
) -> torch.Tensor:
    """Penalty [B] added to the reward, for |y| tokens, budget L, buffer C:
    0 if |y| <= L - C;  factor * (L - C - |y|) / C if L - C < |y| <= L;  -factor if |y| > L.
    """
    if buffer_len <= 0:
        return torch.zeros_like(response_lengths, dtype=torch.float32)
    if buffer_len > max_response_len:
        raise ValueError(f"overlong buffer_len={buffer_len} exceeds max_response_len={max_response_len}")
    length = response_lengths.to(torch.float32)
    start = max_response_len - buffer_len
    ramp = (start - length) / buffer_len
    out = torch.where(length <= start, torch.zeros_like(length), ramp)
    return factor * out.clamp(min=-1.0)


def mask_truncated(loss_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Zero the loss mask [B, T] of responses flagged truncated [B] (DAPO's overlong filtering)."""
    return loss_mask * (~truncated.bool()).to(loss_mask.dtype)[:, None]
