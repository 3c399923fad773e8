"""The SGLang backend's launch decisions and request conversion, without SGLang (it has no CPU build): what the
engine is asked for, when its log-probs are valid, and what a launch refuses before any actor starts. The engine calls
themselves are in tests/component/test_engines_gpu.py (GPU-marked)."""

import pytest

from coati.distributed.inference import sglang_backend
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.inference.sglang_backend import SGLangBackend, logprobs_valid, sampling_params
from coati.testing import build_tiny_model


def test_sampling_params_follow_the_generation_config():
    g = GenerationConfig(temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=12, stop_strings=("</answer>",))
    assert sampling_params(g, greedy=False) == {
        "temperature": 0.7,
        "top_k": -1,
        "top_p": 1.0,
        "max_new_tokens": 12,
        "stop": ["</answer>"],
    }
    g = GenerationConfig(temperature=1.2, top_k=5, top_p=0.9, max_new_tokens=3)
    assert sampling_params(g, greedy=False) == {
        "temperature": 1.2,
        "top_k": 5,
        "top_p": 0.9,
        "max_new_tokens": 3,
        "stop": None,
    }
    # Greedy ignores the sampling knobs (SGLang runs temperature 0 as top-k 1).
    assert sampling_params(g, greedy=True) == {
        "temperature": 0.0,
        "top_k": -1,
        "top_p": 1.0,
        "max_new_tokens": 3,
        "stop": None,
    }


@pytest.mark.parametrize(
    "temperature,top_k,top_p,valid",
    [(1.0, 0, 1.0, True), (0.7, 0, 1.0, True), (1.3, 0, 1.0, True), (1.0, 5, 1.0, False), (0.7, 0, 0.9, False)],
)
def test_logprobs_valid_only_without_truncation(temperature, top_k, top_p, valid):
    """SGLang's log-probs are temperature-scaled but not renormalised after top-k/top-p."""
    g = GenerationConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    assert logprobs_valid(g, greedy=False) is valid
    assert logprobs_valid(g, greedy=True) is True


def test_launch_refuses_cpu_producers_and_bad_options():
    with pytest.raises(ValueError, match="runs only on CUDA GPUs.*use -b vllm or -b transformers"):
        SGLangBackend.engine_options({}, processes=1, sleep=False, gpu=False)
    with pytest.raises(ValueError, match="mem_fraction_static must be in \\(0, 1\\), got 1.5"):
        SGLangBackend.engine_options({"mem_fraction_static": 1.5}, processes=1, sleep=False, gpu=True)
    with pytest.raises(ValueError, match="not known to SGLangBackend.*mem_fraction_static"):
        SGLangBackend.engine_options({"gpu_memory_utilization": 0.3}, processes=1, sleep=False, gpu=True)
    with pytest.raises(ValueError, match="not known to SGLangBackend"):
        SGLangBackend.engine_options({"enable_memory_saver": True}, processes=1, sleep=False, gpu=True)


def test_launch_options_and_engine_arguments(tmp_path):
    options = SGLangBackend.engine_options({"mem_fraction_static": 0.3}, processes=2, sleep=True, gpu=True)
    assert options == {"mem_fraction_static": 0.3, "tensor_parallel_size": 2, "enable_memory_saver": True}
    # The producer process receives every push itself: one weight-group member whatever the engine's TP size.
    assert SGLangBackend.weight_ranks(options) == 1
    path = build_tiny_model(tmp_path / "m")
    g = GenerationConfig(max_prompt_tokens=100, max_new_tokens=28)
    kwargs = SGLangBackend.engine_kwargs(str(path), {"mem_fraction_static": 0.3, "seed": 7}, 2, True, g)
    assert kwargs == {
        "model_path": str(path),
        "tp_size": 2,
        "mem_fraction_static": 0.3,
        "dtype": "float32",
        "random_seed": 7,
        "enable_memory_saver": True,
        "context_length": 128,
        "log_level": "error",
    }
    # The checkpoint's dtype, not SGLang's "auto" (which would run a float32 checkpoint in float16); a user's wins.
    assert SGLangBackend.engine_kwargs(str(path), {"dtype": "bfloat16"}, 1, False, g)["dtype"] == "bfloat16"
    assert (
        SGLangBackend.engine_kwargs(str(path), {}, 1, False, g)["mem_fraction_static"]
        == sglang_backend.DEFAULT_MEM_FRACTION
    )
