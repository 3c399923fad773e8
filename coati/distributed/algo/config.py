"""The algorithm section of the config tree: one RL algorithm as a bundle of registered pieces."""

from __future__ import annotations

from dataclasses import dataclass

from coati.distributed.checks import require

VALUE_ESTIMATORS = frozenset({"gae"})
"""advantage estimators that need a critic's values (a run with one of them places a critic group)"""
TOKEN_REWARD_ESTIMATORS = frozenset({"gae", "reinforce_pp"})
"""advantage estimators over per-token rewards (the only ones a KL penalty in the reward can reach)"""

SIGNALS = ("task_reward", "reward")
"""what dynamic sampling compares within a group: the reward function's score before shaping, or the shaped reward"""


@dataclass(frozen=True)
class AlgorithmConfig:
    """One RL algorithm as a bundle of pure pieces; ``ALGO_MAP`` holds the named presets."""

    advantage_estimator: str = "grpo"
    """advantage estimator: grpo, drgrpo, rloo, reinforce_ppb (group baselines), gae (a learned critic), reinforce_pp
    (per-token discounted returns, no baseline), none (no reward term: on-policy distillation's, with distill_coef)"""
    policy_loss: str = "ppo_clip"
    """policy loss: ppo_clip, gspo, cispo"""
    loss_agg_mode: str = "token-mean"
    """loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"""
    clip_eps_low: float = 0.2
    """lower clip range: ratios below 1 - clip_eps_low are clipped"""
    clip_eps_high: float = 0.2
    """upper clip range: ratios above 1 + clip_eps_high are clipped (clip-higher when > clip_eps_low)"""
    dual_clip_c: float | None = None
    """dual-clip bound c > 1 for negative advantages (None = off)"""
    beta: float = 0.0
    """KL coefficient to the reference policy (0 = no reference model)"""
    kl_estimator: str = "k3"
    """KL estimator in the loss: k1, k2, k3"""
    off_policy_correction: str = "tis"
    """per-token weight for rows sampled by another policy (stale weights, another engine): tis, icepop, seq_mask,
    none; see coati/distributed/algo/correction.py"""
    tis_cap: float = 2.0
    """truncation of the importance weight pi_prox / mu (tis, seq_mask)"""
    is_mask_low: float = 0.5
    """icepop/seq_mask: tokens (icepop) or responses (seq_mask, geometric mean) whose ratio is below this get no loss"""
    is_mask_high: float = 2.0
    """icepop/seq_mask: ... or above this"""
    dynamic_sampling: bool = False
    """drop groups whose completions all got the same signal and draw more prompts to refill the batch"""
    dynamic_sampling_max_draws: int = 8
    """dynamic sampling: a step waits for at most this many times the rounds its batch needs when nothing is dropped
    (rounds drawn for it while the previous step trains count, and may pass the cap), then fills what is still
    missing with the zero-signal groups it drew (they train as zero-advantage rows); DAPO's cap on generation batches"""
    dynamic_sampling_signal: str = "task_reward"
    """what dynamic sampling compares within a group: task_reward (the reward function's score before length
    shaping: for a verifier, the accuracy) or reward (the shaped reward the advantages see)"""
    skip_no_signal_after: int = 0
    """skip a prompt when its turn comes if its last N groups had no signal (every completion the same task
    reward: always right or always wrong); 0 = off (DAPO's preset: 1). Needs dynamic_sampling (such groups would be
    dropped anyway)"""
    skip_recheck: float = 0.1
    """probability that a prompt due to be skipped is drawn anyway, so none is starved forever"""
    overlong_buffer_ratio: float = 0.0
    """soft overlong punishment over the last ratio * max_new_tokens tokens of the budget (0 = off)"""
    overlong_penalty_factor: float = 1.0
    """maximum overlong penalty subtracted from the reward"""
    mask_truncated: bool = False
    """truncated responses contribute no loss"""
    adv_eps: float = 1e-6
    """epsilon added to standard deviations in advantage normalisation"""
    gamma: float = 1.0
    """discount of per-token rewards (gae, reinforce_pp)"""
    lam: float = 0.95
    """GAE's lambda for the policy's advantages: 0 is one-step TD, 1 the Monte-Carlo return minus V"""
    critic_lam: float | None = None
    """GAE's lambda for the critic's returns (None: lam); VAPO's decoupled GAE sets it to 1.0"""
    init_kl_coef: float = 0.0
    """KL to the reference as a per-token reward penalty, -coef * KL_t (gae, reinforce_pp; 0 = off); beside beta's KL in
    the loss"""
    kl_reward_estimator: str = "k1"
    """the KL estimator of the reward penalty: k1, k2, k3"""
    kl_target: float | None = None
    """adaptive KL controller (Ziegler et al. 2019): the KL per completion the coefficient steers towards (None: the
    coefficient stays at init_kl_coef)"""
    kl_horizon: int = 10000
    """adaptive KL controller: completions over which the coefficient moves by the clipped proportional error"""
    normalize_reward: bool = False
    """scale rewards by running statistics over the run (mean 0, std 1), kept in every checkpoint"""
    value_clip: float | None = 0.5
    """the critic's clipped value loss: new values may move at most this far from the rollout's (None: unclipped)"""
    freeze_actor_steps: int = 0
    """critic warm-up: the first N training steps train the critic only (the policy keeps its weights)"""
    distill_coef: float = 0.0
    """on-policy distillation: coef * (log pi_teacher - log pi_student) of each sampled token is added to its
    advantage (the per-token reverse KL to the teacher, which teacher.model names; 0 = off; OPD's preset: 1.0)"""

    def __post_init__(self):
        require(0 <= self.clip_eps_low <= 1, f"clip_eps_low must be in [0, 1], got {self.clip_eps_low}")
        require(self.clip_eps_high >= 0, f"clip_eps_high must be >= 0, got {self.clip_eps_high}")
        require(
            self.dual_clip_c is None or self.dual_clip_c > 1,
            f"dual_clip_c must be > 1 (or None to disable), got {self.dual_clip_c}",
        )
        require(self.beta >= 0, f"beta must be >= 0, got {self.beta}")

        require(
            isinstance(self.tis_cap, (int, float)) and self.tis_cap >= 1,
            f"tis_cap must be a number >= 1 (off: off_policy_correction='none'), got {self.tis_cap!r}",
        )
        require(
            0 < self.is_mask_low < 1 < self.is_mask_high,
            f"need 0 < is_mask_low < 1 < is_mask_high, got {self.is_mask_low} and {self.is_mask_high}",
        )
        require(
            0 <= self.overlong_buffer_ratio < 1,
            f"overlong_buffer_ratio must be in [0, 1), got {self.overlong_buffer_ratio}",
        )
        require(self.adv_eps > 0, f"adv_eps must be > 0, got {self.adv_eps}")
        self._check_returns()
        require(self.distill_coef >= 0, f"distill_coef must be >= 0, got {self.distill_coef}")
        require(
            self.advantage_estimator != "none" or self.distill_coef > 0,
            "advantage_estimator='none' trains on the teacher's term alone, but distill_coef=0; set distill_coef > 0 "
            "(--distill-coef 1.0) and a teacher (--teacher-model), or another estimator",
        )
        require(
            isinstance(self.skip_no_signal_after, int) and self.skip_no_signal_after >= 0,
            f"skip_no_signal_after must be an integer >= 0, got {self.skip_no_signal_after!r}",
        )
        require(
            not self.skip_no_signal_after or self.dynamic_sampling,
            f"skip_no_signal_after={self.skip_no_signal_after} skips prompts whose groups dynamic sampling would "
            "drop, but dynamic_sampling is off; turn it on (DAPO) or set skip_no_signal_after=0",
        )
        require(
            isinstance(self.dynamic_sampling_max_draws, int) and self.dynamic_sampling_max_draws >= 1,
            f"dynamic_sampling_max_draws must be an integer >= 1, got {self.dynamic_sampling_max_draws!r}",
        )
        require(0 < self.skip_recheck <= 1, f"skip_recheck must be in (0, 1], got {self.skip_recheck}")
        require(
            self.dynamic_sampling_signal in SIGNALS,
            f"dynamic_sampling_signal must be one of {', '.join(SIGNALS)}, got {self.dynamic_sampling_signal!r}",
        )

    def _check_returns(self) -> None:
        """The discounting, KL-in-reward and critic settings."""
        for name in ("gamma", "lam"):
            require(0 <= getattr(self, name) <= 1, f"{name} must be in [0, 1], got {getattr(self, name)}")
        require(
            self.critic_lam is None or 0 <= self.critic_lam <= 1,
            f"critic_lam must be in [0, 1] (or None: lam), got {self.critic_lam}",
        )
        require(self.init_kl_coef >= 0, f"init_kl_coef must be >= 0, got {self.init_kl_coef}")
        require(
            not self.init_kl_coef or self.advantage_estimator in TOKEN_REWARD_ESTIMATORS,
            f"init_kl_coef={self.init_kl_coef} puts the KL in per-token rewards, which advantage_estimator="
            f"{self.advantage_estimator!r} does not take (a group baseline scores whole completions); use beta (KL in "
            f"the loss) or advantage_estimator gae or reinforce_pp",
        )
        require(
            self.kl_target is None or (self.kl_target > 0 and self.init_kl_coef > 0),
            f"kl_target={self.kl_target} steers init_kl_coef={self.init_kl_coef}: both must be > 0 (or kl_target None)",
        )
        require(
            isinstance(self.kl_horizon, int) and self.kl_horizon >= 1,
            f"kl_horizon must be an integer >= 1, got {self.kl_horizon!r}",
        )
        require(
            self.value_clip is None or self.value_clip > 0,
            f"value_clip must be > 0 (or None: unclipped), got {self.value_clip}",
        )
        require(
            isinstance(self.freeze_actor_steps, int) and self.freeze_actor_steps >= 0,
            f"freeze_actor_steps must be an integer >= 0, got {self.freeze_actor_steps!r}",
        )
        require(
            not self.freeze_actor_steps or self.uses_critic,
            f"freeze_actor_steps={self.freeze_actor_steps} warms up a critic, but advantage_estimator="
            f"{self.advantage_estimator!r} has none; use gae (PPO) or freeze_actor_steps=0",
        )

    @property
    def uses_critic(self) -> bool:
        """Whether the run trains a value model (its estimator needs V)."""
        return self.advantage_estimator in VALUE_ESTIMATORS

    @property
    def distills(self) -> bool:
        """Whether the run has a teacher score the sampled tokens (``algo/distill.py``)."""
        return self.distill_coef > 0

    @property
    def kl_in_reward(self) -> bool:
        return self.init_kl_coef > 0

    def overlong_buffer_len(self, max_new_tokens: int) -> int:
        return int(round(self.overlong_buffer_ratio * max_new_tokens))


