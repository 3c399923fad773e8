"""The loop on CUDA: ColossalAI (HybridAdam's CUDA kernel, bf16, ZeRO) and transformers producers on GPU. One GPU is
enough for the colocated tests (producer and consumer share it; weights over gloo through host memory); the NCCL
weight push needs two. Run with `pytest -m gpu` on a GPU machine."""

import numpy as np
import pytest
import ray
import torch

from coati.distributed.launch import build_config, launch_distributed
from coati.distributed.loop import Run, preflight
from coati.models import build_tiny_model

pytestmark = pytest.mark.gpu
REWARD = "tests.component.reward_fns:digit_fraction"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("gpu_model"), vocab_multiple=8))


def kwargs(tiny, **over):
    kw = dict(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"rows": [{"prompt": f"q{i}"} for i in range(64)]},
        inference_model_config={"path": tiny}, train_model_config={"path": tiny},
        generate_config={"max_new_tokens": 12, "temperature": 1.0},
        grpo_config={"lr": 3e-3, "reward_fn_type": REWARD, "train_microbatch_size": 8},
        plugin_config={"precision": "bf16"}, num_generations=4, core_algo="RLOO", max_steps=3,
    )  # fmt: skip
    kw.update(over)
    return kw


def test_colocated_reward_rises_on_one_gpu(ray_cluster, tiny):
    out = launch_distributed(**kwargs(tiny, colocate=True, max_steps=12))
    rewards = [m["reward/mean"] for m in out["history"]]
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.05, rewards
    # Both actors were placed on the one GPU and the placement group is gone afterwards.
    assert not [g for g in ray.util.placement_group_table().values() if g["state"] == "CREATED"]


@pytest.mark.parametrize("plugin", [{"precision": "bf16"}, {"precision": "bf16", "zero_stage": 2}], ids=["bf16", "zero2"])
def test_colocated_weights_change_and_reach_the_producer_bitwise(ray_cluster, tiny, plugin):
    kw = kwargs(tiny, plugin_config=plugin)
    cfg = build_config(
        1, 1, 1, 1, kw["inference_batch_size"], kw["inference_microbatch_size"], kw["train_batch_size"],
        kw["train_minibatch_size"], kw["generate_config"], dict(kw["grpo_config"]), plugin, "transformers",
        kw["num_generations"], kw["core_algo"],
    )  # fmt: skip
    plan = preflight(cfg, train_model_path=tiny, inference_model_path=tiny, tokenizer_path=tiny,
                     train_dataset=kw["train_dataset_config"], eval_dataset=None, reward_fn=REWARD,
                     cpus_per_actor=0.5, colocate=True)  # fmt: skip
    run = Run(cfg, plan, seed=0, reward_kwargs=None, reward_workers=1, weight_sync_timeout_s=60, max_staleness=0,
              master_addr=None, master_port=None, run_name="gpu-" + str(id(cfg)))  # fmt: skip
    try:
        run.start_actors()
        (producer,), (consumer,) = run.producer_info, run.consumer_info
        assert producer["device"].startswith("cuda") and consumer["device"].startswith("cuda")
        assert producer["gpus"] == consumer["gpus"] and len(producer["gpus"]) == 1  # one GPU, shared
        run.connect_weight_group()
        run.push_weights()
        before = run.full_weights()
        run.loop(max_steps=2, eval_interval=0, save_interval=0, save_dir=None, on_step=None)
        after = run.full_weights()
        assert not [k for k in before if torch.equal(before[k], after[k])]
        got = ray.get(run.producers[0].weights.remote())
        for k, v in after.items():
            assert got[k].dtype == v.dtype == torch.bfloat16 and torch.equal(got[k].cpu(), v), k
    finally:
        run.shutdown()


def test_loop_on_two_gpus_over_nccl(ray_cluster, tiny):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: one producer, one consumer")
    out = launch_distributed(**kwargs(tiny))
    assert [m["step"] for m in out["history"]] == [1, 2, 3]
