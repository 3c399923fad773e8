"""LoRA end to end (real Ray, ColossalAI, peft, the transformers backend): consumers train only an adapter, pushes
carry only the adapter, and the engine then serves exactly what peft's own merge of that adapter gives; the reward
rises."""

import numpy as np
import pytest
import ray
import torch

from tests.e2e.runs import FP32, start_run, tiny_config, train

HEAD = ("q_proj", "v_proj", "lm_head")
"""with the LM head adapted too, a tiny random model can shift its output distribution within a few steps"""
LORA = {"lora_rank": 4, "lora_alpha": 8, "lora_target_modules": ("q_proj", "v_proj", "down_proj")}
WHOLE = {"train_microbatch_size": None}
"""micro-batches of the default size"""


def peft_merged(base_path: str, adapter: dict) -> dict:
    """The base model with ``adapter`` (names as pushed) merged by peft itself."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    )
    result = set_peft_model_state_dict(model, {f"base_model.model.{k}": v for k, v in adapter.items()})
    assert not result.unexpected_keys, result.unexpected_keys
    return {k: v.detach() for k, v in model.merge_and_unload().state_dict().items()}


def test_pushes_carry_the_adapter_and_the_engine_serves_peft_s_merge(ray_cluster, tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    run = start_run(
        tiny,
        inference_options=FP32,
        consumer={"learning_rate": 1e-2, "compute_dtype": "fp32", **LORA, "lora_export_merged": True, **WHOLE},
    )
    try:
        out = run.loop(max_steps=2, eval_interval=0, save_interval=0, save_dir=str(tmp_path), on_step=None)
        engine = ray.get(run.producers[0].weights.remote())
        adapter = ray.get(run.consumers[0].adapter.remote())
        consumer = ray.get(run.consumers[0].weights.remote())
    finally:
        run.shutdown()
    base = {
        k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).state_dict().items()
    }
    assert len(adapter) == 2 * 3 * 2  # A and B of three modules in each of two layers
    # Only the adapter travels: each push is its bytes, a fraction of the model's.
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    assert all(m["weights/bytes"] == adapter_bytes for m in out["history"])
    assert adapter_bytes < 0.2 * sum(t.numel() * t.element_size() for t in base.values())
    merged = peft_merged(tiny, adapter)
    targets = [k for k in base if any(f".{m}." in k for m in LORA["lora_target_modules"])]
    assert targets
    for name, weight in engine.items():
        assert torch.allclose(weight, merged[name], atol=1e-6), name  # the engine serves peft's merge ...
        assert torch.allclose(consumer[name], merged[name], atol=1e-6), name  # ... which is the consumer's model
        if name in targets:
            assert not torch.allclose(weight, base[name], atol=1e-4), name  # ... and not the base model
        else:
            assert torch.equal(weight, base[name]), name  # frozen weights never change
    # final/ and each checkpoint hold the adapter as a PEFT folder that peft loads onto the base; final/merged the
    # merged model.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM as Auto

    for folder in (tmp_path / "final", tmp_path / "checkpoints" / "step-2" / "adapter"):
        loaded = PeftModel.from_pretrained(Auto.from_pretrained(tiny, dtype=torch.float32), str(folder))
        state = loaded.merge_and_unload().state_dict()
        assert all(torch.allclose(state[k], merged[k], atol=1e-6) for k in merged), folder
    final_merged = Auto.from_pretrained(str(tmp_path / "final" / "merged")).state_dict()
    assert all(torch.allclose(final_merged[k], merged[k], atol=1e-6) for k in merged)


def test_zero_trains_the_adapter_and_the_engine_serves_the_consumer_s_merge(ray_cluster, tiny, tmp_path):
    """ZeRO-2 over two consumers (bf16 on both sides, as ZeRO needs): the adapter trains identically on both ranks, the
    pushes are its bf16 bytes, the engine holds exactly the consumer's merged model, and the adapter is exported."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run = start_run(
        tiny,
        inference_options={"dtype": "bfloat16"},
        consumer={
            "num_consumer_procs": 2,
            "train_batch_size": 2,
            "train_minibatch_size": 2,
            "plugin": {"zero_stage": 2, "precision": "bf16"},
            "learning_rate": 1e-2,
            **LORA,
            **WHOLE,
        },
    )
    try:
        before = ray.get(run.consumers[0].adapter.remote())
        out = run.loop(max_steps=2, eval_interval=0, save_interval=0, save_dir=str(tmp_path), on_step=None)
        engine = ray.get(run.producers[0].weights.remote())
        adapters = ray.get([c.adapter.remote() for c in run.consumers])
        consumer = ray.get(run.consumers[0].weights.remote())
    finally:
        run.shutdown()
    assert all(not torch.equal(before[k], adapters[0][k]) for k in before)  # every adapter tensor trained
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in before)  # ... alike on both ranks
    assert all(m["weights/bytes"] == sum(t.numel() * 2 for t in before.values()) for m in out["history"])
    assert all(torch.equal(w, consumer[name]) for name, w in engine.items())
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16), str(tmp_path / "final")
    )
    state = loaded.merge_and_unload().state_dict()
    assert all(torch.allclose(state[k].float(), consumer[k].float(), atol=1e-2) for k in consumer)


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory):
    """head_dim 32, which vLLM's CPU attention kernels take"""
    from coati.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("lora_vllm"), num_heads=2, vocab_multiple=8))


