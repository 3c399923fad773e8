"""ColossalChat, in one place: ``translate`` (``translate.py``) turns the keyword arguments of ColossalChat's own
``rl_example.py`` call into this project's, and ``config_from_launch_kwargs`` (``keywords.py``) maps
``launch_distributed``'s arguments onto the config tree. ``launch_distributed`` reads: translate, map, run."""

from coati.distributed.config.colossalchat.keywords import GRPO_KEYS, LAUNCH_ARGS, config_from_launch_kwargs
from coati.distributed.config.colossalchat.translate import STATEMENTS, translate

__all__ = ["GRPO_KEYS", "LAUNCH_ARGS", "STATEMENTS", "config_from_launch_kwargs", "translate"]
