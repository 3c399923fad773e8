"""Log-probabilities and entropy from logits: the one place where sampling temperature meets the trainer.

The inference backends and the consumer both call ``token_logprobs`` with the same temperature, so the rollout's
log-probs and the trainer's are of the same distribution (the temperature-scaled one the tokens were drawn from).
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
