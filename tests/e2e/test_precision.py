"""Trainer precision (real Ray, real ColossalAI, the transformers backend): bf16 autocast over fp32 master weights
keeps a small learning-rate step that bf16 weights would lose, and the engine's weights follow the trainer's compute
dtype unless set (pushes travel in it)."""

import pytest
import ray
import torch

from coati.distributed.driver.actor_group import KEEP_FREED_MEMORY
from tests.e2e.runs import start_run


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from coati.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("precision_model"), vocab_multiple=8))


def one_step_delta(tiny, compute_dtype: str) -> dict:
    run = start_run(
        tiny,
        run={"max_steps": 1},
        inference_options=None,
        consumer={"learning_rate": 2e-5, "compute_dtype": compute_dtype, "train_microbatch_size": None},
    )
    try:
        (producer,), (consumer,) = run.actors.producer_info, run.actors.consumer_info
        assert consumer["compute_dtype"] == compute_dtype
        assert consumer["attention"] == "coati_sdpa"  # on a CPU: bf16 calls take its matmul path, fp32 ones SDPA
        assert consumer["malloc"] == producer["malloc"] == KEEP_FREED_MEMORY  # on a CPU: freed memory stays mapped
        assert producer["dtype"] == ("bfloat16" if compute_dtype == "bf16" else "the backend's default")
        assert producer["weight_dtype"] == ("bfloat16" if compute_dtype == "bf16" else "float32")
        before = run.full_weights()
        out = run.loop(max_steps=1, eval_interval=0, save_interval=0, save_dir=None, on_step=None)
        after = run.full_weights()
        engine = ray.get(run.producers[0].weights.remote())
    finally:
        run.shutdown()
    assert out["history"][0]["actor/skipped_steps"] == 0
    # Pushes travel in the engine's dtype: a bf16 engine's take half the bytes of the fp32 masters.
    assert out["history"][0]["weights/bytes"] == sum(v.numel() * engine[k].element_size() for k, v in after.items())
    assert out["history"][0]["weights/in_place_fraction"] == 1.0  # the casts laid out as the engine's flat weights
    for k, v in after.items():  # the push reaches the engine as the trainer's weights in the engine's dtype
        assert engine[k].dtype == (torch.bfloat16 if compute_dtype == "bf16" else torch.float32), k
        assert torch.equal(engine[k], v.to(engine[k].dtype)), k
    return {k: (after[k] - before[k]) for k in before}


def test_a_2e_5_step_under_bf16_autocast_changes_the_fp32_masters_as_fp32_training_does(ray_cluster, tiny):
    fp32, bf16 = one_step_delta(tiny, "fp32"), one_step_delta(tiny, "bf16")
    for name, d32 in fp32.items():
        d16 = bf16[name]
        assert d16.dtype == torch.float32
        moved32, moved16 = d32 != 0, d16 != 0
        # Adam's first step moves every weight with a gradient by about lr: none of it may vanish in bf16.
        assert moved16.sum() >= 0.99 * moved32.sum(), (name, int(moved16.sum()), int(moved32.sum()))
        both = moved32 & moved16
        agree = (torch.sign(d32[both]) == torch.sign(d16[both])).float().mean()
        assert agree > 0.9, (name, float(agree))
        assert d16.abs().max() <= 2e-5 * 1.01 + 1e-9, (name, float(d16.abs().max()))
