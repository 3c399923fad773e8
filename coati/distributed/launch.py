"""The entry point under its ColossalChat name: ``from coati.distributed.launch import launch_distributed``. The
driver lives in ``driver/``; this module re-exports what scripts import from here."""

from coati.distributed.algo.presets import ALGO_MAP
from coati.distributed.config.tree import Config
from coati.distributed.driver.job import launch_distributed
from coati.distributed.driver.launch import launch

__all__ = ["ALGO_MAP", "Config", "launch", "launch_distributed"]
