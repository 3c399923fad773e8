"""Per-group statistics over a flat batch laid out as groups of completions of the same prompt.

Groups are given by an id per sample (any integers, any order), so the estimators do not assume that the G
completions of a prompt are contiguous.
"""

from __future__ import annotations

import torch


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids [B] to dense indices 0..K-1; returns (index [B], K)."""
    assert group_ids.dim() == 1, f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}"
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(uniq.numel())


def group_sum_count(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample sum and size of the sample's group: two tensors [B]."""
    idx, k = group_index(group_ids)
    sums = torch.zeros(k, dtype=values.dtype, device=values.device).index_add_(0, idx, values)
    counts = torch.zeros(k, dtype=values.dtype, device=values.device).index_add_(0, idx, torch.ones_like(values))
    return sums[idx], counts[idx]


def group_mean_std(values: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample group mean and sample standard deviation (Bessel-corrected, as torch.std): two tensors [B].

    A group of one sample has std 0 (not NaN): it carries no signal (``degenerate_groups`` flags it).
    """
    sums, counts = group_sum_count(values, group_ids)
    mean = sums / counts
    sq, _ = group_sum_count((values - mean) ** 2, group_ids)
    var = torch.where(counts > 1, sq / (counts - 1).clamp(min=1), torch.zeros_like(sq))
    return mean, var.sqrt()


def degenerate_groups(rewards: torch.Tensor, group_ids: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """Bool [B]: True where every completion of the sample's group got the same reward (no learning signal).

    DAPO's dynamic sampling drops these groups and draws more prompts instead.
    """
    _, std = group_mean_std(rewards.double(), group_ids)
    return std <= tol


def without_unscored(group_ids: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """Group ids [B] with each unscored sample (``scored`` False: its reward function gave no score) moved to a group
    of its own, so its group's statistics are those of its scored samples alone (and a group of one carries no
    signal: its advantage is 0)."""
    assert scored.shape == group_ids.shape, (scored.shape, group_ids.shape)
    lone = group_ids.max() + 1 + torch.arange(len(group_ids), dtype=group_ids.dtype) if len(group_ids) else group_ids
    return torch.where(scored.bool(), group_ids, lone)
