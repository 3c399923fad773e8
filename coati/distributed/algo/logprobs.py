"""Log-probabilities and entropy from logits: the one place where sampling temperature meets the trainer.

The inference backends and the consumer both call ``token_logprobs`` with the same temperature, so the rollout's
log-probs and the trainer's are of the same distribution (the temperature-scaled one the tokens were drawn from).
``logprobs_and_entropy`` is the trainer's fused form of both: it walks the vocabulary-sized logits a block of
positions at a time, so each block's float32 copy, exponentials and sums stay in cache, and computes the log-sum-exp
once for the log-prob and the entropy.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at ``token_ids``: logits [B, T, V], token_ids [B, T] -> [B, T] float32."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    scaled = logits.float() / temperature
    picked = torch.gather(scaled, -1, token_ids.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position: [B, T, V] -> [B, T]."""
    scaled = logits.float() / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    return -(logp.exp() * logp).sum(-1)


LOGIT_BLOCK = 64
"""positions per block in ``logprobs_and_entropy`` (a float32 block of a 50k vocabulary is ~13 MB, cache-sized)"""


def logprobs_and_entropy(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    block: int = LOGIT_BLOCK,
):
    """(``token_logprobs``, ``entropy_from_logits`` of the detached logits, or None): logits [B, T, V] (any float
    dtype; computed in float32), token_ids [B, T] -> [B, T] float32 each. Equal to the two functions up to float
    rounding, gradients included (a custom backward: d log p_y / d z = (onehot_y - softmax(z / temperature)) /
    temperature, recomputed block by block instead of saving a float32 copy of the logits)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    shape = token_ids.shape
    flat, ids = logits.reshape(-1, logits.shape[-1]), token_ids.reshape(-1).long()
    logprobs, entropy = _BlockLogprobs.apply(flat, ids, float(temperature), bool(with_entropy), int(block))
    return logprobs.view(shape), (entropy.view(shape) if with_entropy else None)


class _BlockLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, temperature, with_entropy, block):
        n = logits.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else torch.empty(0, device=logits.device)
        with torch.no_grad():
            for lo in range(0, n, block):
                hi = min(lo + block, n)
                z = logits[lo:hi].to(torch.float32, copy=True)  # worked on in place
                if temperature != 1.0:
                    z.div_(temperature)
                lse[lo:hi] = torch.logsumexp(z, -1)
                logprobs[lo:hi] = z.gather(-1, ids[lo:hi, None]).squeeze(-1) - lse[lo:hi]
                if with_entropy:  # H = -sum p log p, with log p = z - lse
                    z.sub_(lse[lo:hi, None])
                    entropy[lo:hi] = -torch.linalg.vecdot(z.exp(), z)
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature, ctx.block = temperature, block
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        logits, ids, lse = ctx.saved_tensors
        t, grad = ctx.temperature, torch.empty_like(logits)
        for lo in range(0, logits.shape[0], ctx.block):
            hi = min(lo + ctx.block, logits.shape[0])
            z = logits[lo:hi].to(torch.float32, copy=True)  # worked on in place
            if t != 1.0:
                z.div_(t)
            g = grad_logprobs[lo:hi, None].float()
            z.sub_(lse[lo:hi, None]).exp_().mul_(-g)  # -g softmax(z / t)
            z.scatter_add_(-1, ids[lo:hi, None], g)
            if t != 1.0:
                z.div_(t)
            grad[lo:hi] = z
        return grad, None, None, None, None
