"""TensorBoard event files under <run folder>/tensorboard, through torch's standard ``SummaryWriter``: every scalar
under its metric name, and each step's sample completions as a markdown table (the Text tab)."""

from __future__ import annotations

from coati.distributed.loggers.base import Logger, require


class TensorBoardLogger(Logger):
    REQUIRES = ("torch.utils.tensorboard", "tensorboard")

    def __init__(self, out, project, config, append):
        super().__init__(out, project, config, append)
        self.log_dir = str(out / "tensorboard")
        self.writer = require(*self.REQUIRES).SummaryWriter(log_dir=self.log_dir)

    def log(self, step, scalars):
        for key, value in scalars.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def completions(self, step, rows):
        def cell(text) -> str:
            return str(text).replace("|", "\\|").replace("\n", "<br>")

        table = ["| prompt | response | reward | version |", "|---|---|---|---|"]
        table += [
            f"| {cell(r['prompt'])} | {cell(r['response'])} | {r['reward']:.3f} | {r.get('policy_version', '')} |"
            for r in rows
        ]
        self.writer.add_text("completions", "\n".join(table), step)

    def truncate(self, from_step):
        # TensorBoard drops the events at and after ``purge_step`` that earlier files of the folder hold.
        self.writer.close()
        self.writer = require(*self.REQUIRES).SummaryWriter(log_dir=self.log_dir, purge_step=from_step)

    def close(self):
        self.writer.close()
