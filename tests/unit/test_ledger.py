"""The ledger of prompt groups alone (no Ray): each drawn group's fate, a group refused a second training, the
account against what the cursors handed out, and its checkpoint round trip."""

import numpy as np
import pytest

from coati.distributed.driver.checkpoint import load_driver_state, save_driver_state
from coati.distributed.driver.ledger import GroupTrainedTwice
from coati.distributed.driver.rollout_buffer import RolloutBuffer
from coati.distributed.record import batch_from_responses
from coati.distributed.rollout.data import DataCursor

G = 2


def draw(pairs, task_rewards=None, version=0):
    """One scored draw: a group of G rows for each (epoch, row) pair."""
    k = len(pairs)
    b = batch_from_responses([[1, 2]] * k, G, [[3]] * (k * G), None, [True] * (k * G), pad_id=0)
    task = np.asarray(task_rewards or [[0, 1]] * k, dtype=np.float32).reshape(-1)
    b.rewards, b.task_rewards = task.copy(), task
    b.no_signal = np.repeat([len(set(g)) == 1 for g in (task_rewards or [[0, 1]] * k)], G)
    b.extras["episode"] = np.repeat([e for e, _ in pairs], G).astype(np.int64)
    b.extras["prompt_index"] = np.repeat([r for _, r in pairs], G).astype(np.int64)
    b.group_ids = b.group_ids + 100 * b.extras["prompt_index"][0] + 10_000 * b.extras["episode"][0]
    b.policy_version = np.full(k * G, version, dtype=np.int64)
    return b


def test_every_drawn_group_gets_one_fate():
    """Trained, dropped without signal, dropped stale, filled in from the zero-signal groups (trained, not
    dropped), or waiting in the buffer when the run ends: each drawn group is counted once, under one fate."""
    buf = RolloutBuffer(2, G, max_staleness=1, dynamic_sampling=True, max_draws=1)
    buf.admit(draw([(0, 0), (0, 1)], [[1, 1], [0, 1]]), for_step=1)  # row 0 has no signal
    log = buf.log(1)
    log.draws = 1
    buf.fill_short(log)  # one draw allowed: the zero-signal group fills the step
    first = buf.take(trained_version=0)
    assert sorted(first.extras["prompt_index"][::G].tolist()) == [0, 1]
    buf.admit(draw([(0, 2), (0, 3)], [[1, 1], [0, 1]], version=1), for_step=2)  # row 2 dropped, never filled in
    buf.admit(draw([(0, 4)], version=0), for_step=3)  # too old for step 3
    buf.admit(draw([(0, 5), (1, 0)], version=2), for_step=3)
    buf.drop_stale(trained_version=2, log=buf.log(3))
    second = buf.take(trained_version=2)
    assert sorted(second.extras["prompt_index"][::G].tolist()) == [3, 5]
    buf.admit(draw([(1, 1)], version=3), for_step=4)
    account = buf.account()
    assert account == {
        "drawn": 8,
        "trained": 4,
        "dropped_zero_signal": 1,
        "dropped_stale": 1,
        "waiting": 2,
        "skipped": 0,
        "drawn_twice": 0,
        "lost": 0,
        "lost_groups": [],
    }, account
    assert buf.ledger.trained == {(0, 0): 1, (0, 1): 1, (0, 3): 3, (0, 5): 3}


def test_a_step_never_trains_a_group_trained_before():
    buf = RolloutBuffer(1, G, max_staleness=0, dynamic_sampling=False)
    buf.admit(draw([(0, 7)]), for_step=1)
    buf.take(trained_version=0)
    buf.admit(draw([(0, 7)], version=1), for_step=2)  # the same epoch's row 7 again
    with pytest.raises(
        GroupTrainedTwice, match=r"step 2 would train the group of dataset row 7 \(epoch 0\) that step 1"
    ):
        buf.take(trained_version=1)
    assert buf.account()["drawn_twice"] == 1
    buf.admit(draw([(1, 7)]), for_step=2)  # the next epoch's row 7 is another group
    assert RolloutBuffer(1, G, 0, False).account()["trained"] == 0


def test_the_account_finds_groups_handed_out_and_never_drawn_or_drawn_and_never_fated():
    cursor = DataCursor(6, 0, 1, seed=4)
    buf = RolloutBuffer(2, G, max_staleness=0, dynamic_sampling=False)
    picks = cursor.take(4)
    buf.admit(draw(picks[:2]), for_step=1)
    buf.take(trained_version=0)
    buf.admit(draw(picks[2:3]), for_step=2)  # picks[3] never arrives
    buf.batches.clear()  # and the drawn picks[2] vanishes from the buffer
    account = buf.account([cursor.handed_out()])
    assert account["lost"] == 2 and account["lost_groups"] == sorted([list(picks[2]), list(picks[3])])


def test_a_cursor_hands_out_what_it_took_across_epochs_less_what_came_back_and_what_it_passed_over():
    c = DataCursor(5, 0, 1, seed=2, skip_after=1, recheck=1e-9)
    taken = c.take(4)
    c.record(taken[0][1], no_signal=True)  # passed over when its turn comes in the next epoch
    c.give_back(taken[3:])
    taken = taken[:3] + c.take(6)  # the handed back pair first, then across the epoch boundary
    out = c.handed_out()
    assert sorted(map(tuple, out["taken"])) == sorted(taken) and len(taken) == len(set(taken)) == 9
    assert out["skipped"] == [[1, taken[0][1]]] and c.skipped == 1  # epoch 1's turn of the row without signal
    d = DataCursor(5, 0, 1, seed=2, skip_after=1, recheck=1e-9)
    d.restore(c.state())
    assert d.handed_out() == out


def test_the_ledger_travels_with_the_driver_state(tmp_path):
    buf = RolloutBuffer(1, G, max_staleness=1, dynamic_sampling=True)
    buf.admit(draw([(0, 1), (0, 2)], [[0, 1], [1, 1]]), for_step=1)
    buf.take(trained_version=0)
    buf.admit(draw([(0, 3)]), for_step=2)
    save_driver_state(tmp_path, buf.state(), [], buf.ledger.state())
    state = load_driver_state(tmp_path)
    again = RolloutBuffer(1, G, max_staleness=1, dynamic_sampling=True)
    again.restore(state["buffer"], state["ledger"])
    assert again.account() == buf.account() and again.account()["waiting"] == 1
    assert again.ledger.trained == {(0, 1): 1} and again.ledger.dropped == {(0, 2): "zero_signal"}
