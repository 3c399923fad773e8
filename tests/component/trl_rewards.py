"""TRL's shipped reward functions as a TRL user's own module holds them (a factory's product named module:function)."""

from trl.rewards import get_soft_overlong_punishment

overlong = get_soft_overlong_punishment(max_completion_len=12, soft_punish_cache=6)
