"""GAE and REINFORCE++ against a plain Python recursion in float64, on masked and ragged rows; the KL penalty in the
reward, its adaptive controller, the running reward statistics and the critic's value loss, by hand."""

import math
import random

import pytest
import torch

from coati.distributed.algo import ADVANTAGE_ESTIMATORS
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.kl_reward import KLController, RunningMoments, kl_penalty
from coati.distributed.algo.value_loss import explained_variance, value_loss


def close(tensor, expected, tol=1e-6) -> bool:
    return torch.allclose(tensor.double(), torch.tensor(expected, dtype=torch.float64), atol=tol, rtol=0)


def reference_gae(rewards, values, masks, token_rewards, gamma, lam):
    """Per row: the valid positions in order, r on them (the reward on the last), the textbook backward recursion."""
    advs, rets = [], []
    for reward, v_row, m_row, tr_row in zip(rewards, values, masks, token_rewards, strict=True):
        steps = [t for t, m in enumerate(m_row) if m]
        adv = [0.0] * len(m_row)
        last = 0.0
        for j in reversed(range(len(steps))):
            t = steps[j]
            r = tr_row[t] + (reward if j == len(steps) - 1 else 0.0)
            v_next = v_row[steps[j + 1]] if j + 1 < len(steps) else 0.0
            delta = r + gamma * v_next - v_row[t]
            last = delta + gamma * lam * last
            adv[t] = last
        advs.append(adv)
        rets.append([a + (v if m else 0.0) if m else 0.0 for a, v, m in zip(adv, v_row, m_row, strict=True)])
    return advs, rets


def whiten_reference(rows, masks, eps):
    flat = [x for row, m_row in zip(rows, masks, strict=True) for x, m in zip(row, m_row, strict=True) if m]
    mu = sum(flat) / len(flat)
    var = sum((x - mu) ** 2 for x in flat) / (len(flat) - 1)
    return [
        [(x - mu) / math.sqrt(var + eps) if m else 0.0 for x, m in zip(row, m_row, strict=True)]
        for row, m_row in zip(rows, masks, strict=True)
    ]


def ragged_batch(seed=0, rows=5, width=6):
    rng = random.Random(seed)
    masks = []
    for i in range(rows):
        n = [width, 1, 3, 0, 4][i % 5]
        row = [1.0 if t < n else 0.0 for t in range(width)]
        if i == 0:
            row[2] = row[3] = 0.0  # an environment's tokens inside an episode: skipped, not steps
        masks.append(row)
    rewards = [rng.uniform(-1, 2) for _ in range(rows)]
    values = [[rng.uniform(-1, 1) if m else 0.0 for m in row] for row in masks]
    token_rewards = [[rng.uniform(-0.1, 0.1) if m else 0.0 for m in row] for row in masks]
    return rewards, values, masks, token_rewards


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.0), (1.0, 1.0), (0.9, 0.95), (0.7, 0.5)])
def test_gae_matches_the_recursion_on_masked_ragged_rows(gamma, lam):
    rewards, values, masks, token_rewards = ragged_batch()
    cfg = AlgorithmConfig(advantage_estimator="gae", gamma=gamma, lam=lam)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    out = ADVANTAGE_ESTIMATORS["gae"](
        t(rewards), torch.zeros(len(rewards)), t(masks), cfg, values=t(values), token_rewards=t(token_rewards)
    )
    advs, rets = reference_gae(rewards, values, masks, token_rewards, gamma, lam)
    assert close(out.returns, rets)
    assert close(out.advantages, whiten_reference(advs, masks, cfg.adv_eps), 1e-5)


