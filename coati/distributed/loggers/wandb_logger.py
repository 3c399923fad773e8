"""A wandb run (online when WANDB_API_KEY is set, else offline under the run folder, to sync later): every scalar
and each step's sample completions as a wandb Table."""

from __future__ import annotations

import os

from coati.distributed.loggers.base import Logger, require

COLUMNS = ["step", "prompt", "response", "reward", "policy_version"]


class WandbLogger(Logger):
    REQUIRES = ("wandb", "wandb")

    def __init__(self, out, project, config, append):
        super().__init__(out, project, config, append)
        self.wandb = require(*self.REQUIRES)
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        self.run = self.wandb.init(project=project, config=config or {}, dir=str(out), mode=mode)

    def log(self, step, scalars):
        self.run.log({k: v for k, v in scalars.items() if not isinstance(v, list)}, step=step)

    def completions(self, step, rows):
        table = self.wandb.Table(columns=COLUMNS, data=[[step, *(r.get(c) for c in COLUMNS[1:])] for r in rows])
        self.run.log({"completions": table}, step=step)

    def close(self):
        self.run.finish()
        # wandb's service process owns the run file; teardown waits for it to exit, so the file is whole when the job
        # returns (a later init starts a new service).
        self.wandb.teardown()
