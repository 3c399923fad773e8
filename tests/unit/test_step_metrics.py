"""Step metrics reduced by kind: token-weighted means, true maxima and minima, over micro-batches and DP ranks."""

import pytest
import torch

from coati.distributed.trainer.step_metrics import StepMetrics, metric_kind


def test_kinds():
    assert [metric_kind(k) for k in ("loss/ratio_max", "loss/ratio_min", "loss/clipfrac")] == ["max", "min", "mean"]


def test_micro_batch_extremes_are_extremes_not_weighted_averages():
    m = StepMetrics()
    for ratio_max, ratio_min, clipfrac, tokens in [(1.5, 0.9, 0.1, 10), (3.0, 0.5, 0.4, 30)]:
        m.add("loss/ratio_max", ratio_max, tokens)
        m.add("loss/ratio_min", ratio_min, tokens)
        m.add("loss/clipfrac", clipfrac, tokens)
    out = m.reduce()
    assert out["loss/ratio_max"] == 3.0 and out["loss/ratio_min"] == 0.5  # token-weighted they were 2.625 and 0.6
    assert out["loss/clipfrac"] == pytest.approx((0.1 * 10 + 0.4 * 30) / 40)


def test_data_parallel_ranks_combine_to_the_global_values():
    """Two ranks' partial sums combined the way torch.distributed.all_reduce would."""
    ranks = [StepMetrics(), StepMetrics()]
    ranks[0].add("loss/clipfrac", 0.2, 10)
    ranks[0].add("loss/ratio_max", 1.2, 10)
    ranks[0].add("loss/ratio_min", 0.7, 10)
    ranks[1].add("loss/clipfrac", 0.5, 30)
    ranks[1].add("loss/ratio_max", 2.0, 30)
    ranks[1].add("loss/ratio_min", 0.9, 30)
    captured = [[], []]

    def collect(i):
        return lambda tensor, op: captured[i].append((tensor, op))

    for i in (0, 1):  # first pass: each rank's local tensors, in the order reduce() sends them
        ranks[i].reduce(collect(i))
    combine = {"sum": lambda a, b: a + b, "max": torch.maximum, "min": torch.minimum}
    totals = [combine[op](a, b) for (a, op), (b, _) in zip(*captured, strict=True)]

    replies = iter(totals * 2)

    def fake_all_reduce(tensor, op):
        tensor.copy_(next(replies))

    outs = [r.reduce(fake_all_reduce) for r in ranks]
    assert outs[0] == outs[1]
    assert outs[0]["loss/clipfrac"] == pytest.approx((0.2 * 10 + 0.5 * 30) / 40)
    assert outs[0]["loss/ratio_max"] == 2.0 and outs[0]["loss/ratio_min"] == 0.7
