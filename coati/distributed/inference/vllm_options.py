"""vLLM's inference options, the checks the driver runs on them (``VLLMOptions``, without importing vLLM) and the
engine arguments they become (``engine_kwargs``); the engine is ``vllm_backend.VLLMBackend``. The CPU settings follow
the actor, not the user (see ``vllm_backend``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.util import find_spec

from coati.distributed.inference.hints import INSTALL_HINTS
from coati.distributed.inference.options import BackendOptions
from coati.distributed.model.architectures import expert_width, head_size, is_vision_language

CPU_KV_CACHE_GIB = 1.0
CPU_BLOCK_SIZE = 32
"""tokens per KV-cache block on CPU, the unit its prefix cache shares: the smallest the CPU attention takes. The CPU
build's own default (128) is longer than short prompts, so a group's samples shared none of their prompt
(``benchmarks/bench_rollout.py`` measures both sizes on the default job's prompts)"""
SAMPLERS = ("inverse_cdf", "vllm")
CPU_ENV = {
    # The engine core runs in this process: collective_rpc reaches the worker directly and no process is spawned.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # Ray does not pin actors to cores; vLLM's automatic binding would put every engine of a node on its last core.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


CPU_EXPERT_ALIGN = 32
"""vLLM 0.32's CPU MoE kernel pads an expert's intermediate size to a multiple of this; a push is repacked for it
(``vllm_worker.repack_experts``) only unpadded, so a model with other widths is refused (``check_model``)"""
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""head sizes vLLM 0.32's CPU attention computes (``CPUAttentionBackend.get_supported_head_sizes``; a test checks
this list against the installed engine's)"""


WITHOUT_TORCHVISION = frozenset({"idefics3", "smolvlm", "paligemma"})
"""vision-language families whose vLLM 0.32 module imports without torchvision (LLaVA's, Gemma 3's and Qwen-VL's
import transformers image processors built on it)"""


class VLLMOptions(BackendOptions):
    """vLLM's options and the checks the driver runs on them before any actor starts (no vLLM import); the engine
    itself is ``vllm_backend.VLLMBackend``."""

    ENGINE = "coati.distributed.inference.vllm_backend:VLLMBackend"

    OPTIONS = {
        "gpu_memory_utilization": "GPU: fraction of the GPU vLLM may take (default 0.5; lower it with colocate)",
        "kv_cache_gib": f"KV-cache size in GiB (default on CPU {CPU_KV_CACHE_GIB:g}; on GPU what "
        "gpu_memory_utilization leaves)",
        "enforce_eager": "no CUDA graphs or compilation (default False on GPU; always True on CPU)",
        "dtype": "weights dtype, e.g. bfloat16 (default: the checkpoint's, as the trainer loads it; vLLM's own 'auto' "
        "would run a float32 checkpoint in bfloat16)",
        "block_size": f"tokens per KV-cache block, the unit the prefix cache shares among a group's samples (default "
        f"on CPU {CPU_BLOCK_SIZE}, the smallest its attention takes, and it needs a multiple of that; on GPU vLLM's)",
        "seed": "sampling seed (set per producer by the launcher)",
        "sampler": "how rows sampled at plain temperature (no top-k/top-p) draw their tokens: 'inverse_cdf' (one "
        "uniform number per row over the log-probs the engine computes anyway; default on CPU, where it is faster) or "
        "'vllm' (vLLM's own Gumbel-max kernel; default on GPU)",
        "lora_merge": "with LoRA, merge each pushed adapter into the engine's weights (from a kept base copy) "
        "instead of serving it as a vLLM LoRA adapter (default True on CPU, where vLLM's LoRA kernels made "
        "generation ~8x slower; False on GPU)",
    }

    IN_FLIGHT_UPDATES = True
    LORA = True
    STREAMS = True
    IMAGES = True

    @classmethod
    def check_available(cls) -> None:
        cls._require("vllm", INSTALL_HINTS["vllm"])

    @classmethod
    def check_options(cls, options: Mapping) -> None:
        super().check_options(options)
        kv = options.get("kv_cache_gib")
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, (int, float)) or kv <= 0):
            raise ValueError(f"inference option kv_cache_gib must be a positive number of GiB, got {kv!r}")
        block = options.get("block_size")
        if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block <= 0 or block % 16):
            raise ValueError(f"inference option block_size must be a positive multiple of 16 tokens, got {block!r}")
        sampler = options.get("sampler")
        if sampler is not None and sampler not in SAMPLERS:
            raise ValueError(f"inference option sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
        fraction = options.get("gpu_memory_utilization")
        if fraction is not None and not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ValueError(f"inference option gpu_memory_utilization must be in (0, 1], got {fraction!r}")

    @classmethod
    def check_model(cls, config: dict, where: str, options: Mapping, gpu: bool) -> None:

        family = config.get("model_type")
        if is_vision_language(config) and family not in WITHOUT_TORCHVISION and not find_spec("torchvision"):
            raise ValueError(
                f"{where} is a {family} vision-language model, whose vLLM module needs torchvision, which is not "
                f"installed (vLLM serves {', '.join(sorted(WITHOUT_TORCHVISION))} without it); use the transformers "
                "backend (-b transformers), or install a torchvision built for this torch"
            )
        size = head_size(config)
        if not gpu and size is not None and size not in CPU_HEAD_SIZES:
            raise ValueError(
                f"{where} has attention heads of size {size}, which vLLM's CPU attention does not "
                f"support (it does {', '.join(map(str, CPU_HEAD_SIZES))}); use the transformers backend "
                "(-b transformers) on this machine"
            )
        if config.get("model_type") == "olmoe" and config.get("norm_topk_prob"):
            raise ValueError(
                f"{where} is an OLMoE with norm_topk_prob=true, which vLLM's OLMoE ignores (it always routes with "
                "the unnormalised top-k weights); use the transformers backend (-b transformers)"
            )
        width = expert_width(config)
        if not gpu and width is not None and width % CPU_EXPERT_ALIGN:
            raise ValueError(
                f"{where}'s experts are {width} wide, which vLLM's CPU MoE kernel pads to a multiple of "
                f"{CPU_EXPERT_ALIGN}, and pushes are repacked for it only unpadded; use the transformers backend "
                "(-b transformers) on this machine"
            )

    @classmethod
    def cannot_route(cls, gpu: bool) -> str:
        return (
            "vLLM 0.32 captures routed experts only in its V2 model runner, which needs Triton, so not on a CPU"
            if not gpu
            else "vLLM's routed-experts capture (its V2 model runner) is not wired into coati's records yet"
        )

    @classmethod
    def check_processes(cls, processes: int, gpu: bool) -> None:
        if not gpu and processes != 1:
            raise ValueError(
                f"num_proc_per_producer={processes}: on CPU each producer runs one single-threaded vLLM engine; use "
                f"num_proc_per_producer=1 and more producers instead"
            )

    @classmethod
    def engine_options(cls, options: Mapping, *, gpu: bool, **launch) -> dict:
        options = super().engine_options(options, gpu=gpu, **launch)
        block = options.get("block_size")
        if not gpu and block is not None and block % CPU_BLOCK_SIZE:
            raise ValueError(
                f"inference option block_size={block}: vLLM's CPU attention takes multiples of "
                f"{CPU_BLOCK_SIZE} tokens; use {CPU_BLOCK_SIZE * max(1, round(block / CPU_BLOCK_SIZE))}"
            )
        return options

    @classmethod
    def launch_options(cls, options: Mapping, processes: int, sleep: bool) -> dict:
        return {**options, "tensor_parallel_size": processes, "enable_sleep_mode": sleep}

    @classmethod
    def cannot_sleep(cls, options: Mapping, gpu: bool) -> str | None:
        return None if gpu else "vLLM's CPU worker has no sleep mode (it ignores sleep and keeps its memory)"

    @classmethod
    def weight_ranks(cls, options: Mapping) -> int:
        return int(options.get("tensor_parallel_size", 1))


def engine_kwargs(
    options: Mapping, cuda: bool, tensor_parallel_size: int, sleep: bool, in_flight: bool, lora_rank: int = 0
) -> dict:
    """``vllm.LLM``'s engine arguments for these options on this device (a CPU's set here, whatever the options say);
    ``lora_rank``: serve LoRA adapters of that rank, one at a time, replaced by each push (0: none)."""
    engine: dict = {}
    if lora_rank:
        import typing

        from vllm.config.lora import MaxLoRARanks

        max_rank = min(r for r in typing.get_args(MaxLoRARanks) if r >= lora_rank)
        engine.update(enable_lora=True, max_loras=1, max_lora_rank=max_rank)
    if in_flight:
        # Steps driven from this process, one at a time, so a push lands between two of them.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        engine["async_scheduling"] = False
    if cuda:
        engine["gpu_memory_utilization"] = options.get("gpu_memory_utilization", 0.5)
        engine["enforce_eager"] = options.get("enforce_eager", False)
        engine["enable_sleep_mode"] = sleep
        if tensor_parallel_size > 1:
            engine["distributed_executor_backend"] = "ray"
    else:
        os.environ.update(CPU_ENV)
        engine["enforce_eager"] = True
    kv = options.get("kv_cache_gib", None if cuda else CPU_KV_CACHE_GIB)
    if kv is not None:
        engine["kv_cache_memory_bytes"] = int(kv * 2**30)
    block = options.get("block_size", None if cuda else CPU_BLOCK_SIZE)
    if block is not None:
        engine["block_size"] = block
    return engine
