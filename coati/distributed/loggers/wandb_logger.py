"""A wandb run (online when WANDB_API_KEY is set, else offline under the run folder, to sync later): every scalar
and each step's sample completions as a wandb Table."""

from __future__ import annotations

import os

from coati.distributed.loggers.base import Logger

COLUMNS = ["step", "prompt", "response", "reward", "policy_version"]


class WandbLogger(Logger):
    def __init__(self, out, project, config, append):
        super().__init__(out, project, config, append)
        try:
            import wandb
        except ImportError as e:
            raise ImportError("report_to has wandb but it is not installed: pip install wandb") from e
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.wandb = wandb
        self.run = wandb.init(project=project, config=config or {}, dir=str(out), mode=mode)

    def log(self, step, scalars):
        self.run.log(scalars, step=step)

    def completions(self, step, rows):
        table = self.wandb.Table(columns=COLUMNS, data=[[step, *(r.get(c) for c in COLUMNS[1:])] for r in rows])
        self.run.log({"completions": table}, step=step)

    def close(self):
        self.run.finish()
