"""Where a run's metrics go besides its run folder's summary and plots: one logger per ``run.report_to`` name, each
a small class in its own module (``base.Logger``), chosen from ``LOGGERS``. The reporter hands every logger each
step's scalars, the step's sample completions, and the evaluation before training as step 0."""

from __future__ import annotations

from coati.distributed.loggers.base import Logger

LOGGERS = {
    "jsonl": "coati.distributed.loggers.jsonl_logger:JsonlLogger",
    "tensorboard": "coati.distributed.loggers.tensorboard_logger:TensorBoardLogger",
    "wandb": "coati.distributed.loggers.wandb_logger:WandbLogger",
}
"""name -> class (imported when chosen, so an uninstalled backend costs nothing unless asked for)"""


def logger_class(name: str) -> type[Logger]:
    import importlib

    if name not in LOGGERS:
        raise ValueError(f"unknown logger {name!r} in report_to; known: {sorted(LOGGERS)}")
    module, _, cls = LOGGERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["LOGGERS", "Logger", "logger_class"]
