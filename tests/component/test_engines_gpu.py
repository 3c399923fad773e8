"""vLLM and SGLang engine calls (GPU only): run with `pytest -m gpu` on a machine with CUDA and the engine."""

import pytest
import torch

from coati.distributed.inference.config import GenerationConfig
from coati.testing import build_tiny_model

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
        pushed = {k: torch.randn_like(v) * 0.02 for k, v in state.items()}
        pushed["lm_head.weight"] = torch.zeros_like(state["lm_head.weight"])
        backend.load_weights([{k: v.cuda() for k, v in pushed.items()}])
        back = backend.state_dict()
        assert all(torch.equal(back[k], pushed[k]) for k in back), "engine weights differ from the pushed ones"
        greedy = backend.generate([[5, 6, 7]], greedy=True)
        assert (greedy.response_ids[0, : greedy.response_lengths[0]] == 0).all()
        truncated = backend_class(name)(str(path), GenerationConfig(max_new_tokens=8, temperature=1.0, top_k=5))
        assert not truncated.generate([[5, 6, 7]], n=2).extras["logprobs_valid"].any()