REGISTERED = {
    "advantage_estimator": ("coati.distributed.algo.advantage", "ADVANTAGE_ESTIMATORS"),
    "policy_loss": ("coati.distributed.algo.policy_loss", "POLICY_LOSSES"),
    "loss_agg_mode": ("coati.distributed.algo.aggregation", "LOSS_AGGREGATIONS"),
    "kl_estimator": ("coati.distributed.algo.kl", "KL_ESTIMATORS"),
    "kl_reward_estimator": ("coati.distributed.algo.kl", "KL_ESTIMATORS"),
    "off_policy_correction": ("coati.distributed.algo.correction", "OFF_POLICY_CORRECTIONS"),
}
"""the fields that name a registered function, and the registry (module, name) that holds each"""


def check_registered(algorithm: AlgorithmConfig, fields=tuple(REGISTERED)) -> None:
    """Each of ``fields`` names a function of its registry. It imports the registries (and torch with them): the
    names a preset holds are checked by a test, so a run that overrides none of them starts without it."""
    import importlib

    for name in fields:
        module, attr = REGISTERED[name]
        registry, value = getattr(importlib.import_module(module), attr), getattr(algorithm, name)
        require(value in registry, f"unknown {registry.kind} {value!r}; known: {', '.join(registry.names())}")
