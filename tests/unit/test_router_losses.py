"""A mixture of experts' router losses and statistics (``algo/router_losses.py``), on hand-computed numbers, and
as the trainer collects them from a real MoE's forward (``model/routing.router_stats``)."""

import math

import pytest
import torch

from coati.distributed.algo.router_losses import expert_load, load_balancing_loss, router_entropy, router_z_loss
from coati.distributed.model import routing
from coati.testing import build_tiny_model


def test_even_routing_balances_at_one_and_collapsed_routing_at_the_number_of_experts():
    # 4 experts, top-1, 4 tokens: uniform probabilities, one token per expert.
    logits = torch.zeros(4, 4)
    assert load_balancing_loss(logits, torch.tensor([[0], [1], [2], [3]])) == pytest.approx(1.0)
    assert expert_load(torch.tensor([[0], [1], [2], [3]]), 4) == pytest.approx(1.0)
    # Every token to expert 0 with all its probability there: E * 1 * 1.
    peaked = torch.tensor([[50.0, 0, 0, 0]] * 4)
    assert load_balancing_loss(peaked, torch.zeros(4, 1, dtype=torch.long)) == pytest.approx(4.0)
    assert expert_load(torch.zeros(4, 1, dtype=torch.long), 4) == pytest.approx(4.0)


def test_top_k_counts_the_tokens_that_chose_each_expert_as_transformers_does():
    # 2 tokens, 3 experts, top-2: chosen {0, 1} and {0, 2} -> shares of tokens (2, 1, 1) / 2.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]]))
    experts = torch.tensor([[0, 1], [0, 2]])
    p = torch.tensor([0.55, 0.2, 0.25])
    expected = 3 * float((torch.tensor([1.0, 0.5, 0.5]) * p).sum())
    assert load_balancing_loss(logits, experts) == pytest.approx(expected, rel=1e-6)
    assert expert_load(experts, 3) == pytest.approx(2 / (4 / 3))


def test_the_z_loss_and_entropy_are_their_formulas():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    lse = [math.log(math.e + math.e**2 + math.e**3), math.log(3)]
    assert router_z_loss(logits) == pytest.approx((lse[0] ** 2 + lse[1] ** 2) / 2, rel=1e-6)
    p = torch.softmax(logits[0], -1)
    h0 = float(-(p * p.log()).sum())
    assert router_entropy(logits) == pytest.approx((h0 + math.log(3)) / 2, rel=1e-6)


def test_router_stats_keep_real_tokens_only_and_the_balancing_loss_reaches_the_router(tmp_path):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path / "m", "mixtral", hidden_size=64, num_heads=2)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    ids = torch.randint(3, 90, (2, 6))
    real = torch.ones(2, 6, dtype=torch.bool)
    real[0, :2] = False  # left padding of the first row
    with routing.router_stats(routing.routers(model), real) as stats:
        model(input_ids=ids, attention_mask=real.long())
    assert len(stats.logits) == 2 and all(g.shape == (10, 8) for g in stats.logits)
    assert all(x.shape == (10, 2) for x in stats.experts)
    loss = load_balancing_loss(stats.logits[0], stats.experts[0])
    loss.backward()
    router = routing.routers(model)[0]
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_the_load_balancing_loss_is_transformers_own():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(0)
    logits = torch.randn(12, 8)
    experts = torch.softmax(logits, -1).topk(2, dim=-1).indices
    theirs = load_balancing_loss_func((logits,), num_experts=8, top_k=2)
    assert load_balancing_loss(logits, experts) == pytest.approx(float(theirs), rel=1e-6)
