"""Rollouts with SGLang (GPU only): ``sglang.Engine`` for generation, ``update_weights_from_tensor`` for weights.

Supported: sglang 0.4.6.post5 (pins transformers 4.51.1 and torch 2.6.0: install it in its own environment).
"""

from __future__ import annotations

from coati.distributed.config import GenerationConfig
from coati.distributed.inference import INSTALL_HINTS
from coati.distributed.inference.base import InferenceBackend
from coati.distributed.inference.engine_outputs import rollout_from_sglang
from coati.distributed.rollout import RolloutBatch


class SGLangBackend(InferenceBackend):
    OPTIONS = {
        "mem_fraction_static": "fraction of the GPU for weights and KV cache (default 0.5; lower it with colocate)",
        "dtype": "weights dtype (default: the model's)",
        "seed": "sampling seed (set per producer by the launcher)",
    }

    @classmethod
    def check_available(cls) -> None:
        cls._require("sglang", INSTALL_HINTS["sglang"])

    def __init__(self, model_path: str, generation: GenerationConfig, tensor_parallel_size: int = 1, **options):
        super().__init__(model_path, generation, **options)
        import sglang

        self.engine = sglang.Engine(
            model_path=model_path,
            tp_size=tensor_parallel_size,
            mem_fraction_static=options.get("mem_fraction_static", 0.5),
            dtype=options.get("dtype", "auto"),
            random_seed=options.get("seed", 0),
        )
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def generate(self, prompts: list[list[int]], n: int = 1, greedy: bool = False) -> RolloutBatch:
        g = self.generation
        params = {
            "temperature": 0.0 if greedy else g.temperature,
            "top_k": -1 if greedy or g.top_k == 0 else g.top_k,
            "top_p": 1.0 if greedy else g.top_p,
            "max_new_tokens": g.max_new_tokens,
            "stop": list(g.stop_strings) or None,
        }
        rows = [p for p in prompts for _ in range(n)]
        outputs = self.engine.generate(input_ids=rows, sampling_params=params, return_logprob=True)
        valid = greedy or (g.temperature == 1.0 and g.top_k == 0 and g.top_p == 1.0)
        return rollout_from_sglang(outputs, prompts, n, self.pad_id, logprobs_valid=valid)

    def load_weights(self, weights) -> None:
        for batch in self._as_batches(weights):
            self.engine.update_weights_from_tensor(named_tensors=list(batch.items()))

    def sleep(self) -> None:
        self.engine.release_memory_occupation()

    def wake(self) -> None:
        self.engine.resume_memory_occupation()
