"""Which dtype the trainer computes in and the engines serve: one answer for both sides, so they match."""

from __future__ import annotations

import torch


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 matmuls natively: a CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX
    (elsewhere bf16 is emulated and slower than fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_compute_dtype(requested: str, device: torch.device, weights_precision: str, tp_size: int = 1) -> str:
    """``consumer.compute_dtype`` made concrete: "auto" is bf16 autocast where the device computes bf16 natively and
    the weights are fp32, else fp32 (no autocast). Not with tensor parallelism: ColossalAI's tensor-parallel layers
    run their backward outside autocast (a bf16 gradient meets an fp32 weight), so auto is fp32 there."""
    if requested != "auto":
        return requested
    return "bf16" if weights_precision == "fp32" and tp_size == 1 and native_bf16(device) else "fp32"


def generation_dtype(compute_dtype: str, weights_precision: str, tp_size: int, device: torch.device) -> str | None:
    """The engine weights' dtype that matches the trainer: "bfloat16" (or "float16") when the trainer computes in it
    (bf16 autocast, or bf16/fp16 weights), else None (the backend's own default: the checkpoint's dtype)."""
    if weights_precision in ("bf16", "fp16"):
        return {"bf16": "bfloat16", "fp16": "float16"}[weights_precision]
    return "bfloat16" if resolve_compute_dtype(compute_dtype, device, weights_precision, tp_size) == "bf16" else None
