"""The reward-failure rule: any scoring error on the run's first step stops the run, later only more than the allowed
fraction of a step does; the message names the function, the count, the rule, the first error and its row."""

import numpy as np
import pytest

from coati.distributed.guards import RewardFailure, check_reward_failures


def step_rows(failing_rows: dict[int, str], rows: int = 16, per_row: int = 4, timeouts: int = 0) -> tuple:
    """A step's (failed, timed out, messages, dataset rows): ``rows`` prompts of ``per_row`` completions each, every
    completion of ``failing_rows`` failed with that row's message, the first ``timeouts`` failures timeouts."""
    index = np.repeat(np.arange(rows), per_row)
    error = np.isin(index, list(failing_rows))
    timeout = np.zeros_like(error)
    timeout[np.flatnonzero(error)[:timeouts]] = True
    message = np.array([failing_rows.get(int(i), "") for i in index], dtype="<U300")
    return error, timeout, message, index


def test_any_error_on_the_first_step_stops_the_run_naming_the_first_one():
    step = step_rows({1: "ZeroDivisionError: division by zero", 5: "KeyError: 'gold'"})
    with pytest.raises(
        RewardFailure,
        match=r"train: reward function f failed on 8 of 64 completions \(on the run's "
        r"first step\); first error, dataset row 1: ZeroDivisionError",
    ):
        check_reward_failures(*step, "reward function f", max_fraction=0.5, first_step=True, where="train")


def test_later_steps_stop_only_above_the_fraction_and_count_otherwise():
    step = step_rows({1: "ZeroDivisionError"}, timeouts=1)  # 4 of 64 = 6.25%
    with pytest.raises(RewardFailure, match=r"failed on 4 of 64 completions \(more than 5% of the step\)"):
        check_reward_failures(*step, "reward function f", max_fraction=0.05, first_step=False, where="train")
    counts = check_reward_failures(*step, "reward function f", max_fraction=0.1, first_step=False, where="train")
    assert counts == {"reward/errors": 4, "reward/timeouts": 1, "reward/scored": 64}
    clean = step_rows({})
    assert (
        check_reward_failures(*clean, "reward function f", max_fraction=0.0, first_step=True, where="train")[
            "reward/errors"
        ]
        == 0
    )


def test_the_engine_trainer_tolerance_follows_the_two_precisions():
    from coati.distributed.guards import GAP_TOLERANCE, gap_tolerance

    assert gap_tolerance(None, "float32", True) == GAP_TOLERANCE["fp32"]
    assert gap_tolerance(None, "bfloat16", True) == gap_tolerance(None, "float32", False) == GAP_TOLERANCE["low"]
    assert gap_tolerance(None, None, True) == GAP_TOLERANCE["low"]  # engines that do not say: the looser one
    assert gap_tolerance(0.02, "float32", True) == 0.02 and gap_tolerance(0.0, "float32", True) == 0.0


@pytest.mark.parametrize(
    "gap, tolerance, stops",
    [
        (1e-5, 5e-3, False),
        (5e-3, 5e-3, False),
        (6e-3, 5e-3, True),
        (float("nan"), 5e-3, True),
        (0.9, 0.0, False),
        (None, 5e-3, False),
    ],
)
def test_a_gap_beyond_the_tolerance_stops_the_run_naming_the_step(gap, tolerance, stops):
    from coati.distributed.guards import EngineMismatch, check_engine_trainer_gap

    metrics = {} if gap is None else {"rollout/engine_trainer_gap_abs": gap}
    if stops:
        with pytest.raises(EngineMismatch, match=r"^step 7: the engines' log-probs .* \(tolerance 0.005 for these"):
            check_engine_trainer_gap(metrics, tolerance, 7)
    else:
        check_engine_trainer_gap(metrics, tolerance, 7)


def test_fresh_rows_are_those_sampled_whole_by_the_step_s_weights():
    from coati.distributed.record import fresh_rows

    versions = np.array([[3, 3, 3, 0], [2, 3, 3, 3], [3, 3, 0, 0], [2, 2, 2, 2], [0, 0, 0, 0], [3, 4, 0, 0]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=bool)
    # whole at 3; spans a push (its later tokens too); whole; stale; empty; beyond the step's version
    assert fresh_rows(versions, mask, 3).tolist() == [True, False, True, False, False, False]
