"""Faults made inside a run's actors while their processes live: a weight push that never arrives and a reward-model
server that never answers.

``bench_faults.py`` starts Ray with ``runtime_env={"worker_process_setup_hook": "benchmarks.fault_hooks.install"}``
and ``COATI_FAULT_FLAGS`` (a folder) in its environment; every worker process then runs ``install``, which wraps two
methods as their modules load (the code under test is not changed): once the file ``hang-push`` exists in that
folder, a producer's side of a weight-group collective (rank >= 1) waits for ever instead of taking part, so the
consumer's broadcast hangs with it; once ``hang-rm`` exists, a reward-model server's ``score`` waits for ever. Both
processes keep beating to the run's watchdog, as a process stuck on a network or a lock does.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from pathlib import Path


def _stuck_once(flag: str) -> None:
    folder = os.environ.get("COATI_FAULT_FLAGS")
    if folder and (Path(folder) / flag).exists():
        while True:
            time.sleep(1)


def _patch_group(module) -> None:
    wait = module.TorchGroup.wait

    def hanging_wait(self, work, what: str = "collective"):
        if self.rank != 0:
            _stuck_once("hang-push")
        return wait(self, work, what)

    module.TorchGroup.wait = hanging_wait


def _patch_reward_model(module) -> None:
    score = module.RewardModelServer.score

    def hanging_score(self, *args, **kwargs):
        _stuck_once("hang-rm")
        return score(self, *args, **kwargs)

    module.RewardModelServer.score = hanging_score


PATCHES = {
    "coati.distributed.transport.group": _patch_group,
    "coati.distributed.reward.model_actors": _patch_reward_model,
}


class _PatchOnLoad(importlib.abc.MetaPathFinder):
    """Finds nothing itself; for a module in ``PATCHES`` it returns the real spec with a loader that patches the
    module right after running it."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if not any(isinstance(f, _PatchOnLoad) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnLoad())
