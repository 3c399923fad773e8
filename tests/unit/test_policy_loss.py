"""Policy losses, KL estimators and DAPO shaping against hand-computed values, including clip boundaries."""

import math

import pytest
import torch

from coati.distributed.algo import (
    KL_ESTIMATORS,
    OFF_POLICY_CORRECTIONS,
    POLICY_LOSSES,
    LossInput,
    LossNorm,
    compute_policy_loss,
)
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.shaping import mask_truncated, overlong_penalty


def make_input(ratios, advantages, mask=None):
    ratios = torch.tensor([ratios], dtype=torch.float64)
    old = torch.zeros_like(ratios)
    logprobs = ratios.log().clone().requires_grad_(True)
    adv = torch.tensor([advantages], dtype=torch.float64)
    mask = torch.ones_like(ratios) if mask is None else torch.tensor([mask], dtype=torch.float64)
    return LossInput(logprobs=logprobs, old_logprobs=old, advantages=adv, mask=mask)


def test_ppo_clip_asymmetric_values_and_gradients():
    cfg = AlgorithmConfig(clip_eps_low=0.2, clip_eps_high=0.28)
    # A=+1: r=1.3 clipped at 1.28; r=0.5 unclipped (pessimistic min picks -0.5);
    # A=-1: r=1.5 unclipped (1.5 > 1.28); r=0.5 clipped at 0.8; r=1.1 inside the range.
    inp = make_input([1.3, 0.5, 1.5, 0.5, 1.1], [1.0, 1.0, -1.0, -1.0, -1.0])
    loss, metrics = POLICY_LOSSES["ppo_clip"](inp, cfg)
    assert loss[0].tolist() == pytest.approx([-1.28, -0.5, 1.5, 0.8, 1.1])
    loss.sum().backward()
    # d(-A r)/d logp = -A r where unclipped, 0 where clipped.
    assert inp.logprobs.grad[0].tolist() == pytest.approx([0.0, -0.5, 1.5, 0.0, 1.1])
    assert metrics["loss/clipfrac"].item() == pytest.approx(2 / 5)


def test_ppo_clip_exact_boundary_is_not_clipped():
    cfg = AlgorithmConfig(clip_eps_low=0.2, clip_eps_high=0.28)
    inp = make_input([1.28, 0.8], [1.0, -1.0])
    loss, metrics = POLICY_LOSSES["ppo_clip"](inp, cfg)
    assert loss[0].tolist() == pytest.approx([-1.28, 0.8])
    assert metrics["loss/clipfrac"].item() == 0


def test_dual_clip_bounds_negative_advantage_losses():
    cfg = AlgorithmConfig(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip_c=3.0)
    # A=-1, r=5: PPO loss 5 > c * |A| = 3 -> 3 with zero gradient; r=2: 2 < 3 unchanged; A=+1, r=5: untouched (-1.2).
    inp = make_input([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0])
    loss, metrics = POLICY_LOSSES["ppo_clip"](inp, cfg)
    assert loss[0].tolist() == pytest.approx([3.0, 2.0, -1.2])
    loss.sum().backward()
    assert inp.logprobs.grad[0].tolist() == pytest.approx([0.0, 2.0, 0.0])
    assert metrics["loss/dual_clipfrac"].item() == pytest.approx(1 / 3)


def test_gspo_uses_one_ratio_per_sequence():
    cfg = AlgorithmConfig(policy_loss="gspo", clip_eps_low=0.1, clip_eps_high=0.1, loss_agg_mode="seq-mean-token-mean")
    # Sequence 0: token log-ratios log 1.2 and log 0.9 -> s = exp(mean) = sqrt(1.08) = 1.03923 (inside the clip).
    # Sequence 1: token ratios 2 and 2 -> s = 2, A = +1 -> clipped at 1.1.
    ratios = torch.tensor([[1.2, 0.9], [2.0, 2.0]], dtype=torch.float64)
    logprobs = ratios.log().clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    inp = LossInput(logprobs, torch.zeros_like(ratios), adv, torch.ones_like(ratios))
    loss, _ = POLICY_LOSSES["gspo"](inp, cfg)
    s0 = math.sqrt(1.08)
    assert loss[0].tolist() == pytest.approx([-s0, -s0])
    assert loss[1].tolist() == pytest.approx([-1.1, -1.1])
    loss.mean(-1).sum().backward()
    # d(-s)/d logp_t = -s / |y| per token for the unclipped sequence; zero for the clipped one.
    assert logprobs.grad[0].tolist() == pytest.approx([-s0 / 2, -s0 / 2])
    assert logprobs.grad[1].tolist() == pytest.approx([0.0, 0.0])


