"""The driver: validate config -> place actors -> connect groups -> push weights -> loop.

``ALGO_MAP`` is importable from here without starting anything: importing this module starts no Ray actor.
"""

from coati.distributed.algo.presets import ALGO_MAP, resolve_algorithm

__all__ = ["ALGO_MAP", "resolve_algorithm"]
