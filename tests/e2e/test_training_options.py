"""Consumer training options with real Ray and ColossalAI: gradient checkpointing trains the same step as keeping the
activations, and the learning-rate schedule's warmup reaches the optimizer (the schedule over several steps is
checked in test_datasets' run)."""

import pytest
import torch

from coati.distributed.schedule import lr_factor
from tests.e2e.test_launch import REWARD, start_run, tiny  # noqa: F401 - the module's tiny-model fixture

LR = 1e-3


def one_step(tiny, checkpointing: bool):  # noqa: F811
    # Both compute every row in full, so that the step is the same to float rounding (Adam's first step moves a weight
    # by about lr x the sign of its gradient: a gradient near 0 that rounds differently flips it). Checkpointing alone
    # would pack each group in one row (its recompute keeps no KV cache); that layout under checkpointing is checked
    # against the model's own gradients in test_forward.py.
    shared = {"share_prompt_forward": False}
    options = {"gradient_checkpointing": True, **shared} if checkpointing else shared
    run = start_run(tiny, core_algo="GRPO", grpo_config={"lr": LR, "reward_fn_type": REWARD, "compute_dtype": "fp32",
                                                         "lr_schedule": "linear", "warmup_steps": 2, **options})  # fmt: skip
    try:
        (info,) = run.actors.consumer_info
        assert info["gradient_checkpointing"] is checkpointing
        assert info["layouts"] == ("rows",)
        before = run.full_weights()
        metrics = run.loop(max_steps=1, eval_interval=0, save_interval=0, save_dir=None, on_step=None)["history"][0]
        return metrics, {k: v - before[k] for k, v in run.full_weights().items()}
    finally:
        run.shutdown()


def test_gradient_checkpointing_trains_the_same_step(ray_cluster, tiny):  # noqa: F811
    (kept, d_kept), (recomputed, d_recomputed) = one_step(tiny, False), one_step(tiny, True)
    assert kept["reward/mean"] == recomputed["reward/mean"]  # the same rollouts
    for key in ("loss/policy", "actor/grad_norm", "actor/entropy"):
        assert recomputed[key] == pytest.approx(kept[key], rel=1e-5), key
    for name, d in d_kept.items():
        assert torch.allclose(d_recomputed[name], d, atol=1e-7), name
    # The first of two warmup steps runs at half the rate: Adam's first step moves each weight with a gradient by
    # about its learning rate, so the largest move is that half.
    half = LR * lr_factor(0, 1, "linear", warmup=2)
    assert half == LR / 2 and kept["actor/lr"] == pytest.approx(half)
    assert max(float(d.abs().max()) for d in d_kept.values()) == pytest.approx(half, rel=0.02)
