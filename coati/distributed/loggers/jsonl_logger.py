"""metrics.jsonl (one object per step) and samples.jsonl (one per sample completion) in the run folder."""

from __future__ import annotations

import json

from coati.distributed.loggers.base import Logger


class JsonlLogger(Logger):
    def __init__(self, out, project, config, append):
        super().__init__(out, project, config, append)
        self.metrics, self.samples = out / "metrics.jsonl", out / "samples.jsonl"
        if not append:  # a resumed run keeps the lines of the steps before its checkpoint (``truncate``)
            self.metrics.write_text("")
            self.samples.unlink(missing_ok=True)

    def log(self, step, scalars):
        with self.metrics.open("a") as f:
            f.write(json.dumps(scalars) + "\n")

    def completions(self, step, rows):
        with self.samples.open("a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}) + "\n")

    def truncate(self, from_step):
        for path in (self.metrics, self.samples):
            truncate_jsonl(path, from_step)


def truncate_jsonl(path, from_step) -> None:
    """Keep the records of ``path`` (a JSONL file, if it exists) before step ``from_step``, atomically."""
    if path.exists():
        kept = [line for line in path.read_text().splitlines(keepends=True) if _step_of(line) < from_step]
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)


def _step_of(line: str) -> float:
    """A record's step; a line cut short by a kill (no step to read) is dropped with the steps after it."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")