@pytest.mark.parametrize("backend", ["transformers", "vllm"])
def test_reward_rises_with_lora(ray_cluster, tiny, tiny32, backend):
    model = tiny32 if backend == "vllm" else tiny
    lora = {"lora_rank": 8, "lora_alpha": 16, "lora_target_modules": HEAD}
    out = train(
        tiny_config(
            model,
            algo="RLOO",
            run={"max_steps": 12},
            producer={"backend": backend},
            consumer={"learning_rate": 2e-2, **lora, **WHOLE},
        )
    )
    rewards = [m["reward/mean"] for m in out["history"]]
    first, last = np.mean(rewards[:3]), np.mean(rewards[-3:])
    assert last > first + 0.05, rewards


def test_lora_refuses_what_it_does_not_support(ray_cluster, tiny, tiny32):
    with pytest.raises(ValueError, match=r"LoRA trains with data parallelism, ZeRO included \(tp_size=1, pp_size=1\)"):
        train(tiny_config(tiny, consumer={"num_consumer_procs": 2, "plugin": {"tp_size": 2}, **LORA}))
    with pytest.raises(ValueError, match="in_flight_weight_updates with LoRA is not supported yet"):
        train(
            tiny_config(
                tiny32,
                producer={"backend": "vllm"},
                run={"in_flight_weight_updates": True, "max_staleness": 1},
                consumer=LORA,
            )
        )
    from coati.distributed.inference.sglang_backend import SGLangBackend  # the class only: sglang itself is GPU-only

    with pytest.raises(ValueError, match="SGLangBackend engine cannot apply LoRA pushes yet"):
        SGLangBackend.engine_options({}, processes=1, sleep=False, gpu=True, lora_rank=8)


def test_a_resumed_lora_run_continues_exactly(ray_cluster, tiny, tmp_path):
    """Adapter and optimizer come back from a checkpoint: resumed from the step-2 checkpoint of a 3-step run, step 3
    trains with that run's loss."""
    consumer = {"learning_rate": 2e-2, "compute_dtype": "fp32", **LORA, **WHOLE}
    full = train(tiny_config(tiny, tmp_path / "full", consumer=consumer, run={"max_steps": 3, "save_interval": 2}))
    step2 = tmp_path / "full" / "checkpoints" / "step-2"
    assert (step2 / "adapter" / "adapter_config.json").exists()
    resumed = train(tiny_config(tiny, tmp_path / "cont", consumer=consumer, run={"max_steps": 3, "resume": str(step2)}))
    assert [m["step"] for m in resumed["history"]] == [3]
    assert resumed["history"][0]["loss/policy"] == full["history"][2]["loss/policy"]
    assert resumed["history"][0]["loss/policy"] != full["history"][1]["loss/policy"]
