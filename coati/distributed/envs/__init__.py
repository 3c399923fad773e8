"""Multi-turn environments: the ``Environment`` contract, the built-in environments and the episode runner."""

from coati.distributed.envs import retry, tool_math  # noqa: F401 - registers "retry" and "tool_math"
from coati.distributed.envs.base import ENVIRONMENTS, Environment, EnvStep, register_environment, resolve_environment

__all__ = ["ENVIRONMENTS", "Environment", "EnvStep", "register_environment", "resolve_environment"]
