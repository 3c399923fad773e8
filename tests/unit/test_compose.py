"""Reward components combined and a model's scores normalised, by hand."""

import numpy as np
import pytest
import torch

from coati.distributed.driver.checkpoint import load_driver_state, save_driver_state
from coati.distributed.reward.compose import RunningNorm, combine, normalize, normalize_per_group


def test_components_combine_by_weight():
    values = {"math": np.array([1.0, 0.0, 1.0]), "rm": np.array([0.5, -2.0, 4.0])}
    assert combine(values, {"math": 1.0, "rm": 0.5}).tolist() == [1.25, -1.0, 3.0]
    assert combine(values, {"rm": 1.0}).tolist() == [0.5, -2.0, 4.0]  # a component left out does not count
    with pytest.raises(AssertionError, match="component values missing: \\['judge'\\]"):
        combine(values, {"judge": 1.0})


def test_group_normalisation_by_hand():
    out = normalize_per_group(np.array([1.0, 3.0, 5.0, 5.0]), np.array([0, 0, 1, 1]))
    assert out.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0], abs=1e-5)  # a group of equal scores: zeros


def test_running_normalisation_sees_every_score_and_resumes(tmp_path):
    norm = RunningNorm()
    first = norm(np.array([1.0, 3.0]))  # mean 2, std 1
    assert first.tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)
    second = norm(np.array([5.0]))  # over 1, 3, 5: mean 3, std sqrt(8/3)
    assert second.tolist() == pytest.approx([2 / np.sqrt(8 / 3)], abs=1e-5)
    # Through a checkpoint's driver state (as a producer saves it), the statistics continue where they were.
    save_driver_state(tmp_path, [], [{"torch_rng": torch.get_rng_state(), "rm_norm": norm.state()}])
    again = RunningNorm()
    again.restore(load_driver_state(tmp_path)["producers"][0]["rm_norm"])
    assert (again.count, again.mean, again.m2) == (norm.count, norm.mean, norm.m2)
    assert again(np.array([0.0, 7.0])).tolist() == norm(np.array([0.0, 7.0])).tolist()
    batched, one_by_one = RunningNorm(), RunningNorm()
    scores = np.random.default_rng(0).normal(3.0, 2.0, 50)
    batched.update(scores[:20]), batched.update(scores[20:])
    for x in scores:
        one_by_one.update(np.array([x]))
    assert (batched.mean, batched.std) == pytest.approx((scores.mean(), scores.std()), rel=1e-12)
    assert (one_by_one.mean, one_by_one.std) == pytest.approx((scores.mean(), scores.std()), rel=1e-12)
    with pytest.raises(ValueError, match="one of \\('none', 'group', 'running'\\), got 'zscore'"):
        normalize("zscore", np.zeros(2), np.zeros(2))


def test_an_unscored_completion_takes_its_group_s_mean_of_the_scored_ones():
    import numpy as np

    from coati.distributed.reward.compose import fill_unscored

    rewards = np.array([1.0, 0.0, np.nan, 1.0, np.nan, np.nan, np.nan, np.nan, 0.5, 0.5, 0.5, 0.5])
    unscored = np.isnan(rewards)
    filled = fill_unscored(rewards, unscored, 4)
    assert filled.tolist() == [1.0, 0.0, 2 / 3, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]
