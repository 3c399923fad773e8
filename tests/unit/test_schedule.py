"""Learning-rate schedules, by hand."""

import math

import pytest

from coati.distributed.trainer.schedule import lr_factor


def test_warmup_rises_to_the_full_rate_at_its_last_step_and_never_starts_at_zero():
    assert [lr_factor(s, 10, "constant", warmup=4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_and_cosine_decay_to_the_floor_over_the_steps_after_warmup():
    # total 6, warmup 2: p = (step - 2) / 4 for steps 2..5
    assert [lr_factor(s, 6, "linear", warmup=2) for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert lr_factor(5, 6, "linear", warmup=2, min_ratio=0.2) == pytest.approx(1 - 0.8 * 0.75)
    cos = [lr_factor(s, 5, "cosine", min_ratio=0.1) for s in range(5)]  # p = step / 5
    assert cos == pytest.approx([0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / 5)) for s in range(5)])
    assert cos[0] == 1.0 and all(a > b for a, b in zip(cos, cos[1:], strict=False))
    assert lr_factor(9, 5, "cosine", min_ratio=0.1) == pytest.approx(0.1)  # past the horizon (a resumed run): the floor


def test_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="lr_schedule must be one of .*'cosine'.*got 'step'"):
        lr_factor(0, 1, "step")
