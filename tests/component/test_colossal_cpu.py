"""HybridAdam on a machine without CUDA: its CPU update runs on torch's fused kernel (colossal_cpu shim 1) and must be
the update ColossalAI's kernels compute — AdamW (or Adam with L2) with bias correction — step after step."""

import pytest
import torch

from coati.distributed.trainer.colossal_cpu import TorchFusedCpuAdam, apply_cpu_shims

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, ColossalAI's own CPU-Adam kernel loads")


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in ((7, 5), (33,), (4, 3, 2))]


def _run(make, steps: int = 4, seed: int = 0) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(p) for p in _params(seed)]
    opt = make(params)
    g = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("adamw_mode", [True, False])
def test_hybrid_adam_matches_torch(adamw_mode):
    assert apply_cpu_shims()
    from colossalai.nn.optimizer import HybridAdam

    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
    ours = _run(lambda ps: HybridAdam(ps, adamw_mode=adamw_mode, **kw))
    reference = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    theirs = _run(lambda ps: reference(ps, foreach=False, **kw))
    start = _params(0)
    for a, b, p0 in zip(ours, theirs, start, strict=True):
        assert not torch.equal(a, p0)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_without_bias_correction_and_with_div_scale():
    """The unfused branch and the gradient divisor, against the formula written out."""
    lr, b1, b2, eps, wd, scale = 1e-2, 0.9, 0.99, 1e-8, 0.05, 4.0
    for adamw_mode in (True, False):
        p, m, v = torch.randn(50), torch.zeros(50), torch.zeros(50)
        p_ref, m_ref, v_ref = p.clone(), m.clone(), v.clone()
        op = TorchFusedCpuAdam(lr, b1, b2, eps, wd, adamw_mode)
        for step in (1, 2, 3):
            grad = torch.randn(50)
            op.step(step, lr, b1, b2, eps, wd, False, p, grad, m, v, scale)
            g = grad / scale
            if adamw_mode:
                p_ref = p_ref * (1 - lr * wd)
            else:
                g = g + wd * p_ref
            m_ref = b1 * m_ref + (1 - b1) * g
            v_ref = b2 * v_ref + (1 - b2) * g * g
            p_ref = p_ref - lr * m_ref / (v_ref.sqrt() + eps)
        torch.testing.assert_close(p, p_ref)
        torch.testing.assert_close(v, v_ref)


def test_the_fused_update_divides_the_gradients_as_it_reads_them():
    """With bias correction (torch's fused kernel) a divisor, which consumers pass to clip the gradients, gives the
    update of the divided gradients, bitwise."""
    lr, b1, b2, eps, wd, scale = 1e-2, 0.9, 0.99, 1e-8, 0.05, 3.7
    for adamw_mode in (True, False):
        p, m, v = torch.randn(50), torch.zeros(50), torch.zeros(50)
        p0, p_ref, m_ref, v_ref = p.clone(), p.clone(), m.clone(), v.clone()
        op = TorchFusedCpuAdam(lr, b1, b2, eps, wd, adamw_mode)
        for step in (1, 2, 3):
            grad = torch.randn(50)
            op.step(step, lr, b1, b2, eps, wd, True, p, grad.clone(), m, v, scale)
            op.step(step, lr, b1, b2, eps, wd, True, p_ref, grad / scale, m_ref, v_ref)
        assert not torch.equal(p, p0)
        assert torch.equal(p, p_ref) and torch.equal(m, m_ref) and torch.equal(v, v_ref)
