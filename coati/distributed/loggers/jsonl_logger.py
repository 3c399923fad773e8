"""metrics.jsonl (one object per step) and samples.jsonl (one per sample completion) in the run folder."""

from __future__ import annotations

import json

from coati.distributed.loggers.base import Logger


class JsonlLogger(Logger):
    def __init__(self, out, project, config, append):
        super().__init__(out, project, config, append)
        self.metrics, self.samples = out / "metrics.jsonl", out / "samples.jsonl"
        if not append:  # a resumed run keeps the lines of the steps before its checkpoint
            self.metrics.write_text("")
            self.samples.unlink(missing_ok=True)

    def log(self, step, scalars):
        with self.metrics.open("a") as f:
            f.write(json.dumps(scalars) + "\n")

    def completions(self, step, rows):
        with self.samples.open("a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}) + "\n")
