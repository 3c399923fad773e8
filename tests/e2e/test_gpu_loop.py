"""The same loop on CUDA: NCCL weight push, ColossalAI on GPU, transformers producers on GPU. Run with `pytest -m gpu`
on a machine with at least 2 GPUs."""

import pytest
import torch

from coati.distributed.launch import launch_distributed
from coati.models import build_tiny_model

pytestmark = pytest.mark.gpu


def test_loop_on_cuda(ray_cluster, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: one producer, one consumer")
    tiny = str(build_tiny_model(tmp_path / "m"))
    out = launch_distributed(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=4, inference_microbatch_size=4, train_batch_size=4, train_minibatch_size=4,
        train_dataset_config={"rows": [{"prompt": f"q{i}"} for i in range(32)]},
        inference_model_config={"path": tiny}, train_model_config={"path": tiny},
        generate_config={"max_new_tokens": 12}, grpo_config={"lr": 3e-3, "reward_fn_type":
                                                             "tests.component.reward_fns:digit_fraction"},
        plugin_config={"precision": "bf16"}, num_generations=4, core_algo="RLOO", max_steps=3,
    )  # fmt: skip
    assert [m["step"] for m in out["history"]] == [1, 2, 3]
