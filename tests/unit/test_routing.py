"""Routing replay (``model/routing.py``): the experts the transformers engine routed each token to, carried by the
record through concatenation, selection and trimming, and replayed in the trainer's forward."""

import numpy as np
import pytest
import torch

from coati.distributed.inference.config import GenerationConfig
from coati.distributed.inference.transformers_backend import TransformersBackend
from coati.distributed.model import routing
from coati.distributed.record import RolloutBatch
from coati.distributed.trainer.forward import row_tensors, sequence_logprobs
from coati.testing import build_tiny_model


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("moe") / "m", "qwen3_moe", hidden_size=64, num_heads=2))


def rollout(path, n):
    torch.manual_seed(0)
    engine = TransformersBackend(path, GenerationConfig(max_new_tokens=8, max_prompt_tokens=16), record_routing=True)
    return engine, engine.generate([[5, 6, 7, 8, 9], [10, 11, 12]], n=n)


@pytest.mark.parametrize("n", [1, 3])
def test_the_routes_an_fp32_engine_records_are_the_trainers_own_token_for_token(moe, n):
    """Same weights, fp32 on both sides: every replayed token x layer already routes as recorded, and replaying
    changes no log-prob; with n > 1 the shared prefill's routes reach each of the group's rows."""
    from transformers import AutoModelForCausalLM

    engine, batch = rollout(moe, n)
    layers = len(routing.routers(engine.model))
    assert batch.prompt_routes.shape == (*batch.prompt_ids.shape, layers, 2)
    assert batch.response_routes.shape == (*batch.response_ids.shape, layers, 2)
    assert (batch.prompt_routes[~batch.prompt_mask] == -1).all()
    last = batch.response_routes[np.arange(len(batch)), batch.response_lengths - 1]
    assert (last == -1).all()  # the last sampled token is never fed
    model = AutoModelForCausalLM.from_pretrained(moe, dtype=torch.float32)
    # Rows in another order, and trimmed to their own padding: the routes follow their columns.
    rows = np.arange(len(batch))[::-1].copy()
    t = row_tensors(batch, rows[: max(1, len(rows) // 2)], "cpu", routes=True)
    routes = t.pop("routes")
    with torch.no_grad():
        own, _ = sequence_logprobs(model, **t, temperature=1.0)
        with routing.replay(routing.routers(model), routes) as state:
            replayed, _ = sequence_logprobs(model, **t, temperature=1.0)
    fed = int((routes[..., 0, 0] >= 0).sum())
    assert state.replayed == fed * layers and state.agreed == state.replayed
    assert torch.equal(own, replayed)


def test_replayed_routes_steer_the_experts_and_the_router_still_learns(moe):
    from transformers import AutoModelForCausalLM

    _, batch = rollout(moe, 2)
    model = AutoModelForCausalLM.from_pretrained(moe, dtype=torch.float32)
    t = row_tensors(batch, np.arange(len(batch)), "cpu", routes=True)
    routes = t.pop("routes")
    other = torch.where(routes >= 0, (routes + 1) % 8, routes)  # every fed token through other experts
    own, _ = sequence_logprobs(model, **t, temperature=1.0)
    with routing.replay(routing.routers(model), other) as state:
        steered, _ = sequence_logprobs(model, **t, temperature=1.0)
    mask = t["response_mask"].bool()
    assert (own - steered)[mask].abs().max() > 1e-3
    assert state.agreed < state.replayed
    steered[mask].sum().backward()
    router = routing.routers(model)[0]
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_routes_are_padded_with_minus_one_when_batches_concatenate_and_select(moe):
    _, a = rollout(moe, 1)
    _, b = rollout(moe, 3)
    b = b.select(np.array([0, 4]))
    both = RolloutBatch.concat([a, b]).validate()
    assert both.prompt_routes.shape[:2] == both.prompt_ids.shape
    assert (both.prompt_routes[~both.prompt_mask] == -1).all()
    assert (both.response_routes[~both.response_mask] == -1).all()
    p = a.prompt_ids.shape[1]
    assert np.array_equal(both.prompt_routes[: len(a), -p:], a.prompt_routes)
    assert np.array_equal(both.response_routes[len(a) :, : b.response_ids.shape[1]], b.response_routes)


def test_replay_is_refused_for_a_dense_model_an_unknown_router_and_an_engine_that_records_none():
    from coati.distributed.inference.options import SGLangOptions, TransformersOptions
    from coati.distributed.inference.vllm_options import VLLMOptions
    from coati.distributed.model.architectures import check_routing

    check_routing({"model_type": "mixtral", "num_local_experts": 8}, "m")
    with pytest.raises(ValueError, match=r"m \(llama\) has no routed experts; turn routing_replay off"):
        check_routing({"model_type": "llama"}, "m")
    with pytest.raises(ValueError, match=r"m is a deepseek_v3 mixture of experts, whose router coati does not"):
        check_routing({"model_type": "deepseek_v3", "n_routed_experts": 64}, "m")
    TransformersOptions.check_routing(gpu=False)
    with pytest.raises(ValueError, match=r"does not report its routing here \(vLLM 0.32 captures .* needs Triton"):
        VLLMOptions.check_routing(gpu=False)
    with pytest.raises(ValueError, match=r"engine does not report its routing here \(SGLang's"):
        SGLangOptions.check_routing(gpu=True)


def test_expert_parallelism_is_refused_for_models_it_cannot_shard():
    from coati.distributed.model.architectures import check_experts

    check_experts({"model_type": "llama"}, "m", 1)
    check_experts({"model_type": "qwen3_moe", "num_experts": 8}, "m", 4)
    with pytest.raises(ValueError, match=r"ep_size=2, but m \(llama\) has no routed experts; use ep_size=1"):
        check_experts({"model_type": "llama"}, "m", 2)
    with pytest.raises(ValueError, match="deepseek_v3 mixture of experts, whose experts coati does not shard"):
        check_experts({"model_type": "deepseek_v3", "n_routed_experts": 64}, "m", 2)
    with pytest.raises(ValueError, match="ep_size=3 must divide m's 8 experts per layer"):
        check_experts({"model_type": "mixtral", "num_local_experts": 8}, "m", 3)


def test_sequence_parallelism_is_refused_for_models_it_cannot_split():
    from coati.distributed.model.architectures import check_sequence

    check_sequence({"model_type": "qwen3_moe"}, "m", 1)
    check_sequence({"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2}, "m", 2)
    with pytest.raises(ValueError, match="m is qwen3_moe, which coati's sequence parallelism does not cover"):
        check_sequence({"model_type": "qwen3_moe", "num_attention_heads": 4}, "m", 2)
    with pytest.raises(ValueError, match=r"sp_size=2 must divide m's attention heads \(4\) and key/value heads \(1\)"):
        check_sequence({"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 1}, "m", 2)
