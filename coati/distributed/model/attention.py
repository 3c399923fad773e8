"""The attention of the trainer and of the transformers backend: transformers' SDPA attention, except in bf16 on a CPU
at the sizes of a training micro-batch or a decode step, where torch's fused CPU kernel is slow. There the scores are
one batched matmul into an additive mask (``baddbmm``), a softmax and a second matmul, all in bf16 with the matmuls
accumulating in fp32, as transformers' eager attention rounds them (``benchmarks/bench_attention.py`` times a
training pass's and a decode step's attention each way). The scores (and their softmax, kept for the backward) are
held whole, so calls with more than ``MAX_SCORES`` of them (about where the fused kernel catches up), fp32, CUDA,
dropout, additive float masks and masks per head all take the SDPA path.

Registered with transformers as ``NAME`` (its masks are SDPA's: boolean, True where a query attends to a key); the
consumer and the transformers backend set it on CPU models whose attention is SDPA.
"""

from __future__ import annotations

import torch

NAME = "coati_sdpa"
MAX_SCORES = 1 << 24
"""attention scores one call may hold on the bf16 path: 32 MiB per layer in bf16, the softmax of which the backward
keeps"""


def use(model, device: torch.device) -> bool:
    """Switch ``model`` (a transformers model with SDPA attention, to run on ``device``) to this attention if it runs
    on the CPU; whether it did."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa" or device.type != "cpu":
        return False
    register()
    model.set_attn_implementation(NAME)
    return True


def register() -> None:
    """Make ``NAME`` known to transformers in this process (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype SDPA would compute a call in: autocast's on the CPU (under autocast the rotary embedding leaves
    queries and keys in fp32, values in bf16), else the query's."""
    if query.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return query.dtype


def takes_bf16_path(query, key, attention_mask, dropout: float, causal: bool) -> bool:
    """Whether a call runs the bf16 matmul path rather than SDPA."""
    b, h, q_len, _ = query.shape
    return (
        query.device.type == "cpu"
        and compute_dtype(query) == torch.bfloat16
        and dropout == 0.0
        and b * h * q_len * key.shape[2] <= MAX_SCORES
        and h % key.shape[1] == 0
        and (
            attention_mask.dtype == torch.bool and attention_mask.shape[1] == 1
            if attention_mask is not None
            else not causal or q_len == key.shape[2]
        )
    )


def attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, H, Lq, D], key and value [B, Hkv, Lk, D] (Hkv dividing H),
    ``attention_mask`` boolean [B or 1, 1, Lq, Lk] or None; returns ([B, Lq, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = (
        query.shape[2] > 1
        and attention_mask is None
        and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    )
    if not takes_bf16_path(query, key, attention_mask, dropout, causal):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    b, h, q_len, d = query.shape
    kv, k_len = key.shape[1], key.shape[2]
    rep = h // kv  # query heads per key/value head: each key/value head serves its queries in one matmul
    scale = scaling if scaling is not None else d**-0.5
    dtype = torch.bfloat16
    with torch.autocast("cpu", enabled=False):  # cast once here; autocast would also cast the softmax to fp32
        q = query.to(dtype).reshape(b * kv, rep * q_len, d)
        k, v = key.to(dtype).reshape(b * kv, k_len, d), value.to(dtype).reshape(b * kv, k_len, d)
        if attention_mask is None and not causal:
            scores = torch.bmm(q, k.transpose(1, 2)).mul_(scale)
        else:
            allowed = (
                attention_mask
                if attention_mask is not None
                else torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()[None, None]
            )
            # The dtype's lowest value, not -inf: a query that may attend to nothing (a padding row) gets an even
            # spread instead of NaN, as in transformers' eager attention.
            bias = torch.zeros(allowed.shape, dtype=dtype, device=query.device)
            bias.masked_fill_(~allowed, torch.finfo(dtype).min)
            bias = bias[:, :, None].expand(b, kv, rep, q_len, k_len).reshape(b * kv, rep * q_len, k_len)
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)
        out = torch.bmm(torch.softmax(scores, -1), v)
    return out.view(b, h, q_len, d).transpose(1, 2).contiguous(), None
