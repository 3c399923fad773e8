"""The reward contract: ``fn(completions: list[str], **sample_fields) -> list[RewardResult]``, batched.

Dataset columns arrive by name (``gt_answer=[...]``, ``test_cases=[...]``), one list entry per completion. Plain
floats are accepted in place of RewardResult (so reward functions written for TRL work unchanged). Reward
functions are registered by name in ``REWARD_FNS``; a dotted path ``package.module:function`` resolves too.
Producers never call them directly: they go through ``RewardPool``, which runs them in worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from coati.registry import Registry, resolve_callable

REWARD_FNS: Registry = Registry("reward function")


@dataclass
class RewardResult:
    reward: float
    """the scalar the advantage estimator sees"""
    format_ok: bool = False
    """the completion put its answer where the task asked"""
    answer_ok: bool = False
    """strict correctness: right answer in the required format"""
    info: dict[str, Any] = field(default_factory=dict)
    """extra diagnostics (extracted answer, lenient score, error reason, ...)"""


def resolve_reward_fn(name: str) -> Callable[..., list[RewardResult]]:
    """A registered reward function by name, or ``module:function``."""
    return resolve_callable(name, REWARD_FNS)


def truncate_for_log(text: str, limit: int = 200) -> str:
    """Model output can be megabytes long; logs and error messages keep the head and the tail."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}...[{len(text) - limit} chars]...{text[-half:]}"
