"""The rollout buffer alone (no Ray): admission and the dynamic-sampling filter, the staleness bound, pacing, the
refill that no accepted configuration can crash, and per-step draw logs."""

import itertools

import numpy as np
import pytest

from coati.distributed.driver.rollout_buffer import RolloutBuffer
from coati.distributed.record import batch_from_responses

G = 4  # completions per group
_ids = itertools.count()


def draw(task_rewards, version, shaped=None):
    """A scored draw: one group per entry of ``task_rewards`` (G values each), sampled by weights ``version``."""
    k = len(task_rewards)
    prompts = [[1, 2]] * k
    b = batch_from_responses(prompts, G, [[3]] * (k * G), None, [True] * (k * G), pad_id=0)
    task = np.asarray(task_rewards, dtype=np.float32).reshape(-1)
    b.rewards = task.copy() if shaped is None else np.asarray(shaped, dtype=np.float32).reshape(-1)
    b.task_rewards = task
    b.no_signal = np.asarray([len(set(g)) == 1 for g in task_rewards for _ in range(G)])  # the producer's verdict
    b.extras["prompt_index"] = np.repeat([next(_ids) for _ in range(k)], G)
    b.group_ids = b.group_ids + 1000 * b.extras["prompt_index"][0]
    b.policy_version = np.full(k * G, version, dtype=np.int64)
    return b


def mixed(k):
    return [[0, 1, 0, 1]] * k


def test_degenerate_groups_mark_every_row_of_a_group_without_signal():
    import torch

    from coati.distributed.algo.grouping import degenerate_groups

    values = torch.tensor([1, 1, 1, 1, 0, 1, 0, 0], dtype=torch.float64)
    assert degenerate_groups(values, torch.tensor([7] * 4 + [3] * 4)).tolist() == [True] * 4 + [False] * 4


def test_dynamic_sampling_filters_on_the_task_reward_not_the_length_penalty():
    """An all-wrong group whose lengths differ gets different shaped rewards ([0, 0, -0.33, -1]); it has no signal of
    correctness and is dropped by default; filtering on the shaped reward keeps it."""
    task = [[0, 0, 0, 0]]
    shaped = [[0, 0, -0.33, -1.0]]
    on_task = RolloutBuffer(1, G, max_staleness=0, dynamic_sampling=True)
    on_task.admit(draw(task, 0, shaped), for_step=1)
    assert on_task.groups() == 0 and on_task.log(1).dropped_zero_signal_groups == 1
    on_shaped = RolloutBuffer(1, G, max_staleness=0, dynamic_sampling=True, signal="reward")
    on_shaped.admit(draw(task, 0, shaped), for_step=1)
    assert on_shaped.groups() == 1


def test_take_is_oldest_first_whole_groups_and_within_the_bound():
    buf = RolloutBuffer(2, G, max_staleness=1, dynamic_sampling=False)
    buf.admit(draw(mixed(2), version=3), for_step=5)
    buf.admit(draw(mixed(2), version=2), for_step=4)
    batch = buf.take(trained_version=3)
    assert batch.policy_version.tolist() == [2] * 8
    assert len(np.unique(batch.group_ids)) == 2 and all(
        (batch.group_ids == g).sum() == G for g in np.unique(batch.group_ids)
    )
    assert buf.groups() == 2


@pytest.mark.parametrize("k", [0, 1, 2])
def test_no_row_beyond_the_bound_is_trained_and_each_is_counted(k):
    buf = RolloutBuffer(2, G, max_staleness=k, dynamic_sampling=False)
    for v in range(5):  # one group per version 0..4
        buf.admit(draw(mixed(1), version=v), for_step=5)
    log = buf.log(5)
    buf.drop_stale(trained_version=4, log=log)
    assert log.stale_dropped_groups == 4 - k  # versions 0 .. 3-k are more than k behind version 4
    assert buf.groups() == k + 1
    if k + 1 >= 2:
        batch = buf.take(trained_version=4)
        assert (4 - batch.policy_version <= k).all()
        assert batch.policy_version.min() == 4 - k  # the oldest allowed go first


def test_groups_counts_only_rows_still_trainable():
    buf = RolloutBuffer(1, G, max_staleness=1, dynamic_sampling=False)
    buf.admit(draw(mixed(1), version=0), for_step=1)
    buf.admit(draw(mixed(2), version=2), for_step=3)
    assert buf.groups() == 3 and buf.groups(trained_version=2) == 2 and buf.groups(trained_version=1) == 3


@pytest.mark.parametrize("k,steps_left,target", [(0, 5, 0), (1, 5, 3), (2, 5, 6), (2, 1, 3), (3, 0, 0)])
def test_pacing_holds_at_most_k_steps_ahead(k, steps_left, target):
    assert RolloutBuffer(3, G, max_staleness=k, dynamic_sampling=False).fill_target(steps_left) == target


