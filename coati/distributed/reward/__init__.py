"""Verifiable rewards: pure reward functions (math, code, user-defined) and the process pool that runs them."""

from coati.distributed.reward import code_reward, math_reward  # noqa: F401 - registers "code" and "math"
from coati.distributed.reward.base import REWARD_FNS, RewardResult, RewardSignature, resolve_reward_fn
from coati.distributed.reward.pool import RewardPool

__all__ = ["REWARD_FNS", "RewardPool", "RewardResult", "RewardSignature", "resolve_reward_fn"]
