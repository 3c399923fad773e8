"""The reward-failure rule: any scoring error on the run's first step stops the run, later only more than the allowed
fraction of a step does; the message names the function, the count, the rule, the first error and its row."""

import numpy as np
import pytest

from coati.distributed.guards import RewardFailure, check_reward_failures


def extras(failing_rows: dict[int, str], rows: int = 16, per_row: int = 4, timeouts: int = 0) -> dict:
    """A step's extras: ``rows`` prompts of ``per_row`` completions each, every completion of ``failing_rows``
    failed with that row's message, the first ``timeouts`` failures counted as timeouts."""
    index = np.repeat(np.arange(rows), per_row)
    error = np.isin(index, list(failing_rows))
    timeout = np.zeros_like(error)
    timeout[np.flatnonzero(error)[:timeouts]] = True
    message = np.array([failing_rows.get(int(i), "") for i in index], dtype="<U300")
    return {"reward_error": error, "reward_timeout": timeout, "reward_error_msg": message, "prompt_index": index}


def test_any_error_on_the_first_step_stops_the_run_naming_the_first_one():
    step = extras({1: "ZeroDivisionError: division by zero", 5: "KeyError: 'gold'"})
    with pytest.raises(RewardFailure, match=r"train: reward function f failed on 8 of 64 completions \(on the run's "
                       r"first step\); first error, dataset row 1: ZeroDivisionError"):  # fmt: skip
        check_reward_failures(step, "f", max_fraction=0.5, first_step=True, where="train")


def test_later_steps_stop_only_above_the_fraction_and_count_otherwise():
    step = extras({1: "ZeroDivisionError"}, timeouts=1)  # 4 of 64 = 6.25%
    with pytest.raises(RewardFailure, match=r"failed on 4 of 64 completions \(more than 5% of the step\)"):
        check_reward_failures(step, "f", max_fraction=0.05, first_step=False, where="train")
    counts = check_reward_failures(step, "f", max_fraction=0.1, first_step=False, where="train")
    assert counts == {"reward/errors": 4, "reward/timeouts": 1, "reward/scored": 64}
    clean = extras({})
    assert check_reward_failures(clean, "f", max_fraction=0.0, first_step=True, where="train")["reward/errors"] == 0
