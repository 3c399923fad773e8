"""The teacher section of the config tree: which model scores the student's tokens (a folder, or the policy itself a
few versions back), the actors that host it and what the teacher sees that the student does not."""

from __future__ import annotations

import string
from dataclasses import dataclass

from coati.distributed.checks import finite, positive, require
from coati.distributed.runtime.placement import check_server_placement

SELF = "self:"
"""the prefix of a lagged self-teacher: ``self:N``, the policy as it was at the last multiple of N steps"""


@dataclass(frozen=True)
class TeacherConfig:
    """On-policy distillation's teacher (used when the algorithm's distill_coef > 0: --algo OPD, --distill-coef)."""

    model: str | None = None
    """the teacher: a causal-LM folder with the student's tokenizer, or self:N, the policy itself as it was at the
    last multiple of N training steps (0 to N - 1 versions back, refreshed every N steps; no second model folder)"""
    servers: int = 1
    """Ray actors hosting the teacher, shared by all producers (each scores a share of a draw's completions)"""
    cpus: float = 1.0
    """CPUs reserved for each teacher actor (its threads)"""
    gpus: float = 0.0
    """GPUs (or a share of one) for each teacher actor"""
    placement: str = "any"
    """where the teacher actors run: any (Ray places them by cpus/gpus), node:K (the K-th alive node), or producer
    (server i beside producer i mod num_producers, with gpus > 0 inside that producer's GPU)"""
    batch_tokens: int = 8192
    """the most padded tokens (prompt + completion) one teacher forward computes"""
    privileged_context: str | None = None
    """text the teacher alone sees after the prompt's last message, with {column} fields from the row, e.g.
    "\\n\\nThe reference answer is {gt_answer}." (None: the teacher reads the student's prompt, under its own chat
    template)"""
    timeout_s: float = 120.0
    """seconds a teacher server may go without finishing a forward while a producer waits on it; then the run stops
    naming the server (one that keeps finishing forwards is waited for however long a draw takes)"""

    def __post_init__(self):
        m = self.model
        require(
            m is None or (isinstance(m, str) and m.strip()),
            f"teacher.model takes one teacher (a model folder or self:N), got {m!r}; teachers chosen per task by a "
            "dataset column are not built: run one teacher per run",
        )
        if isinstance(m, str) and m.startswith(SELF):
            lag = m[len(SELF) :]
            require(
                lag.isdigit() and int(lag) >= 1,
                f"teacher.model={m!r}: a self-teacher is self:N with N >= 1 training steps between refreshes, e.g. "
                "self:4",
            )
        check_server_placement(self.placement, "teacher.placement")
        finite(self, "cpus", "gpus", low=0, where="teacher")
        positive(self, "servers", "batch_tokens", where="teacher")
        require(self.timeout_s > 0, f"teacher.timeout_s must be > 0, got {self.timeout_s}")
        if self.privileged_context is not None:
            try:
                names = self.context_fields
            except ValueError as e:
                raise ValueError(
                    f"teacher.privileged_context {self.privileged_context!r} is not a format string ({e}); write "
                    "{column} for a row's value and {{ }} for braces"
                ) from None
            require(
                all(n and n.isidentifier() for n in names),
                f"teacher.privileged_context's fields must be column names, got {sorted(names)}",
            )

    @property
    def self_lag(self) -> int | None:
        """N of a self:N teacher (steps between refreshes), else None."""
        m = self.model
        return int(m[len(SELF) :]) if isinstance(m, str) and m.startswith(SELF) else None

    @property
    def context_fields(self) -> set[str]:
        """The row columns ``privileged_context`` shows."""
        text = self.privileged_context or ""
        return {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
