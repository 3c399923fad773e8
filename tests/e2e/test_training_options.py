"""Consumer training options with real Ray and ColossalAI: the learning-rate schedule reaches the optimizer, and
gradient checkpointing trains the same step as keeping the activations."""

import pytest
import torch

from coati.distributed.schedule import lr_factor
from tests.e2e.test_launch import REWARD, start_run, tiny  # noqa: F401 - the module's tiny-model fixture


def test_the_schedule_sets_each_steps_learning_rate(ray_cluster, tiny):  # noqa: F811
    lr = 1e-3
    run = start_run(tiny, grpo_config={"lr": lr, "reward_fn_type": REWARD, "lr_schedule": "linear", "warmup_steps": 2,
                                       "min_lr_ratio": 0.5})  # fmt: skip
    deltas = []
    try:
        before = run.full_weights()
        out = run.loop(max_steps=4, eval_interval=0, save_interval=0, save_dir=None,
                       on_step=lambda m: deltas.append(run.full_weights()) if m["step"] == 1 else None)  # fmt: skip
    finally:
        run.shutdown()
    expected = [lr * lr_factor(s, 4, "linear", warmup=2, min_ratio=0.5) for s in range(4)]
    assert expected == pytest.approx([5e-4, 1e-3, 1e-3, 7.5e-4])
    assert [m["actor/lr"] for m in out["history"]] == pytest.approx(expected)
    # Adam's first step moves each weight that has a gradient by about its learning rate: the warmed-up half.
    moved = max(float((deltas[0][k] - before[k]).abs().max()) for k in before)
    assert moved == pytest.approx(expected[0], rel=0.02)


def one_step(tiny, checkpointing: bool):  # noqa: F811
    # Checkpointing turns the shared-prompt forward off by itself (its recompute keeps no KV cache): the run without
    # it turns it off by hand, so both compute every row in full.
    options = {"gradient_checkpointing": True} if checkpointing else {"share_prompt_forward": False}
    run = start_run(tiny, core_algo="GRPO", grpo_config={"lr": 1e-3, "reward_fn_type": REWARD, "compute_dtype": "fp32",
                                                         **options})  # fmt: skip
    try:
        (info,) = run.actors.consumer_info
        assert info["gradient_checkpointing"] is checkpointing and info["shares_prompts"] is False
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
