"""The loop on CUDA: ColossalAI (HybridAdam's CUDA kernel, bf16, ZeRO) and transformers producers on GPU. One GPU is
enough for the colocated tests (producer and consumer share it; weights over gloo through host memory); the NCCL
weight push needs two. Run with `pytest -m gpu` on a GPU machine."""

import numpy as np
import pytest
import ray
import torch

from coati.testing import build_tiny_model
from tests.e2e.runs import start_run, tiny_config, train

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("gpu_model"), vocab_multiple=8))


def config(tiny, **run):
    return tiny_config(tiny, algo="RLOO", consumer={"plugin": {"precision": "bf16"}}, run={"max_steps": 3, **run})


def test_colocated_reward_rises_on_one_gpu(ray_cluster, tiny):
    out = train(config(tiny, colocate=True, max_steps=12))
    rewards = [m["reward/mean"] for m in out["history"]]
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.05, rewards
    # The shared GPU's placement group is gone afterwards.
    assert not [g for g in ray.util.placement_group_table().values() if g["state"] == "CREATED"]


@pytest.mark.parametrize(
    "plugin, sleep",
    [
        ({"precision": "bf16"}, False),
        ({"precision": "bf16", "zero_stage": 2}, False),
        ({"precision": "bf16"}, True),
        ({"precision": "fp32"}, False),
    ],
    ids=["bf16", "zero2", "bf16-sleep", "fp32-masters-bf16-engine"],
)
def test_colocated_weights_change_and_reach_the_producer_bitwise(ray_cluster, tiny, plugin, sleep):
    # The engine follows a bf16 trainer; under an fp32 trainer it is asked for bf16, so pushes are cast on the GPU.
    options = None if plugin["precision"] == "bf16" else {"dtype": "bfloat16"}
    run = start_run(
        tiny,
        colocate=True,
        sleep_while_training=sleep,
        consumer={"plugin": plugin},
        algo="RLOO",
        inference_options=options,
    )
    try:
        (producer,), (consumer,) = run.actors.producer_info, run.actors.consumer_info
        assert producer["device"].startswith("cuda") and consumer["device"].startswith("cuda")
        assert producer["gpus"] == consumer["gpus"] and len(producer["gpus"]) == 1  # one GPU, shared
        before = run.full_weights()
        history = run.loop(max_steps=2, eval_interval=0, save_interval=0, save_dir=None, on_step=None)["history"]
        if sleep:  # the producer's CUDA memory is given back while the consumer trains
            for m in history:
                assert (
                    m["inference/mem_awake_mb"] > 0 and m["inference/mem_asleep_mb"] < 0.1 * m["inference/mem_awake_mb"]
                )
        # The consumer's CUDA weights stay in one flat buffer through the bf16 optimizer steps (ZeRO-2's gathers
        # included), so each push is one span sent as it lies (copied to host memory once: the colocated wire is gloo).
        last = history[-1]
        # fp32 masters are cast into one flat bf16 buffer laid out as the engine's weights: half the bytes.
        assert last["weights/transfers"] == 1 and last["weights/direct_fraction"] == 1.0, last
        after = run.full_weights()
        assert last["weights/bytes"] == sum(2 * v.numel() for v in after.values()), last
        assert not [k for k in before if torch.equal(before[k], after[k])]
        got = ray.get(run.producers[0].weights.remote())
        for k, v in after.items():
            assert v.dtype == {"bf16": torch.bfloat16, "fp32": torch.float32}[plugin["precision"]], k
            assert got[k].dtype == torch.bfloat16 and torch.equal(got[k].cpu(), v.to(torch.bfloat16)), k
    finally:
        run.shutdown()


def test_loop_on_two_gpus_over_nccl(ray_cluster, tiny):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: one producer, one consumer")
    out = train(config(tiny))
    assert [m["step"] for m in out["history"]] == [1, 2, 3]
    # NCCL, flat weights on both GPUs: every push lands in the producer's weights in place, in one transfer.
    last = out["history"][-1]
    assert last["weights/in_place_fraction"] == 1.0 and last["weights/transfers"] == 1, last
