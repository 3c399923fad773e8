"""vLLM and SGLang engine calls (GPU only): run with `pytest -m gpu` on a machine with CUDA and the engine."""

import pytest
import torch

from coati.distributed.config import GenerationConfig
from coati.models import build_tiny_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_engine_generate_and_load_weights(tmp_path, name):
    pytest.importorskip(name)
    from coati.distributed.inference import backend_class

    path = build_tiny_model(tmp_path / "m", hidden_size=64, num_heads=4)
    backend = backend_class(name)(str(path), GenerationConfig(max_new_tokens=8, temperature=1.0))
    batch = backend.generate([[5, 6, 7], [8]], n=2)
    assert len(batch) == 4 and batch.extras["logprobs_valid"].all()
    assert (batch.rollout_logprobs[batch.response_mask] < 0).all()
    if name == "sglang":
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_pretrained(path).state_dict()
        backend.load_weights({k: torch.zeros_like(v).cuda() for k, v in state.items() if "lm_head" in k})
        greedy = backend.generate([[5, 6, 7]], greedy=True)
        assert (greedy.response_ids[0, : greedy.response_lengths[0]] == 0).all()
