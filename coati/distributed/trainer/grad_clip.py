"""Gradient clipping for the consumer's optimizer, at the cost of one read of the gradients.

ColossalAI's plain optimizer wrapper (``HybridParallelNaiveOptimizer``: no ZeRO, no fp16/bf16 plugin precision)
measures the global gradient norm by copying every gradient to float64 (a write of twice the gradients' size, then a
norm over it), and clips by multiplying every gradient by ``max_norm / (norm + 1e-6)``, capped at 1, in a pass of its
own before Adam reads them again. With neither tensor nor pipeline parallelism (whose norms it sums over ranks) the
consumer installs two replacements on that wrapper:

- the norm: sqrt(sum_i ||g_i||^2), each gradient's squared norm the sum, in float64, of float32 norms of blocks of
  ``BLOCK`` elements (float32 accumulates well over a block; float64 across blocks and tensors). Within 1e-7
  (relative) of the float64 norm, as ColossalAI's is (it rounds its float64 sum to float32), where one float32
  norm of SmolLM2-135M's 28M-element embedding gradient is 2e-3 off; without the float64 copies of every gradient
  (``benchmarks/bench_consumer_step.py`` times a consumer's step each way).
- the clip: the same factor, applied by Adam's update as the divisor of the gradients (HybridAdam's ``div_scale``,
  which torch's fused kernel applies as it reads them) instead of a separate pass over them.
"""

from __future__ import annotations

import torch

from coati.distributed.trainer.expert_parallel import expert_grad_norm, is_expert

BLOCK = 4096
"""elements whose norm is accumulated in float32 before the float64 sum"""


def global_grad_norm(grads: list[torch.Tensor]) -> float:
    """The L2 norm of all of ``grads`` together (inf or nan when any element is), summed on their device and read
    once (on a GPU, one synchronisation for the whole norm)."""
    squares = []
    for g in grads:
        flat = g.detach().reshape(-1)
        whole = flat.numel() // BLOCK * BLOCK
        if whole:
            squares.append(torch.linalg.vector_norm(flat[:whole].view(-1, BLOCK), dim=1).double().square().sum())
        if whole < flat.numel():
            squares.append(torch.linalg.vector_norm(flat[whole:]).double().square())
    return float(torch.stack(squares).sum().sqrt()) if squares else 0.0


def clip_divisor(norm: float, max_norm: float) -> float:
    """What the gradients are divided by: ColossalAI's clip factor ``max_norm / (norm + 1e-6)`` capped at 1, inverted
    (1: no clipping)."""
    return max(1.0, (norm + 1e-6) / max_norm)


def fold_clipping(wrapper, tp_size: int, pp_size: int, ep_group=None) -> bool:
    """On ColossalAI's plain wrapper without TP or PP, measure its norm with ``global_grad_norm`` (with an EP group
    of more than one rank, over every rank's experts: ``expert_parallel.expert_grad_norm``) and leave the gradients
    unscaled (the caller passes ``clip_divisor`` of that norm to the update); whether it did. Elsewhere (ZeRO and
    mixed-precision wrappers clip their own way, TP and PP sum norms over ranks) nothing changes."""
    from colossalai.booster.plugin.hybrid_parallel_plugin import HybridParallelNaiveOptimizer

    if type(wrapper) is not HybridParallelNaiveOptimizer or tp_size > 1 or pp_size > 1:
        return False

    def norm(param_gradient_pairs, norm_type: int = 2) -> float:
        assert norm_type == 2, norm_type
        if ep_group is None or ep_group.size() == 1:
            return global_grad_norm([g for _, g in param_gradient_pairs])
        experts = [g for p, g in param_gradient_pairs if is_expert(p)]
        rest = [g for p, g in param_gradient_pairs if not is_expert(p)]
        return expert_grad_norm(rest, experts, ep_group, global_grad_norm)

    wrapper._compute_grad_norm = norm
    wrapper._clip_grad_norm = lambda total_norm: None
    return True
