"""On-policy distillation's signal: the student samples, a teacher scores the very tokens it sampled, and the
per-token reverse KL is the advantage (Agarwal et al. 2024, GKD with on-policy data; Lu et al. 2025, "On-Policy
Distillation"). Pure: the teacher's log-probs come with the batch (``RolloutBatch.teacher_logprobs``).

- ``distill_advantages``: A_t = coef * (log pi_T(y_t) - log pi_S(y_t)) = -coef * k1 KL_t(pi_S || pi_T), y_t ~ pi_S
- ``teacher_metrics``: the KL per token and the share of tokens the teacher would itself have picked

Unlike a KL penalty to a reference (``kl_reward``), the teacher's term is the training signal itself: with
``advantage_estimator="none"`` (OPD) it is the whole advantage, beside a verifiable reward's estimator a term added
to its advantages (``distill_coef``). The policy loss, its clip and the off-policy correction are unchanged.
"""

from __future__ import annotations

import torch

from coati.distributed.algo.kl import KL_LOG_RATIO_BOUND


@torch.no_grad()
def distill_advantages(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor, coef: float
) -> torch.Tensor:
    """[B, T] float32: coef * (teacher - student) on the valid tokens, the log-ratio clamped to +-20 (a token the
    teacher all but rules out gives a large finite push down, not -inf); the student's log-probs are those that
    sampled the tokens (the engine's, at the sampling temperature, as the teacher's)."""
    ratio = (teacher_logprobs.double() - student_logprobs.double()).clamp(-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND)
    return (coef * ratio * mask.double()).float()


@torch.no_grad()
def teacher_metrics(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, top1: torch.Tensor, mask: torch.Tensor
) -> dict:
    """``teacher/kl``: mean over valid tokens of log pi_S - log pi_T (k1 of the reverse KL, per token);
    ``teacher/top1_match``: the share of valid tokens that are the teacher's own argmax."""
    m = mask.double()
    n = m.sum()
    if n == 0:
        return {"teacher/kl": float("nan"), "teacher/top1_match": float("nan")}
    kl = ((student_logprobs.double() - teacher_logprobs.double()) * m).sum() / n
    return {"teacher/kl": float(kl), "teacher/top1_match": float((top1.double() * m).sum() / n)}