def test_gae_lambda_one_returns_are_the_discounted_reward_to_go_and_lambda_zero_is_one_step_td():
    rewards, values, masks, _ = ragged_batch(seed=3)
    zeros = [[0.0] * len(m) for m in masks]
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    mc = AlgorithmConfig(advantage_estimator="gae", gamma=0.9, lam=0.3, critic_lam=1.0)
    out = ADVANTAGE_ESTIMATORS["gae"](t(rewards), torch.zeros(5), t(masks), mc, values=t(values))
    row = [t_ for t_, m in enumerate(masks[0]) if m]  # 0, 1, 4, 5
    expected = [rewards[0] * 0.9 ** (len(row) - 1 - j) for j in range(len(row))]
    assert out.returns[0, row].tolist() == pytest.approx(expected, abs=1e-6)  # critic_lam 1: V cancels
    td = AlgorithmConfig(advantage_estimator="gae", gamma=0.9, lam=0.0)
    one_step = ADVANTAGE_ESTIMATORS["gae"](t(rewards), torch.zeros(5), t(masks), td, values=t(values))
    _, rets = reference_gae(rewards, values, masks, zeros, 0.9, 0.0)
    v_next = [values[0][1], values[0][4], values[0][5], 0.0]
    assert one_step.returns[0, row].tolist() == pytest.approx(
        [(rewards[0] if j == 3 else 0.0) + 0.9 * v_next[j] for j in range(4)], abs=1e-6
    )
    assert close(one_step.returns, rets)


def test_an_empty_row_gets_nothing_and_policy_and_critic_lambdas_are_apart():
    rewards, values, masks, _ = ragged_batch()
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    same = AlgorithmConfig(advantage_estimator="gae", lam=0.5)
    apart = AlgorithmConfig(advantage_estimator="gae", lam=0.5, critic_lam=1.0)
    a = ADVANTAGE_ESTIMATORS["gae"](t(rewards), torch.zeros(5), t(masks), same, values=t(values))
    b = ADVANTAGE_ESTIMATORS["gae"](t(rewards), torch.zeros(5), t(masks), apart, values=t(values))
    assert torch.all(a.advantages[3] == 0) and torch.all(a.returns[3] == 0)  # row 3 has no valid token
    assert torch.equal(a.advantages, b.advantages)  # the policy's lambda alone decides its advantages
    assert not torch.allclose(a.returns, b.returns)


def test_reinforce_pp_whitens_discounted_returns():
    rewards, _, masks, token_rewards = ragged_batch(seed=1)
    cfg = AlgorithmConfig(advantage_estimator="reinforce_pp", gamma=0.8)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    out = ADVANTAGE_ESTIMATORS["reinforce_pp"](
        t(rewards), torch.zeros(5), t(masks), cfg, token_rewards=t(token_rewards)
    )
    zero_v = [[0.0] * len(m) for m in masks]
    _, returns = reference_gae(rewards, zero_v, masks, token_rewards, 0.8, 1.0)  # lam 1, V 0: the return
    assert close(out.advantages, whiten_reference(returns, masks, cfg.adv_eps), 1e-5)
    assert out.returns is None


def test_kl_in_the_reward_is_refused_for_a_group_baseline():
    with pytest.raises(ValueError, match="init_kl_coef=0.01 puts the KL in per-token rewards"):
        AlgorithmConfig(advantage_estimator="grpo", init_kl_coef=0.01)
    with pytest.raises(ValueError, match="freeze_actor_steps=2 warms up a critic"):
        AlgorithmConfig(advantage_estimator="grpo", freeze_actor_steps=2)


def test_kl_penalty_is_minus_coef_times_k1_on_valid_tokens():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    rewards, per_completion = kl_penalty(old, ref, mask, 0.1, "k1")
    assert close(rewards, [[-0.05, 0.1, 0.0]])
    assert per_completion.tolist() == pytest.approx([0.5 - 1.0])


