"""The distributed RL system: producers (rollout + reward) and consumers (training) as Ray actors.

Layout, one role per folder (imports run downward only; ``.importlinter`` holds the contract ``.ci/run`` checks):
``driver/`` (the job, launch, loop, preflight, actor groups, rollout buffer, checkpoints, run folder, reporting),
``config/`` (the config tree, the command line, ColossalChat's call), ``rollout/`` (the producer and its data),
``trainer/`` (the consumer, its forward, steps and ColossalAI shims), ``envs/``, ``reward/``, ``inference/``,
``transport/`` (collective groups, weight pushes, wire layout, attestation), ``loggers/`` (and the metric
registry), ``algo/``, and the bottom floor: ``runtime/`` (placement, liveness, start-up marks, threads), ``model/``
(architectures, model files, precision, attention, LoRA) and three leaves (``record``: the rollout record;
``guards``; ``checks``). Each folder's config section lives beside it (``algo/config.py``, ``inference/config.py``,
...); ``config/tree.py`` assembles them.

The public names are importable from here, loaded on first use: ``launch_distributed``, ``launch``, ``run_job`` (a
run as the command line makes it: Ray, the run folder, the report), ``Config``,
``ALGO_MAP``, ``BACKEND_MAP``, ``GRPOConsumer``, ``REWARD_FNS``, ``ENVIRONMENTS``.
"""

from importlib import import_module

_PUBLIC = {
    "launch_distributed": "coati.distributed.driver.job",
    "launch": "coati.distributed.driver.launch",
    "run_job": "coati.distributed.driver.job",
    "Config": "coati.distributed.config.tree",
    "ALGO_MAP": "coati.distributed.algo.presets",
    "BACKEND_MAP": "coati.distributed.inference",
    "GRPOConsumer": "coati.distributed.trainer.consumer",
    "REWARD_FNS": "coati.distributed.reward.base",
    "ENVIRONMENTS": "coati.distributed.envs.base",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'coati.distributed' has no attribute {name!r}")
