"""The gradient of one optimizer step does not depend on how its batch is split (whole, micro-batches, DP shards)."""

import itertools

import pytest
import torch

from coati.distributed.algo import (
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    LossInput,
    LossNorm,
    aggregate_loss,
    compute_policy_loss,
)
from coati.distributed.algo.config import AlgorithmConfig

B, T, MAX_LEN = 8, 6, 6


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 3, 0, 5, 2, 6, 4])  # one fully masked sequence (e.g. truncated under DAPO)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    shift = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T) * mask
    ref = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.1
    rollout = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.05
    return old, shift, adv, mask, ref, rollout


def grad_of(cfg, splits, dp_size=1, seed=0):
    """Gradient w.r.t. a per-token parameter, accumulating over ``splits`` (lists of row indices)."""
    old, shift, adv, mask, ref, rollout = batch(seed)
    theta = shift.clone().requires_grad_(True)
    norm = LossNorm.from_mask(mask, MAX_LEN, dp_size=dp_size)
    grads = []
    for rank_splits in splits:  # one list of micro-batches per DP rank
        theta.grad = None
        for rows in rank_splits:
            rows = torch.tensor(rows)
            inp = LossInput(
                logprobs=old[rows] + theta[rows],
                old_logprobs=old[rows],
                advantages=adv[rows],
                mask=mask[rows],
                ref_logprobs=ref[rows],
                rollout_logprobs=rollout[rows],
            )
            loss, _ = compute_policy_loss(inp, cfg, norm)
            loss.backward()
        grads.append(theta.grad.clone())
    return torch.stack(grads).mean(0)  # DP averages gradients across ranks


CONFIGS = [
    AlgorithmConfig(policy_loss=loss, loss_agg_mode=agg, beta=0.1, tis_cap=2.0, dual_clip_c=3.0)
    for loss, agg in itertools.product(POLICY_LOSSES.names(), LOSS_AGGREGATIONS.names())
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.policy_loss}-{c.loss_agg_mode}")
def test_gradient_invariant_to_micro_batches_and_dp_shards(cfg):
    whole = grad_of(cfg, [[list(range(B))]])
    micro = grad_of(cfg, [[[0, 1], [2, 3], [4, 5], [6, 7]]])
    dp = grad_of(cfg, [[[0, 1, 2, 3]], [[4, 5], [6, 7]]], dp_size=2)
    assert whole.abs().sum() > 0
    torch.testing.assert_close(micro, whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dp, whole, rtol=1e-10, atol=1e-12)


def test_masked_sequence_does_not_dilute_seq_mean():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    loss = torch.tensor([[2.0, 4.0], [100.0, 100.0]])
    norm = LossNorm.from_mask(mask, max_response_len=2)
    assert norm.num_seqs == 1 and norm.num_tokens == 2
    assert aggregate_loss(loss, mask, "seq-mean-token-mean", norm).item() == pytest.approx(3.0)
    assert aggregate_loss(loss, mask, "token-mean", norm).item() == pytest.approx(3.0)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm).item() == pytest.approx(3.0)


def test_aggregations_hand_computed():
    # seq 0: losses [1, 3] (2 tokens); seq 1: [5, -] (1 token); L = 4
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    norm = LossNorm.from_mask(mask, max_response_len=4)
    assert aggregate_loss(loss, mask, "token-mean", norm).item() == pytest.approx(9 / 3)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean", norm).item() == pytest.approx((2 + 5) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm).item() == pytest.approx(9 / (2 * 4))
