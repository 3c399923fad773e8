"""Inverse-CDF sampling (``inference/sampling.py``): hand-computed draws, zero-probability tokens, and the
distribution it draws from."""

import math

import torch

from coati.distributed.inference.sampling import inverse_cdf_sample


def test_each_uniform_lands_in_its_tokens_interval():
    # p = [0.1, 0.2, 0.3, 0.4]: cumulative 0.1, 0.3, 0.6, 1.0
    logprobs = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log().repeat(6, 1)
    u = torch.tensor([0.0, 0.05, 0.15, 0.45, 0.7, 0.999])
    assert inverse_cdf_sample(logprobs, u).tolist() == [0, 0, 1, 2, 3, 3]


def test_a_token_of_probability_zero_is_never_drawn():
    # Tokens 0, 2 and 4 are excluded (-inf), including the first and the last: u at either end and at the boundary
    # between tokens 1 and 3 still draws an allowed token.
    row = torch.tensor([-math.inf, math.log(0.5), -math.inf, math.log(0.5), -math.inf])
    u = torch.tensor([0.0, 0.5, 0.9999999])
    assert inverse_cdf_sample(row.repeat(3, 1), u).tolist() == [1, 3, 3]


def test_draws_follow_the_distribution():
    """200,000 draws from a 50-token distribution: every token's frequency within 5 standard errors of its
    probability."""
    torch.manual_seed(0)
    logprobs = (torch.randn(50) * 2).log_softmax(-1)
    n = 200_000
    draws = inverse_cdf_sample(logprobs.repeat(n, 1), torch.rand(n))
    freq = torch.bincount(draws, minlength=50).double() / n
    p = logprobs.exp().double()
    se = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-9).all(), (freq - p).abs().max()
