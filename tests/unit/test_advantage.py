"""Advantage estimators on a hand-computed two-group example.

Group 0 rewards [2, 0, 1]: mean 1, sample std sqrt((1 + 1 + 0) / 2) = 1.
Group 1 rewards [1, 1, 1]: all equal, no signal.
Response lengths [2, 1, 3, 1, 2, 1] tokens (T = 3).
"""

import math

import pytest
import torch

from coati.distributed.algo import ADVANTAGE_ESTIMATORS, ALGO_MAP
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.grouping import degenerate_groups

REWARDS = torch.tensor([2.0, 0.0, 1.0, 1.0, 1.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])
LENGTHS = [2, 1, 3, 1, 2, 1]
MASK = torch.tensor([[1.0 if t < n else 0.0 for t in range(3)] for n in LENGTHS])
CFG = AlgorithmConfig()


def per_seq(adv):
    """The advantage of each sequence (all valid tokens share it for sequence-level estimators)."""
    out = []
    for row, n in zip(adv, LENGTHS, strict=True):
        assert torch.allclose(row[:n], row[0].expand(n)), row
        assert torch.all(row[n:] == 0), row
        out.append(row[0].item())
    return out


def test_grpo_hand_computed():
    out = ADVANTAGE_ESTIMATORS["grpo"](REWARDS, GROUPS, MASK, CFG)
    eps = CFG.adv_eps
    assert per_seq(out.advantages) == pytest.approx([1 / (1 + eps), -1 / (1 + eps), 0, 0, 0, 0], abs=1e-7)
    assert degenerate_groups(REWARDS, GROUPS).tolist() == [False, False, False, True, True, True]


def test_drgrpo_hand_computed():
    out = ADVANTAGE_ESTIMATORS["drgrpo"](REWARDS, GROUPS, MASK, CFG)
    assert per_seq(out.advantages) == pytest.approx([1, -1, 0, 0, 0, 0], abs=1e-7)


def test_rloo_hand_computed():
    # 2 - mean(0, 1) = 1.5; 0 - mean(2, 1) = -1.5; 1 - mean(2, 0) = 0
    out = ADVANTAGE_ESTIMATORS["rloo"](REWARDS, GROUPS, MASK, CFG)
    assert per_seq(out.advantages) == pytest.approx([1.5, -1.5, 0, 0, 0, 0], abs=1e-7)


def test_reinforce_ppb_hand_computed():
    # Centred rewards [1, -1, 0, 0, 0, 0] spread over 10 valid tokens: sum 2*1 - 1 = 1, mu = 0.1.
    # Squared deviations: 2 * 0.81 + 1.21 + 7 * 0.01 = 2.9; var = 2.9 / 9; sigma = 0.5676462.
    sigma = math.sqrt(2.9 / 9)
    out = ADVANTAGE_ESTIMATORS["reinforce_ppb"](REWARDS, GROUPS, MASK, CFG)
    expected = [0.9 / sigma, -1.1 / sigma, -0.1 / sigma, -0.1 / sigma, -0.1 / sigma, -0.1 / sigma]
    assert per_seq(out.advantages) == pytest.approx(expected, rel=1e-5)
    assert per_seq(out.advantages)[0] == pytest.approx(1.585494, rel=1e-5)
    # Whitened: zero mean, unit std over the valid tokens (divided by sigma, never multiplied).
    valid = out.advantages[MASK > 0]
    assert valid.mean().item() == pytest.approx(0, abs=1e-6)
    assert valid.std().item() == pytest.approx(1, rel=1e-5)


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_advantages_are_detached_and_masked(name):
    rewards = REWARDS.clone().requires_grad_(True)
    out = ADVANTAGE_ESTIMATORS[name](rewards, GROUPS, MASK, CFG)
    assert not out.advantages.requires_grad
    assert torch.all(out.advantages[MASK == 0] == 0)
    assert out.advantages.dtype == torch.float32


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo"])
def test_equal_reward_groups_give_zero_advantage_and_are_flagged(name):
    rewards = torch.tensor([0.5, 0.5, 0.5, 0.0, 0.0])
    groups = torch.tensor([7, 7, 7, 3, 3])
    mask = torch.ones(5, 2)
    out = ADVANTAGE_ESTIMATORS[name](rewards, groups, mask, CFG)
    assert torch.all(out.advantages == 0)
    assert degenerate_groups(rewards, groups).all()


def test_group_layout_need_not_be_contiguous():
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    base = ADVANTAGE_ESTIMATORS["grpo"](REWARDS, GROUPS, MASK, CFG).advantages
    shuffled = ADVANTAGE_ESTIMATORS["grpo"](REWARDS[order], GROUPS[order], MASK[order], CFG).advantages
    assert torch.allclose(shuffled, base[order])


def test_every_preset_names_registered_pieces():
    for name, preset in ALGO_MAP.items():
        assert preset.advantage_estimator in ADVANTAGE_ESTIMATORS, name


def test_reinforce_ppb_epsilon_sits_inside_the_root():
    """(a - mu) / sqrt(var + eps), as the paper whitens; with eps = 0.25 that differs from / (sigma + eps)."""
    cfg = AlgorithmConfig(adv_eps=0.25)
    out = ADVANTAGE_ESTIMATORS["reinforce_ppb"](REWARDS, GROUPS, MASK, cfg)
    root = math.sqrt(2.9 / 9 + 0.25)
    assert per_seq(out.advantages) == pytest.approx([0.9 / root, -1.1 / root] + [-0.1 / root] * 4, rel=1e-6)


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_ppb"])
def test_a_completion_without_a_score_is_left_out_of_its_groups_statistics(name):
    """A reward function's None: the other completions' advantages are those of their group without it (the
    producer fills its reward with the group's mean, which would still shrink the group's std and widen RLOO's
    baseline), and its own is 0."""
    import numpy as np

    from coati.distributed.record import RewardStatus, RolloutBatch
    from coati.distributed.trainer.step import batch_advantages

    lengths = np.array([2, 1, 3, 1, 2, 1, 2, 2])
    mask = np.arange(3)[None, :] < lengths[:, None]
    rewards = np.array([2.0, 0.0, 1.0, 1.0, 0.0, 3.0, 1.0, 5.0], dtype=np.float32)  # row 2's 1.0: its group's mean
    unscored = np.array([False, False, True, False, False, False, False, False])
    batch = RolloutBatch(
        np.zeros((8, 1), dtype=np.int64),
        np.ones((8, 1), dtype=bool),
        np.zeros((8, 3), np.int64),
        mask,
        np.zeros((8, 3), np.float32),
        lengths,
        np.zeros(8, dtype=bool),
        group_ids=np.repeat([0, 1], 4),
        rewards=rewards,
        reward_status=np.where(unscored, RewardStatus.NO_SCORE, RewardStatus.SCORED).astype(np.int8),
        loss_mask=mask & ~unscored[:, None],
    )
    loss_mask = torch.tensor(batch.trained_mask(), dtype=torch.float32)
    adv = batch_advantages(batch, loss_mask, CFG.__class__(advantage_estimator=name))
    keep = torch.tensor(~unscored)
    alone = ADVANTAGE_ESTIMATORS.get(name)(
        torch.tensor(rewards)[keep],
        torch.tensor([0, 0, 0, 1, 1, 1, 1]),
        loss_mask[keep],
        CFG.__class__(advantage_estimator=name),
    ).advantages
    assert torch.allclose(adv[keep], alone, atol=1e-6), (adv, alone)
    assert torch.all(adv[2] == 0)
