"""The trainer's fused log-prob and entropy against the plain formulas: values, gradients, temperatures, blocks that do
not divide the positions, float32 and bfloat16 logits; and a case by hand."""

import math

import pytest
import torch

from coati.distributed.algo.logprobs import entropy_from_logits, logprobs_and_entropy, token_logprobs


def test_by_hand():
    z = torch.tensor([[[0.0, math.log(3.0)]]])  # softmax (1/4, 3/4)
    lp, ent = logprobs_and_entropy(z, torch.tensor([[1]]), with_entropy=True)
    assert lp.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_the_plain_formulas_with_gradients(dtype, temperature):
    torch.manual_seed(0)
    z = (torch.randn(3, 37, 500) * 3).to(dtype)
    ids, weights = torch.randint(0, 500, (3, 37)), torch.randn(3, 37)
    plain_z, fused_z = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    plain = token_logprobs(plain_z, ids, temperature)
    (plain * weights).sum().backward()
    fused, entropy = logprobs_and_entropy(fused_z, ids, temperature, with_entropy=True, block=16)  # 111 = 6 x 16 + 15
    (fused * weights).sum().backward()
    assert fused.dtype == torch.float32 and torch.allclose(fused, plain, atol=1e-5)
    assert torch.allclose(entropy, entropy_from_logits(z, temperature), atol=1e-5)
    assert fused_z.grad.dtype == dtype and torch.allclose(fused_z.grad.float(), plain_z.grad.float(), atol=1e-5)
    assert torch.equal(fused_z.detach(), z)  # the logits are left as they were
    assert logprobs_and_entropy(z, ids, temperature)[1] is None
    with pytest.raises(ValueError, match="temperature must be > 0"):
        logprobs_and_entropy(z, ids, 0.0)