def test_adaptive_controller_moves_by_the_clipped_error():
    fixed = KLController(0.1)
    fixed.update(5.0, 64)
    assert fixed.value == 0.1
    c = KLController(0.1, target=1.0, horizon=100)
    c.update(1.1, 50)  # error 0.1 -> x (1 + 0.1 * 0.5)
    assert c.value == pytest.approx(0.105)
    c.update(10.0, 100)  # error clipped to 0.2
    assert c.value == pytest.approx(0.105 * 1.2)
    c.update(0.0, 100)  # error -1 clipped to -0.2
    assert c.value == pytest.approx(0.105 * 1.2 * 0.8)
    d = KLController(1.0, target=1.0)
    d.restore(c.state())
    assert d.value == c.value


def test_running_moments_match_the_whole_history():
    values = torch.randn(100, dtype=torch.float64) * 3 + 1
    m = RunningMoments()
    for chunk in values.split(17):
        m.update(chunk)
    assert m.mean == pytest.approx(float(values.mean()))
    assert m.std == pytest.approx(float(values.std(unbiased=False)))
    again = RunningMoments()
    again.restore(m.state())
    assert again.normalize([1.0]).tolist() == pytest.approx(m.normalize([1.0]).tolist())


def test_value_loss_clips_around_the_old_values():
    values = torch.tensor([[1.0, 0.0, 3.0]])
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    loss, metrics = value_loss(values, old, returns, mask, 0.5)
    # token 0: unclipped (1-2)^2 = 1, clipped (0.5-2)^2 = 2.25 -> 1.125; token 1: both 1 -> 0.5;
    # token 2: unclipped 9, clipped 0.25 -> 4.5
    assert close(loss, [[1.125, 0.5, 4.5]])
    assert float(metrics["critic/clipfrac"]) == pytest.approx(1 / 3)
    plain, _ = value_loss(values, old, returns, mask, None)
    assert close(plain, [[0.5, 0.5, 4.5]])


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.0), returns, mask) == pytest.approx(0.0)
    assert explained_variance(-returns, returns, mask) < 0


def test_the_critic_section_is_refused_where_no_critic_trains_and_splits_the_prompts():
    from coati.distributed.config.tree import config_from_dict

    with pytest.raises(
        ValueError, match=r"critic settings \['learning_rate'\] given, but --algo DAPO .*trains no critic"
    ):
        config_from_dict({"critic": {"learning_rate": 1e-3}})
    with pytest.raises(ValueError, match="critic DP ranks \\* minibatches = 3 must divide 4"):
        config_from_dict({"algo": "PPO", "critic": {"num_procs": 3}})
    with pytest.raises(ValueError, match="critic plugin pp_size=1"):
        config_from_dict({"algo": "PPO", "critic": {"num_procs": 2, "plugin": {"pp_size": 2}}})
    with pytest.raises(ValueError, match="critic num_procs=3 is not divisible by critic plugin tp_size=2"):
        config_from_dict({"algo": "PPO", "critic": {"num_procs": 3, "plugin": {"tp_size": 2}}})
    tp = config_from_dict({"algo": "PPO", "critic": {"num_procs": 2, "plugin": {"tp_size": 2}}}).critic_trainer()
    assert tp.dp_size == 1 and tp.train_batch_size == 4  # two TP ranks share one DP rank's 4 prompts
    with pytest.raises(ValueError, match="pp_size=2"):
        config_from_dict({"algo": "PPO", "consumer": {"num_consumer_procs": 2, "plugin": {"pp_size": 2}}})
    cfg = config_from_dict(
        {"algo": "PPO", "consumer": {"train_batch_size": 4, "train_minibatch_size": 2, "num_consumer_procs": 2}}
        | {"critic": {"num_procs": 4, "learning_rate": 1e-4}}
    )
    critic = cfg.critic_trainer()  # 8 prompts a step over 4 critic ranks, in the policy's 2 minibatches
    assert (critic.train_batch_size, critic.train_minibatch_size, critic.learning_rate) == (2, 1, 1e-4)
    assert critic.dp_size == 4 and not critic.share_prompt_forward