def test_a_short_batch_is_filled_from_zero_signal_groups_for_any_batch_size():
    """32 groups per step, 2 groups per draw: 8 draws (the old fixed limit) cannot fill it; the allowed draws scale
    with the rounds a batch needs, and the refill then always has enough zero-signal groups."""
    buf = RolloutBuffer(32, G, max_staleness=0, dynamic_sampling=True, max_draws=8)
    allowed = buf.draws_allowed(per_draw_groups=2)
    assert allowed == 8 * 16
    log = buf.log(1)
    for _ in range(allowed):  # every draw: one group with signal in 10 draws, the rest all-correct
        log.draws += 1
        buf.admit(draw([[1, 1, 1, 1], [1, 1, 1, 1]] if log.draws % 10 else [[0, 1, 1, 1], [1, 1, 1, 1]], 0), for_step=1)
    kept = buf.groups()
    assert kept == allowed // 10 < 32
    buf.fill_short(log)
    batch = buf.take(trained_version=0)
    assert len(batch) == 32 * G and log.filled_zero_signal_groups == 32 - kept


def test_fill_short_names_the_shortfall_when_nothing_is_left_to_fill_with():
    buf = RolloutBuffer(4, G, max_staleness=0, dynamic_sampling=True)
    log = buf.log(1)
    log.draws = 1
    buf.admit(draw([[1, 1, 1, 1]], 0), for_step=1)
    with pytest.raises(RuntimeError, match="1 draws left the batch 4 groups short and only 1 zero-signal groups"):
        buf.fill_short(log)


def test_draw_logs_are_kept_per_step_and_no_prompt_is_lost_or_duplicated():
    buf = RolloutBuffer(2, G, max_staleness=1, dynamic_sampling=True)
    buf.admit(draw([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]], 0), for_step=1)
    buf.admit(draw([[0, 1, 0, 1], [0, 0, 0, 0], [1, 0, 0, 0]], 0), for_step=2)  # drawn while step 1 trains
    first = buf.take(trained_version=0)
    second = buf.take(trained_version=1)
    assert buf.log(1).dropped_zero_signal_groups == 1 and buf.log(2).dropped_zero_signal_groups == 1
    assert len(buf.log(1).rollouts) == 1 and len(buf.log(2).rollouts) == 1
    trained = np.concatenate([first.extras["prompt_index"][::G], second.extras["prompt_index"][::G]]).tolist()
    assert len(trained) == len(set(trained)) == 4  # every kept group trained exactly once
    assert buf.groups() == 0


def test_state_round_trip_and_bad_settings():
    buf = RolloutBuffer(1, G, max_staleness=1, dynamic_sampling=False)
    buf.admit(draw(mixed(2), 0), for_step=1)
    again = RolloutBuffer(1, G, max_staleness=1, dynamic_sampling=False)
    again.restore(buf.state())
    assert again.groups() == 2
    with pytest.raises(ValueError, match="signal 'accuracy' is not one of"):
        RolloutBuffer(1, G, 0, True, signal="accuracy")
    with pytest.raises(ValueError, match="max_staleness must be >= 0, got -1"):
        RolloutBuffer(1, G, -1, False)


def test_groups_whose_rows_started_at_different_versions_move_whole():
    """With in-flight updates a push can land between the rows of one group: its first row started at version 3,
    the others at 4. The group is as old as its oldest row: taken first and whole, or dropped whole and counted."""
    b0, b1 = draw(mixed(1), 4), draw(mixed(2), 4)
    b1.policy_version[G] = 3  # first row of b1's second group
    buf = RolloutBuffer(2, G, 1, dynamic_sampling=False)
    buf.admit(b0, 1)
    buf.admit(b1, 1)
    assert buf.groups(5) == 2  # the mixed group is two versions behind 5
    batch = buf.take(4)
    groups = batch.group_ids.reshape(-1, G)
    assert (groups == groups[:, :1]).all() and len(set(groups[:, 0])) == 2, batch.group_ids
    assert groups[0, 0] == b1.group_ids[G]  # the oldest group first
    log = buf.log(2)
    buf.admit(b1.select(np.arange(G, 2 * G)), 2)  # the mixed group again, now at step 6
    buf.drop_stale(5, log)
    assert log.stale_dropped_groups == 1 and buf.groups() == 1  # dropped whole; the fresh leftover group stays


def test_group_ids_are_unique_across_producers_and_calls():
    import numpy as np

    from coati.distributed.record import run_group_ids

    local = np.arange(4, dtype=np.int64)
    ids = np.concatenate([run_group_ids(local, p, c) for p in range(3) for c in (1, 2, 1 << 19)])
    assert len(set(ids.tolist())) == len(ids) and ids.dtype == np.int64
    assert run_group_ids(local, 0, 1).tolist() == [(1 << 20) + i for i in range(4)]
