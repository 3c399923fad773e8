"""Rollouts with SGLang's offline engine (``sglang.Engine``), 0.5 API level (``sglang==0.5.23``; CUDA only).

SGLang 0.5.23 pins torch 2.14.1 and transformers 5.19.0, and vLLM 0.32 pins torch 2.13.0: SGLang goes into an
environment of its own (see docs/install.md). No CPU build exists, so launches that place producers without GPUs are
refused.

Weights: the producer process takes part in the consumers' weight group itself (one member per producer, whatever
the engine's tensor-parallel size), receives each push into GPU buckets and hands every bucket to the engine with
``Engine.update_weights_from_tensor`` (tensors cross to the engine's processes as CUDA IPC handles, not copies; every
TP rank shards with the model's own ``load_weights``). The prefix cache is flushed once per push, after the last
bucket, so no cached prefix outlives the weights it was computed with.

Rollout log-probs: SGLang returns log-probs of the temperature-scaled distribution, before top-k/top-p/min-p
renormalisation (``SGLANG_RETURN_ORIGINAL_LOGPROB``, which would drop the temperature too, is forced off). So they are
the sampling distribution's exactly when top-k and top-p are off; otherwise ``logprobs_valid`` is False.

Sleep: ``enable_memory_saver`` is set at launch when producers sleep while consumers train;
``release_memory_occupation`` frees weights and KV cache, ``resume_memory_occupation`` takes them back, and the push
that follows every wake refills the weights.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from coati.distributed.inference.base import InferenceBackend, checkpoint_dtype
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.inference.engine_outputs import rollout_from_sglang
from coati.distributed.inference.options import DEFAULT_MEM_FRACTION, SGLangOptions
from coati.distributed.record import RolloutBatch

LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def sampling_params(generation: GenerationConfig, greedy: bool) -> dict:
    """SGLang's sampling parameters for one request (greedy: temperature 0, which SGLang runs as top-k 1)."""
    g = generation
    return {
        "temperature": 0.0 if greedy else g.temperature,
        "top_k": -1 if greedy or g.top_k == 0 else g.top_k,
        "top_p": 1.0 if greedy else g.top_p,
        "max_new_tokens": g.max_new_tokens,
        "stop": list(g.stop_strings) or None,
    }


def logprobs_valid(generation: GenerationConfig, greedy: bool) -> bool:
    """Whether SGLang's returned log-probs (temperature-scaled, not top-k/top-p renormalised) are those of the
    distribution the tokens were drawn from."""
    return greedy or (generation.top_k == 0 and generation.top_p == 1.0)


class SGLangBackend(InferenceBackend, SGLangOptions):
    @staticmethod
    def engine_kwargs(
        model_path: str,
        options: Mapping,
        tensor_parallel_size: int,
        enable_memory_saver: bool,
        generation: GenerationConfig,
    ) -> dict:
        """``sglang.Engine`` keyword arguments (ServerArgs fields) for one producer's engine."""
        return {
            "model_path": model_path,
            "tp_size": tensor_parallel_size,
            "mem_fraction_static": options.get("mem_fraction_static", DEFAULT_MEM_FRACTION),
            "dtype": options.get("dtype") or checkpoint_dtype(model_path),
            "random_seed": options.get("seed", 0),
            "enable_memory_saver": enable_memory_saver,
            "context_length": generation.max_prompt_tokens + generation.max_new_tokens,
            "log_level": "error",
        }

    def __init__(
        self,
        model_path: str,
        generation: GenerationConfig,
        tensor_parallel_size: int = 1,
        enable_memory_saver: bool = False,
        **options,
    ):
        super().__init__(model_path, generation, **options)
        if not torch.cuda.is_available():
            raise RuntimeError("the sglang backend needs a CUDA GPU in the producer's process; none is visible")
        import sglang

        # Set in the environment the engine's processes inherit: the temperature-scaled log-probs, never the raw ones.
        os.environ[LOGPROB_ENV] = "0"
        self.engine = sglang.Engine(
            **self.engine_kwargs(model_path, options, tensor_parallel_size, enable_memory_saver, generation)
        )
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.device = torch.device("cuda", torch.cuda.current_device())

    def generate(self, prompts: list[list[int]], n: int = 1, greedy: bool = False) -> RolloutBatch:
        rows = [p for p in prompts for _ in range(n)]
        params = sampling_params(self.generation, greedy)
        outputs = self.engine.generate(input_ids=rows, sampling_params=params, return_logprob=True)
        return rollout_from_sglang(outputs, prompts, n, self.pad_id, logprobs_valid(self.generation, greedy))

    def load_weights(self, weights) -> None:
        """Hand each bucket to the engine (the cache is flushed once, by ``receive_weights``)."""
        for batch in self._as_batches(weights):
            self.engine.update_weights_from_tensor(named_tensors=list(batch.items()), flush_cache=False)

    def receive_weights(self, group_name: str, threads: int | None = None) -> dict:
        got = super().receive_weights(group_name, threads)
        self.engine.flush_cache()
        return got

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The engine's weights under the checkpoint's names, read back one by one with ``get_weights_by_name``
        (SGLang returns them as float32 lists; slow, for tests)."""
        from safetensors import safe_open

        shapes = {}
        for path in sorted(p for p in os.listdir(self.model_path) if p.endswith(".safetensors")):
            with safe_open(os.path.join(self.model_path, path), "pt") as f:
                shapes.update({k: f.get_slice(k).get_shape() for k in f.keys()})
        out = {}
        for name, shape in shapes.items():
            numel = int(torch.Size(shape).numel())
            out[name] = torch.tensor(self.engine.get_weights_by_name(name, truncate_size=numel)).reshape(shape)
        return out

    def sleep(self) -> None:
        self.engine.release_memory_occupation()

    def wake(self) -> None:
        self.engine.resume_memory_occupation()
