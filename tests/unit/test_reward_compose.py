"""Reward components combined and a model's scores normalised, by hand."""

import numpy as np
import pytest

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


def test_running_normalisation_sees_every_score_and_resumes():
    norm = RunningNorm()
    first = norm(np.array([1.0, 3.0]))  # mean 2, std 1
    assert first.tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)
    second = norm(np.array([5.0]))  # over 1, 3, 5: mean 3, std sqrt(8/3)
    assert second.tolist() == pytest.approx([2 / np.sqrt(8 / 3)], abs=1e-5)
    again = RunningNorm()
    again.restore(norm.state())
    assert again(np.array([0.0])).tolist() == pytest.approx(norm(np.array([0.0])).tolist())
    with pytest.raises(ValueError, match="one of \\('none', 'group', 'running'\\), got 'zscore'"):
        normalize("zscore", np.zeros(2), np.zeros(2))
