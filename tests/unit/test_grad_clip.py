"""The consumer's gradient clipping (grad_clip.py): the blocked norm against the float64 norm, and the divisor against
ColossalAI's clip factor. That a consumer's step with it equals ColossalAI's own clipping is checked in
tests/e2e/test_training_options.py."""

import math

import pytest
import torch

from coati.distributed.trainer.grad_clip import BLOCK, clip_divisor, global_grad_norm


def grads(seed=0):
    g = torch.Generator().manual_seed(seed)
    # one many blocks long, one a block and a tail, one shorter than a block, one empty; magnitudes far apart
    shapes = [(300, 4 * BLOCK // 3), (BLOCK + 17,), (5, 7), (0,)]
    return [torch.randn(s, generator=g) * scale for s, scale in zip(shapes, (1e-3, 2.0, 30.0, 1.0), strict=True)]


def test_the_norm_is_the_float64_norm():
    gs = grads()
    exact = math.sqrt(sum(float(g.double().square().sum()) for g in gs))
    assert global_grad_norm(gs) == pytest.approx(exact, rel=1e-7)  # each block's float32 norm rounds to ~6e-8
    assert global_grad_norm(gs[:1]) == pytest.approx(float(gs[0].double().norm()), rel=1e-7)
    assert global_grad_norm([torch.zeros(3)]) == 0.0 and global_grad_norm([]) == 0.0


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_non_finite_gradient_gives_a_non_finite_norm(bad):
    gs = grads()
    gs[0][7, 3] = bad
    assert not math.isfinite(global_grad_norm(gs))


def test_the_divisor_inverts_colossalais_clip_factor():
    for norm, max_norm in [(5.0, 1.0), (1e-3, 1.0), (1.0, 1.0), (250.0, 0.5)]:
        factor = min(1.0, max_norm / (norm + 1e-6))  # what ColossalAI multiplies the gradients by
        assert clip_divisor(norm, max_norm) == pytest.approx(1 / factor, rel=1e-12)
    assert clip_divisor(1e-3, 1.0) == 1.0
