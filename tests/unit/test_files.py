"""Model folders read without loading them: safetensors headers, truncated files, parameter counts, and the disk a
run's checkpoints of a bf16 model take by the estimate."""

import pytest
import torch
from safetensors.torch import save_file

from coati.distributed.model.files import (
    CHECKPOINT_BYTES_PER_PARAM,
    checkpoint_bytes,
    parameter_count,
    read_safetensors_header,
    run_disk_bytes,
)


def model_bytes(folder) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def bf16_model(folder):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return model


def test_a_bf16_models_checkpoints_are_counted_as_the_fp32_masters_and_adam_states_they_are(tmp_path):
    model = bf16_model(tmp_path)
    params = sum(p.numel() for p in model.parameters())
    assert parameter_count(tmp_path) == params
    assert model_bytes(tmp_path) < 2.1 * params  # the folder holds 2 bytes a parameter ...
    # ... but each checkpoint holds 12 (fp32 masters and two fp32 moments): 6x the folder, not 3x.
    assert run_disk_bytes(tmp_path, keep_checkpoints=2) == 3 * checkpoint_bytes(params) + 4 * params
    assert checkpoint_bytes(params) >= params * CHECKPOINT_BYTES_PER_PARAM
    weights_times_three = model_bytes(tmp_path) * 3  # Adam's states counted at the folder's dtype
    assert checkpoint_bytes(params) > 1.9 * weights_times_three


def test_a_truncated_or_damaged_safetensors_file_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(64, 64), "b": torch.ones(8)}, str(path))
    assert read_safetensors_header(path).parameters == 64 * 64 + 8
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match=r"model.safetensors is truncated: its header describes \d+ bytes, the file"):
        read_safetensors_header(path)
    path.write_bytes(b"\xff" * 8 + data[8:])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_safetensors_header(path)
    path.write_bytes(data[:4])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_safetensors_header(path)
