"""LoRA names and merging, by hand."""

import pytest
import torch

from coati.distributed.model.lora import adapter_pairs, adapter_tensors, hf_name, merge, merged_state


def test_peft_names_become_the_base_models_and_the_wire_names():
    assert (
        hf_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
        == "model.layers.0.self_attn.q_proj.weight"
    )
    assert hf_name("base_model.model.lm_head.weight") == "lm_head.weight"
    named = {
        "base_model.model.m.q_proj.base_layer.weight": torch.zeros(3, 2),
        "base_model.model.m.q_proj.lora_A.default.weight": torch.ones(1, 2),
        "base_model.model.m.q_proj.lora_B.default.weight": torch.ones(3, 1),
    }
    assert sorted(adapter_tensors(named)) == ["m.q_proj.lora_A.weight", "m.q_proj.lora_B.weight"]


def test_merge_adds_the_scaled_product_in_fp32_and_keeps_the_dtype():
    base = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # [out 3, in 2]
    a = torch.tensor([[1.0, -1.0]])  # [r 1, in 2]
    b = torch.tensor([[2.0], [0.0], [1.0]])  # [out 3, r 1]
    assert torch.equal(merge(base, a, b, 0.5), torch.tensor([[2.0, 1.0], [3.0, 4.0], [5.5, 5.5]]))
    assert merge(base.bfloat16(), a, b, 0.5).dtype == torch.bfloat16
    named = {
        "base_model.model.m.q_proj.base_layer.weight": base,
        "base_model.model.m.k_proj.weight": base,
        "base_model.model.m.q_proj.lora_A.default.weight": a,
        "base_model.model.m.q_proj.lora_B.default.weight": b,
    }
    state = merged_state(named, 0.5)
    assert sorted(state) == ["m.k_proj.weight", "m.q_proj.weight"] and torch.equal(state["m.k_proj.weight"], base)
    assert torch.equal(state["m.q_proj.weight"], merge(base, a, b, 0.5))


def test_an_unpaired_adapter_tensor_is_an_error():
    with pytest.raises(AssertionError, match="no m.lora_B.weight"):
        adapter_pairs({"m.lora_A.weight": torch.ones(1, 2)})