def test_cispo_keeps_gradient_of_clipped_tokens():
    cfg = AlgorithmConfig(policy_loss="cispo", clip_eps_low=1.0, clip_eps_high=0.5)
    # r = 3 is clipped to weight 1.5, but the token still gets gradient -1.5 * A.
    inp = make_input([3.0, 1.2], [1.0, -2.0])
    loss, metrics = POLICY_LOSSES["cispo"](inp, cfg)
    lp = [math.log(3.0), math.log(1.2)]
    assert loss[0].tolist() == pytest.approx([-1.5 * lp[0], 1.2 * 2 * lp[1]])
    loss.sum().backward()
    assert inp.logprobs.grad[0].tolist() == pytest.approx([-1.5, 2.4])
    assert metrics["loss/clipfrac"].item() == pytest.approx(0.5)


def test_kl_estimators_hand_computed():
    lp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    # x = log(ref/pi) = log 0.5 = -0.693147
    assert KL_ESTIMATORS["k1"](lp, ref).item() == pytest.approx(0.693147, rel=1e-5)
    assert KL_ESTIMATORS["k2"](lp, ref).item() == pytest.approx(0.5 * 0.693147**2, rel=1e-5)
    assert KL_ESTIMATORS["k3"](lp, ref).item() == pytest.approx(0.5 + 0.693147 - 1, rel=1e-5)
    same = KL_ESTIMATORS["k3"](lp, lp)
    assert same.item() == 0


def test_kl_term_enters_loss_with_beta():
    cfg0 = AlgorithmConfig(beta=0.0)
    cfg1 = AlgorithmConfig(beta=0.5, kl_estimator="k1")
    inp = make_input([1.0, 1.0], [0.0, 0.0])
    inp.ref_logprobs = torch.tensor([[-1.0, -3.0]], dtype=torch.float64)
    norm = LossNorm.from_mask(inp.mask, max_response_len=2)
    loss0, _ = compute_policy_loss(inp, cfg0, norm)
    loss1, metrics = compute_policy_loss(inp, cfg1, norm)
    # logp = 0, k1 = 0 - ref = [1, 3], token-mean = 2, times beta 0.5 = 1
    assert loss0.item() == pytest.approx(0.0)
    assert loss1.item() == pytest.approx(1.0)
    assert metrics["loss/kl"].item() == pytest.approx(2.0)


def test_beta_without_reference_is_an_error():
    inp = make_input([1.0], [1.0])
    with pytest.raises(ValueError, match="beta=0.1 > 0 needs ref_logprobs"):
        compute_policy_loss(inp, AlgorithmConfig(beta=0.1), LossNorm.from_mask(inp.mask, 1))


def test_truncated_importance_sampling_weights_and_gap_metric():
    cfg = AlgorithmConfig(tis_cap=2.0, clip_eps_high=10.0, clip_eps_low=0.9)
    inp = make_input([1.0, 1.0], [1.0, 1.0])
    # old logp = 0; rollout logp log(1/3) -> weight exp(log 3) = 3 capped at 2; log(2/3)... use 0.5 -> weight 2 -> 2
    inp.rollout_logprobs = torch.tensor([[math.log(1 / 3), math.log(0.8)]], dtype=torch.float64)
    loss, metrics = compute_policy_loss(inp, cfg, LossNorm.from_mask(inp.mask, 2))
    # token losses -1 * [2, 1.25] -> mean -1.625
    assert loss.item() == pytest.approx(-1.625)
    assert metrics["rollout/logprob_gap_abs"].item() == pytest.approx((math.log(3) + math.log(1.25)) / 2)


def test_overlong_penalty_ramp():
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    # L=10, C=4: free up to 6, then (6 - |y|)/4, -1 at and beyond the budget.
    assert overlong_penalty(lengths, 10, 4).tolist() == pytest.approx([0, 0, -0.25, -0.5, -1.0, -1.0])
    assert overlong_penalty(lengths, 10, 4, factor=0.5).tolist() == pytest.approx([0, 0, -0.125, -0.25, -0.5, -0.5])
    assert overlong_penalty(lengths, 10, 0).tolist() == [0.0] * 6


def test_mask_truncated_zeroes_whole_rows():
    mask = torch.ones(3, 4)
    out = mask_truncated(mask, torch.tensor([False, True, False]))
    assert out.sum(-1).tolist() == [4, 0, 4]


