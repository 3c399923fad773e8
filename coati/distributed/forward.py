"""Teacher-forced log-probs of a rollout under a model: what the consumer trains on and what the tests compare the
inference backends with. Takes the RolloutBatch layout (left-padded prompt, right-padded response)."""

from __future__ import annotations

import torch

from coati.distributed.algo.logprobs import logprobs_and_entropy


def model_inputs(prompt_ids, prompt_mask, response_ids, response_mask) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids of prompt + response ([N, P + R]); positions count real tokens
    only, as ``generate`` does with left padding."""
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attention = torch.cat([prompt_mask, response_mask], dim=1).long()
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids}


def trim_padding(prompt_ids, prompt_mask, response_ids, response_mask) -> dict:
    """The same rows without the columns that are padding in every row: prompt columns left of the longest prompt,
    response columns right of the longest response (at least one kept). Exact for the real tokens: positions count
    real tokens only and padded keys are masked. Works on numpy arrays and tensors alike."""
    p = int(prompt_mask.sum(-1).max()) if len(prompt_mask) else 0
    r = max(int(response_mask.sum(-1).max()) if len(response_mask) else 0, 1)
    keep = slice(prompt_ids.shape[1] - p, None)
    return {"prompt_ids": prompt_ids[:, keep], "prompt_mask": prompt_mask[:, keep],
            "response_ids": response_ids[:, :r], "response_mask": response_mask[:, :r]}  # fmt: skip


def token_budget_chunks(prompt_lens, response_lens, unit: int, budget: int, shared: bool) -> list[slice]:
    """Consecutive chunks of rows, in the given order and ``unit`` rows (a group) at a time, each as large as fits in
    ``budget`` padded tokens: rows x (longest prompt + longest response), or with ``shared`` prompts, groups x
    longest prompt + rows x longest response. A chunk holds at least one unit, whatever its size."""
    chunks, lo, n = [], 0, len(prompt_lens)
    assert n % unit == 0, (n, unit)
    while lo < n:
        hi = lo + unit
        while hi < n:
            p, r = max(prompt_lens[lo : hi + unit]), max(response_lens[lo : hi + unit])
            rows = hi + unit - lo
            cost = rows // unit * p + rows * r if shared else rows * (p + r)
            if cost > budget:
                break
            hi += unit
        chunks.append(slice(lo, hi))
        lo = hi
    return chunks


def response_logits(logits: torch.Tensor, num_response_tokens: int, vocab_size: int | None = None) -> torch.Tensor:
    """The logits [N, R, V] that predict the R response tokens, from logits over prompt + response (or its last R + 1
    positions), with tensor parallelism's vocabulary padding dropped when ``vocab_size`` is given."""
    if vocab_size is not None and logits.shape[-1] > vocab_size:
        logits = logits[..., :vocab_size]
    return logits[:, -(num_response_tokens + 1) : -1]


def sequence_logprobs(
    model, prompt_ids, prompt_mask, response_ids, response_mask, temperature: float = 1.0, with_entropy: bool = False,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(response token t | prefix) at ``temperature`` [N, R], entropy [N, R] or None).

    ``vocab_size`` drops logits of padding rows that tensor parallelism adds to the vocabulary.
    """
    inputs = model_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    r = response_ids.shape[1]
    # Logits at position j predict token j + 1: response token t is predicted at position P - 1 + t, so only the last
    # R + 1 positions need the output layer (a large share of a small model's FLOPs on long prompts).
    logits = model(**inputs, use_cache=False, logits_to_keep=r + 1).logits
    return logprobs_and_entropy(response_logits(logits, r, vocab_size), response_ids, temperature, with_entropy)


def shared_prompt_logprobs(
    model, prompt_ids, prompt_mask, response_ids, response_mask, group_size: int, temperature: float = 1.0,
    with_entropy: bool = False, vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sequence_logprobs`` for rows in groups of ``group_size`` consecutive rows sharing one prompt, computing each
    prompt once: a forward of the groups' prompts fills a KV cache, repeated ``group_size`` times, which the
    responses attend to; gradients flow back through it into the prompt forward. Equal to the full forward up to
    float rounding (tested, loss and gradients)."""
    groups = prompt_ids[::group_size], prompt_mask[::group_size]
    assert torch.equal(prompt_ids, groups[0].repeat_interleave(group_size, 0)), "rows do not form groups of one prompt"
    positions = (groups[1].long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=groups[0], attention_mask=groups[1].long(), position_ids=positions, use_cache=True,
                logits_to_keep=1)  # fmt: skip
    cache = out.past_key_values
    cache.batch_repeat_interleave(group_size)
    r = response_ids.shape[1]
    start = prompt_mask.long().sum(-1, keepdim=True)
    attention = torch.cat([prompt_mask, response_mask], dim=1).long()
    positions = start + torch.arange(r, device=start.device)
    tail = model(input_ids=response_ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                 use_cache=True).logits  # fmt: skip
    # The prompt's last position predicts response token 0; response position t predicts token t + 1.
    logits = torch.cat([out.logits[:, -1:].repeat_interleave(group_size, 0), tail], dim=1)
    return logprobs_and_entropy(response_logits(logits, r, vocab_size), response_ids, temperature, with_entropy)


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
