"""The rollout record: a rollout call's statistics are said once, beside its rows (``calls``, ``call_index``), and
survive selection, concatenation, a checkpoint and the step's metrics."""

import json

import numpy as np

from coati.distributed.driver.checkpoint import load_driver_state, save_driver_state
from coati.distributed.record import RolloutBatch, batch_from_responses, call_values, called_rows
from coati.distributed.trainer.step_metrics import drawn_metrics

G = 2


def called(k, **call):
    """``k`` groups of G rows made by one call with statistics ``call``."""
    b = batch_from_responses([[1, 2]] * k, G, [[3, 4]] * (k * G), None, [True] * (k * G), pad_id=0)
    b.rewards = np.zeros(k * G, dtype=np.float32)
    b.reward_status = np.zeros(k * G, dtype=np.int8)
    b.calls, b.call_index = [dict(call)], np.zeros(k * G, dtype=np.int64)
    return b.validate()


def test_a_call_is_said_once_whatever_its_rows():
    b = called(3, producer=0, threads=2)
    assert b.calls == [{"producer": 0, "threads": 2}]
    assert not any("threads" in k or "time/" in k for k in b.extras)  # not copied into the rows


def test_concat_points_each_row_at_its_own_call_and_select_keeps_them():
    a, b = called(1, producer=0, threads=1), called(2, producer=1, threads=4)
    both = RolloutBatch.concat([a, b])
    assert both.calls == a.calls + b.calls
    assert both.call_index.tolist() == [0, 0, 1, 1, 1, 1]
    assert call_values(both, "threads").tolist() == [1, 1, 4, 4, 4, 4]
    kept = both.select(np.array([2, 3]))
    assert [c["producer"] for c in called_rows(kept)] == [1]
    assert call_values(kept, "producer").tolist() == [1, 1]


def test_the_step_counts_each_call_once():
    """Prompts passed over and timings come from the calls, not from rows: a call's skipped prompts count once
    however many of its rows were drawn, and its time is the slowest call's."""
    a = called(2, skipped_prompts=3, threads=1, threads_start=1, threads_end=1, **{"time/generate": 2.0})
    b = called(1, skipped_prompts=1, threads=4, threads_start=1, threads_end=4, **{"time/generate": 5.0})
    drawn = RolloutBatch.concat([a, b])

    class Draws:
        draws, dropped_zero_signal_groups, filled_zero_signal_groups, stale_dropped_groups = 2, 0, 0, 0

    m = drawn_metrics(drawn, Draws, G)
    assert m["rollout/skipped_prompts"] == 4
    assert m["rollout/threads"] == 4
    assert m["rollout/rows_lent_cores"] == G  # the rows of the call that took the cores
    assert m["rollout/rows_cores_taken_back"] == 0
    assert m["time/generate"] == 5.0


def test_calls_round_trip_through_a_checkpoint(tmp_path):
    b = called(2, producer=1, skipped_prompts=2, **{"time/generate": 0.5})
    save_driver_state(tmp_path, [b], [])
    json.loads((tmp_path / "driver.json").read_text())  # plain JSON
    [back] = load_driver_state(tmp_path)["buffer"]
    assert back.calls == b.calls and back.call_index.tolist() == b.call_index.tolist()


def test_a_prompt_s_image_inputs_are_said_once_for_its_group(tmp_path):
    """Vision-language rows point at their prompt's image inputs (one entry per group, not per completion); the
    entries survive concatenation, selection and a checkpoint."""
    a, b = called(1, producer=0), called(2, producer=1)
    for batch, k in ((a, 1), (b, 2)):
        batch.pixels = [{"pixel_values": np.full((1, 3, 4, 4), float(j), dtype=np.float32)} for j in range(k)]
        batch.pixel_index = np.repeat(np.arange(k), G)
    both = RolloutBatch.concat([a, b]).validate()
    assert len(both.pixels) == 3 and both.pixel_index.tolist() == [0, 0, 1, 1, 2, 2]
    kept = both.select(np.array([4, 5]))
    assert float(kept.pixels[kept.pixel_index[0]]["pixel_values"].max()) == 1.0  # the second group of b
    save_driver_state(tmp_path, [both], [])
    [back] = load_driver_state(tmp_path)["buffer"]
    assert back.pixel_index.tolist() == both.pixel_index.tolist()
    assert all(
        np.array_equal(x["pixel_values"], y["pixel_values"]) for x, y in zip(back.pixels, both.pixels, strict=True)
    )