@pytest.mark.parametrize("name,dual", [("ppo_clip", None), ("ppo_clip", 3.0), ("gspo", None), ("cispo", None)])
def test_extreme_log_ratios_give_finite_losses_and_gradients(name, dual):
    """A log-ratio of 100 on a negative advantage made the loss inf (NaN under dual clip); the log-ratio is clamped
    to +-20 first."""
    cfg = AlgorithmConfig(policy_loss=name, dual_clip_c=dual)
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float32, requires_grad=True)
    old = torch.tensor([[-101.0, -2.0, 99.5]])  # log-ratios 100, 0, -100
    inp = LossInput(logprobs=logprobs, old_logprobs=old, advantages=torch.full((1, 3), -1.0), mask=torch.ones(1, 3))
    loss, metrics = POLICY_LOSSES[name](inp, cfg)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logprobs.grad).all()
    assert all(torch.isfinite(v).all() for v in metrics.values()), metrics
    if name == "ppo_clip" and dual is None:
        assert loss[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)  # -A * e^20 at the bound


def test_k3_is_finite_for_extreme_log_ratios():
    lp = torch.tensor([-101.0, -1.0])
    ref = torch.tensor([-1.0, -101.0])  # x = +100 and -100
    k3 = KL_ESTIMATORS["k3"](lp, ref)
    assert torch.isfinite(k3).all()
    assert k3.tolist() == pytest.approx([math.expm1(20.0) - 20.0, math.expm1(-20.0) + 20.0], rel=1e-5)


RHO = [3.0, 1.25, 0.25]  # pi_prox / mu per token: old log-probs 0, engine log-probs -log(rho)


def correction_input(rhos):
    old = torch.zeros(len(rhos), 3, dtype=torch.float64)
    rollout = -torch.tensor(rhos, dtype=torch.float64).log()
    return old, rollout, torch.ones_like(old)


@pytest.mark.parametrize(
    "name,weights,corrected",
    [
        ("none", [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], 0.0),
        ("tis", [[2.0, 1.25, 0.25], [2.0, 2.0, 2.0]], 4 / 6),  # truncated at tis_cap = 2
        ("icepop", [[0.0, 1.25, 0.0], [0.0, 0.0, 0.0]], 5 / 6),  # kept only inside [0.5, 2]
        # Row 0: geometric mean (3 * 1.25 * 0.25)^(1/3) = 0.979, kept and truncated; row 1: 3, dropped whole.
        ("seq_mask", [[2.0, 1.25, 0.25], [0.0, 0.0, 0.0]], 4 / 6),
    ],
)
def test_off_policy_corrections_hand_computed(name, weights, corrected):
    cfg = AlgorithmConfig(off_policy_correction=name)
    old, rollout, mask = correction_input([RHO, [3.0, 3.0, 3.0]])
    weight, metrics = OFF_POLICY_CORRECTIONS[name](old, rollout, mask, cfg)
    assert weight.tolist() == [pytest.approx(w) for w in weights]
    assert metrics["loss/is_ratio_max"].item() == pytest.approx(3.0)
    assert metrics["loss/is_corrected_frac"].item() == pytest.approx(corrected)
    assert metrics["loss/is_weight_max"].item() == pytest.approx(max(max(w) for w in weights))


def test_decoupled_objective_clips_against_the_proximal_policy_and_weights_by_the_behaviour_ratio():
    """A stale token: the engine (mu) gave it p = 0.25, the weights the step starts from (pi_prox) p = 0.5, and pi_theta
    moved to 0.6. The clip sees pi_theta / pi_prox = 1.2 (inside 0.8..1.28); the weight is pi_prox / mu = 2."""
    cfg = AlgorithmConfig(clip_eps_low=0.2, clip_eps_high=0.28, off_policy_correction="tis", tis_cap=4.0)
    logprobs = torch.tensor([[math.log(0.6)]], dtype=torch.float64, requires_grad=True)
    inp = LossInput(
        logprobs=logprobs,
        old_logprobs=torch.tensor([[math.log(0.5)]], dtype=torch.float64),
        advantages=torch.ones(1, 1, dtype=torch.float64),
        mask=torch.ones(1, 1, dtype=torch.float64),
        rollout_logprobs=torch.tensor([[math.log(0.25)]], dtype=torch.float64),
    )
    loss, metrics = compute_policy_loss(inp, cfg, LossNorm.from_mask(inp.mask, 1))
    assert loss.item() == pytest.approx(-1.2 * 2.0)
    assert metrics["loss/clipfrac"].item() == 0 and metrics["loss/is_weight_mean"].item() == pytest.approx(2.0)
