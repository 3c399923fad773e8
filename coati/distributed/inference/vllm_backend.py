"""Rollouts with vLLM (GPU only). Weights are updated on every vLLM worker through vLLM's public RLHF path: a worker
extension class (``vllm_worker.WeightSyncExtension``) called with ``collective_rpc``, receiving each push over the
weight group (NCCL, or gloo through host memory when colocated) from the consumer and loading it with the model's own
``load_weights`` (which handles tensor-parallel sharding).

Supported range: vllm >= 0.8.5, < 0.10 (the releases that accept transformers 4.51.x, which colossalai pins).
"""

from __future__ import annotations

from coati.distributed.config import GenerationConfig
from coati.distributed.inference import INSTALL_HINTS
from coati.distributed.inference.base import InferenceBackend
from coati.distributed.inference.engine_outputs import rollout_from_vllm
from coati.distributed.rollout import RolloutBatch

EXTENSION = "coati.distributed.inference.vllm_worker.WeightSyncExtension"


class VLLMBackend(InferenceBackend):
    OPTIONS = {
        "gpu_memory_utilization": "fraction of the GPU vLLM may take (default 0.5; lower it with colocate)",
        "enforce_eager": "no CUDA graphs (default False)",
        "enable_sleep_mode": "allow sleep()/wake() to free GPU memory between rollouts (default False)",
        "dtype": "weights dtype (default: the model's)",
        "seed": "sampling seed (set per producer by the launcher)",
    }

    @classmethod
    def check_available(cls) -> None:
        cls._require("vllm", INSTALL_HINTS["vllm"])

    def __init__(self, model_path: str, generation: GenerationConfig, tensor_parallel_size: int = 1, **options):
        super().__init__(model_path, generation, **options)
        from vllm import LLM

        self.llm = LLM(
            model=model_path,
            tensor_parallel_size=tensor_parallel_size,
            worker_extension_cls=EXTENSION,
            distributed_executor_backend="ray" if tensor_parallel_size > 1 else None,
            enable_sleep_mode=options.get("enable_sleep_mode", False),
            enforce_eager=options.get("enforce_eager", False),
            dtype=options.get("dtype", "auto"),
            gpu_memory_utilization=options.get("gpu_memory_utilization", 0.5),
            max_model_len=generation.max_prompt_tokens + generation.max_new_tokens,
            seed=options.get("seed", 0),
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _params(self, n: int, greedy: bool):
        from vllm import SamplingParams

        g = self.generation
        return SamplingParams(
            n=n,
            temperature=0.0 if greedy else g.temperature,
            top_k=-1 if greedy or g.top_k == 0 else g.top_k,
            top_p=1.0 if greedy else g.top_p,
            max_tokens=g.max_new_tokens,
            stop=list(g.stop_strings) or None,
            logprobs=0,
        )

    def generate(self, prompts: list[list[int]], n: int = 1, greedy: bool = False) -> RolloutBatch:
        from vllm import TokensPrompt

        g = self.generation
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], self._params(n, greedy))
        valid = greedy or (g.temperature == 1.0 and g.top_k == 0 and g.top_p == 1.0)
        return rollout_from_vllm(outputs, prompts, n, self.pad_id, logprobs_valid=valid)

    def join_weight_group(
        self, address: str, world_size: int, rank_offset: int, group_name: str, backend: str = "nccl"
    ) -> None:
        """Every vLLM worker joins the consumer's weight group as rank ``rank_offset + its TP rank``."""
        self.llm.collective_rpc("join_weight_group", args=(address, world_size, rank_offset, group_name, backend))

    def receive_weights(self, group_name: str) -> int:
        """Every worker receives one push on ``group_name`` and loads it bucket by bucket; returns its version."""
        versions = self.llm.collective_rpc("receive_weights", args=(group_name,))
        self.llm.reset_prefix_cache()
        return int(versions[0])

    def load_weights(self, weights) -> None:
        raise NotImplementedError(
            "vLLM weights arrive on its workers over the weight group (join_weight_group + receive_weights), "
            "not through the producer process"
        )

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake(self) -> None:
        self.llm.wake_up()
