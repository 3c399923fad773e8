"""ZeRO's optimizer-state CPU offload with real ColossalAI on CPU (gloo, two data-parallel consumers): a ZeRO-2 step
with the states offloaded trains as ZeRO-0 at the same precision, to rounding; ZeRO-3 is refused before any actor
starts, naming why."""

import pytest
import torch

from coati.distributed.trainer.config import PluginConfig
from tests.e2e.runs import start_run

DP2 = {"num_consumer_procs": 2, "train_batch_size": 2, "train_minibatch_size": 2}


def one_step(tiny, **plugin):
    run = start_run(
        tiny,
        producer={"num_producers": 2, "inference_batch_size": 2, "inference_microbatch_size": 2},
        inference_options={"dtype": "bfloat16"},
        consumer={**DP2, "plugin": {"precision": "bf16", **plugin}},
    )
    try:
        metrics = run.loop(max_steps=1, eval_interval=0, save_interval=0, save_dir=None, on_step=None)["history"][0]
        return metrics, run.full_weights()
    finally:
        run.shutdown()


def test_offloaded_optimizer_states_train_the_same_step(ray_cluster, tiny):
    (zero0, w0), (offload, w_off) = one_step(tiny, zero_stage=0), one_step(tiny, zero_stage=2, cpu_offload=True)
    assert offload["reward/mean"] == zero0["reward/mean"]  # the same rollouts
    for key in ("loss/policy", "actor/grad_norm"):
        assert offload[key] == pytest.approx(zero0[key], rel=1e-3), key
    from safetensors.torch import load_file

    initial = load_file(f"{tiny}/model.safetensors")
    assert [k for k in w0 if not torch.equal(w0[k].float(), initial[k].float())]  # the step changed the weights
    for k in w0:
        assert torch.allclose(w_off[k].float(), w0[k].float(), atol=1e-2), k


def test_zero_3_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="zero_stage=3 is refused: ColossalAI 0.5's ZeRO-3 paths need an accelerator"):
        PluginConfig(zero_stage=3, precision="bf16")
    with pytest.raises(ValueError, match="cpu_offload moves ZeRO's optimizer states to host memory"):
        PluginConfig(cpu_offload=True)
