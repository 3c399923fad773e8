"""``ALGO_MAP``: each named algorithm as a preset ``AlgorithmConfig`` (estimator, loss, aggregation, filters, defaults).

A preset is data. The consumer reads the fields and never compares algorithm names, so DAPO is a set of knobs, not
a branch. ``resolve_algorithm`` applies user overrides to a preset and validates the result.
"""

from __future__ import annotations

import dataclasses

from coati.distributed.algo.config import REGISTERED, AlgorithmConfig, check_registered
from coati.registry import Registry

ALGO_MAP: Registry = Registry("algorithm")

ALGO_MAP.register(
    "GRPO",
    AlgorithmConfig(
        advantage_estimator="grpo",
        policy_loss="ppo_clip",
        loss_agg_mode="seq-mean-token-mean",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        beta=0.04,
        kl_estimator="k3",
    ),
)
ALGO_MAP.register(
    "DAPO",
    AlgorithmConfig(
        advantage_estimator="grpo",
        policy_loss="ppo_clip",
        loss_agg_mode="token-mean",
        clip_eps_low=0.2,
        clip_eps_high=0.28,
        beta=0.0,
        dynamic_sampling=True,
        skip_no_signal_after=1,
        overlong_buffer_ratio=0.25,
        overlong_penalty_factor=1.0,
    ),
)
ALGO_MAP.register(
    "DR_GRPO",
    AlgorithmConfig(
        advantage_estimator="drgrpo",
        policy_loss="ppo_clip",
        loss_agg_mode="seq-mean-token-sum-norm",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        beta=0.0,
    ),
)
ALGO_MAP.register(
    "RLOO",
    AlgorithmConfig(
        advantage_estimator="rloo",
        policy_loss="ppo_clip",
        loss_agg_mode="token-mean",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        beta=0.0,
    ),
)
ALGO_MAP.register(
    "REINFORCE_PPB",
    AlgorithmConfig(
        advantage_estimator="reinforce_ppb",
        policy_loss="ppo_clip",
        loss_agg_mode="token-mean",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        beta=0.001,
        kl_estimator="k2",
    ),
)
ALGO_MAP.register(
    "GSPO",
    AlgorithmConfig(
        advantage_estimator="grpo",
        policy_loss="gspo",
        loss_agg_mode="seq-mean-token-mean",
        clip_eps_low=3e-4,
        clip_eps_high=4e-4,
        beta=0.0,
    ),
)
ALGO_MAP.register(
    "CISPO",
    AlgorithmConfig(
        advantage_estimator="grpo",
        policy_loss="cispo",
        loss_agg_mode="token-mean",
        clip_eps_low=1.0,
        clip_eps_high=4.0,
        beta=0.0,
    ),
)
ALGO_MAP.register(
    "PPO",
    AlgorithmConfig(
        advantage_estimator="gae",
        policy_loss="ppo_clip",
        loss_agg_mode="token-mean",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        beta=0.0,
        gamma=1.0,
        lam=0.95,
        critic_lam=1.0,
        init_kl_coef=0.01,
        value_clip=0.5,
    ),
)
ALGO_MAP.register(
    "REINFORCE_PP",
    AlgorithmConfig(
        advantage_estimator="reinforce_pp",
        policy_loss="ppo_clip",
        loss_agg_mode="token-mean",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        beta=0.0,
        gamma=1.0,
        init_kl_coef=0.01,
    ),
)

ALGO_MAP.register(
    "OPD",
    AlgorithmConfig(
        advantage_estimator="none",
        policy_loss="ppo_clip",
        loss_agg_mode="token-mean",
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        beta=0.0,
        distill_coef=1.0,
    ),
)


def preset_name(name: str) -> str:
    """The preset ``name`` refers to, in any case and with ``-`` or ``.`` for ``_`` (grpo, Dr.GRPO, dr-grpo); an
    unknown name is returned as it is (``ALGO_MAP`` refuses it, listing the known ones)."""
    if not isinstance(name, str):
        return name
    key = name.upper().replace("-", "_").replace(".", "_")
    return next((k for k in ALGO_MAP if k.upper() == key), name)


def resolve_algorithm(name: str, **overrides) -> AlgorithmConfig:
    """The preset ``name`` with ``overrides`` applied (None values are ignored), validated."""
    preset = ALGO_MAP.get(preset_name(name))
    known = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown algorithm option(s) {unknown}; known: {', '.join(sorted(known))}")
    algorithm = dataclasses.replace(preset, **{k: v for k, v in overrides.items() if v is not None})
    check_registered(algorithm, [k for k in REGISTERED if getattr(algorithm, k) != getattr(preset, k)])
    return algorithm
