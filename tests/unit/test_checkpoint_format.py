"""The checkpoint's layout of a model's weights (``model/checkpoint_format.py``): what engines load and what push
attestation fingerprints, and the mixture-of-experts models the vLLM engine is refused for on a CPU."""

import pytest
import torch
from safetensors.torch import load_file

from coati.distributed.inference.vllm_options import VLLMOptions
from coati.distributed.model.architectures import expert_width, load_config, num_experts
from coati.distributed.model.checkpoint_format import meta_model, to_checkpoint
from coati.testing import MOE_ARCHITECTURES, build_tiny_model


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_a_moes_fused_experts_come_back_as_the_checkpoint_stores_them(arch, tmp_path):
    """transformers holds the experts fused ([E, 2I, H] gate_up, [E, H, I] down); the checkpoint one matrix per
    expert (Mixtral's block renamed): the names and values ``save_pretrained`` wrote, from the model itself and from
    a meta model of its config alike."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = build_tiny_model(tmp_path / arch, arch, hidden_size=64, num_heads=2)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    state = {k: v.detach() for k, v in model.named_parameters()}
    assert any(v.ndim == 3 for v in state.values())  # fused experts
    disk = load_file(str(path / "model.safetensors"))
    for source in (model, meta_model(AutoConfig.from_pretrained(str(path)))):
        converted = to_checkpoint(source, state)
        assert set(converted) == set(disk)
        assert all(torch.equal(converted[k], disk[k]) for k in disk)
    config = load_config(str(path))
    assert num_experts(config) == 8 and expert_width(config) == 128


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_a_dense_models_weights_are_returned_as_they_are(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(build_tiny_model(tmp_path / arch, arch)))
    state = {k: v.detach() for k, v in model.named_parameters()}
    converted = to_checkpoint(model, state)
    assert set(converted) == set(state) and all(converted[k] is state[k] for k in state)
    assert num_experts(load_config(str(tmp_path / arch))) == 0


def test_the_cpu_vllm_engine_is_refused_for_moes_it_computes_or_reloads_otherwise():
    base = {"model_type": "qwen3_moe", "hidden_size": 128, "num_attention_heads": 2, "head_dim": 64}
    VLLMOptions.check_model({**base, "num_experts": 8, "moe_intermediate_size": 256}, "m", {}, gpu=False)
    with pytest.raises(
        ValueError,
        match=r"m's experts are 48 wide, which vLLM's CPU MoE kernel pads to a multiple of 32.*-b transformers",
    ):
        VLLMOptions.check_model({**base, "num_experts": 8, "moe_intermediate_size": 48}, "m", {}, gpu=False)
    VLLMOptions.check_model({**base, "num_experts": 8, "moe_intermediate_size": 48}, "m", {}, gpu=True)
    olmoe = {**base, "model_type": "olmoe", "num_experts": 8, "intermediate_size": 256}
    VLLMOptions.check_model({**olmoe, "norm_topk_prob": False}, "m", {}, gpu=False)
    with pytest.raises(ValueError, match=r"OLMoE with norm_topk_prob=true, which vLLM's OLMoE ignores"):
        VLLMOptions.check_model({**olmoe, "norm_topk_prob": True}, "m", {}, gpu=True)
