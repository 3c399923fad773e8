"""The environment contract for multi-turn episodes: one small class per task, chosen by name like rewards.

An ``Environment`` is one episode, built from one dataset row. ``reset()`` returns the first messages (chat format);
each model turn's text goes to ``step(text)``, which answers with the next observation (messages the model reads
before its next turn: a tool's output, feedback) or ends the episode with a reward and the row's verdict. Environments
are plain Python objects that run in the producer: no Ray, no tokens, no model; unit-testable alone. The producer
(``episodes.py``) turns the conversation into the trained token sequence and masks everything the model did not
generate.

A step that raises, hangs past its timeout or returns something malformed fails that episode (the reason in its
info): a failed sample, left out of its group's statistics and the loss (``rollout.scoring.episode_results``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coati.registry import Registry, resolve_callable

ENVIRONMENTS: Registry = Registry("environment")


@dataclass
class EnvStep:
    """What an environment answers to one model turn."""

    observation: list[dict] = field(default_factory=list)
    """messages ({"role", "content"}) appended before the model's next turn; empty when ``done``"""
    done: bool = False
    """the episode is over: ``reward`` is its reward"""
    reward: float = 0.0
    """the episode's reward (read when ``done``)"""
    answer_ok: bool = False
    """the row's verdict: the episode's final answer is right (what accuracy metrics count)"""
    info: dict[str, Any] = field(default_factory=dict)
    """diagnostics kept with the episode (tool calls made, the extracted answer, a failure's reason)"""


class Environment:
    """One episode of a task. Subclasses set ``name`` (the registry key) and implement ``reset`` and ``step``;
    options (``env_kwargs``) arrive as keyword arguments after the row."""

    name = ""
    max_turns = 4
    """model turns an episode may take unless the run sets ``env_max_turns``"""

    def __init__(self, row: dict, **options):
        self.row = row

    def reset(self) -> list[dict]:
        """The conversation's first messages (system and user), rendered with the chat template."""
        raise NotImplementedError

    def step(self, text: str) -> EnvStep:
        """React to the model's turn ``text`` (special tokens removed)."""
        raise NotImplementedError


def register_environment(cls: type[Environment]) -> type[Environment]:
    """Class decorator: register ``cls`` under ``cls.name``."""
    assert cls.name, f"{cls.__name__} needs a name"
    ENVIRONMENTS.register(cls.name, cls)
    return cls


def resolve_environment(name: str) -> type[Environment]:
    """A registered environment class by name, or ``module:Class``."""
    cls = resolve_callable(name, ENVIRONMENTS)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"environment {name!r} is {cls!r}, not a subclass of coati's Environment")
    return cls


def check_messages(messages, where: str) -> list[dict]:
    """``messages`` if it is a list of {"role": str, "content": str}; else ValueError naming ``where``."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise ValueError(f"{where} must be a list of {{'role': str, 'content': str}} messages, got {messages!r:.200}")
    return messages


def check_step(result) -> EnvStep:
    """``result`` if it is a well-formed EnvStep (observation messages unless done, a finite float reward)."""
    import math

    if not isinstance(result, EnvStep):
        raise ValueError(f"step() must return an EnvStep, got {type(result).__name__} {result!r:.200}")
    if not result.done:
        check_messages(result.observation, "an observation")
        if not result.observation:
            raise ValueError("step() returned neither an observation nor done=True")
    if not isinstance(result.reward, (int, float)) or not math.isfinite(result.reward):
        raise ValueError(f"step() returned reward {result.reward!r}; expected a finite number")
    return result
