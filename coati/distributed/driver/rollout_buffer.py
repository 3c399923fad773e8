"""The driver's rollout buffer: scored groups wait here between the producers that draw them and the step that trains
them. Pure (no Ray): the loop decides when to draw, the buffer decides what is kept, what is trained and what is too
old to train.

Versions: a row sampled by weights of version v and trained by a step that starts from version u has lag u - v.
With ``max_staleness = k`` no row with lag > k is ever trained: ``take`` drops such rows first and counts them.
Groups move whole: a group's version is its oldest row's (rows of one group may start at different versions when a
push lands mid-round), so a group is kept, dropped and trained as one. The
loop paces producers so that this rarely happens (it draws ahead at most k steps' worth of groups, see
``fill_target``), because discarding stale groups biases training toward rollouts that finish quickly.

Dynamic sampling (DAPO): ``admit`` drops groups whose every completion got the same *signal* and keeps them aside;
``take`` fills a batch that stayed short after ``max_draws`` draws from those (they train as zero-advantage rows
rather than a step being skipped). The signal is by default the reward function's own score (``task_reward``: for a
verifier, the accuracy), not the length-shaped reward, so an all-wrong group is not kept for its length penalty.

Every group's fate (trained by which step, dropped and why, waiting) is kept in the run's ``Ledger``
(``ledger.py``), which refuses a step that would train a group a second time.

Metrics: each draw is recorded against the step it was drawn for (``open_step``), so a step's ``rollout/*`` and
``reward/*`` describe the rows drawn for it, not the next step's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from coati.distributed.algo.config import SIGNALS, AlgorithmConfig
from coati.distributed.algo.grouping import degenerate_groups
from coati.distributed.driver.ledger import Ledger, group_keys
from coati.distributed.record import RolloutBatch, group_versions


@dataclass
class DrawLog:
    """What was drawn for one step."""

    rollouts: list[RolloutBatch] = field(default_factory=list)
    """every draw as it landed, before filtering"""
    draws: int = 0
    """draw rounds (one call to every producer) made for the step"""
    dropped_zero_signal_groups: int = 0
    filled_zero_signal_groups: int = 0
    stale_dropped_groups: int = 0
    """groups beyond the staleness bound, dropped (never trained) when the step took its batch"""
    zero_signal: list[RolloutBatch] = field(default_factory=list)


class RolloutBuffer:
    def __init__(
        self,
        groups_per_step: int,
        group_size: int,
        max_staleness: int,
        dynamic_sampling: bool,
        signal: str = AlgorithmConfig.dynamic_sampling_signal,
        max_draws: int = AlgorithmConfig.dynamic_sampling_max_draws,
    ):
        if signal not in SIGNALS:
            raise ValueError(f"dynamic sampling signal {signal!r} is not one of {SIGNALS}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.groups_per_step, self.group_size = groups_per_step, group_size
        self.max_staleness, self.dynamic_sampling, self.signal = max_staleness, dynamic_sampling, signal
        self.max_draws = max_draws
        self.batches: list[RolloutBatch] = []
        self.logs: dict[int, DrawLog] = {}
        self.ledger = Ledger(group_size)

    # ---- filling ---------------------------------------------------------------------------------------------

    def log(self, step: int) -> DrawLog:
        return self.logs.setdefault(step, DrawLog())

    def admit(self, batch: RolloutBatch, for_step: int) -> None:
        """Keep a scored draw made for step ``for_step``; with dynamic sampling, set zero-signal groups aside."""
        log = self.log(for_step)
        log.rollouts.append(batch)
        self.ledger.draw(batch, for_step)
        if self.dynamic_sampling and len(batch):
            if self.signal == "task_reward":  # the producer's verdict
                degenerate = np.asarray(batch.no_signal, dtype=bool)
            else:  # copies: arrays from the object store are read-only
                degenerate = degenerate_groups(
                    torch.tensor(batch.rewards, dtype=torch.float64), torch.tensor(batch.group_ids)
                ).numpy()
            log.dropped_zero_signal_groups += int(degenerate.sum()) // self.group_size
            log.zero_signal.append(batch.select(np.flatnonzero(degenerate)))
            self.ledger.drop(log.zero_signal[-1], "zero_signal")
            batch = batch.select(np.flatnonzero(~degenerate))
        if len(batch):
            self.batches.append(batch)

    def groups(self, trained_version: int | None = None) -> int:
        """Groups held (only those still trainable by a step starting from ``trained_version``, when given)."""
        rows = sum(
            len(b)
            if trained_version is None
            else int((trained_version - group_versions(b) <= self.max_staleness).sum())
            for b in self.batches
        )
        return rows // self.group_size

    def draws_allowed(self, per_draw_groups: int) -> int:
        """Draw rounds a step may make before its batch is filled from zero-signal groups: ``max_draws`` times the
        rounds a batch needs when nothing is dropped, so any batch size the config accepts can be filled."""
        return self.max_draws * max(1, -(-self.groups_per_step // max(per_draw_groups, 1)))

    def fill_target(self, steps_left: int) -> int:
        """Groups to hold while a step trains: the next ``max_staleness`` steps' worth (0 when synchronous), so
        producers run ahead at most k versions and every group drawn now is trained within the bound."""
        return self.groups_per_step * min(self.max_staleness, steps_left)

    # ---- taking ----------------------------------------------------------------------------------------------

    def drop_stale(self, trained_version: int, log: DrawLog) -> None:
        """Remove groups whose oldest row's lag behind ``trained_version`` exceeds the bound (never trained),
        counting them."""
        kept = []
        for b in self.batches:
            fresh = trained_version - group_versions(b) <= self.max_staleness
            log.stale_dropped_groups += int((~fresh).sum()) // self.group_size
            if not fresh.all():
                self.ledger.drop(b.select(np.flatnonzero(~fresh)), "stale")
            if fresh.any():
                kept.append(b if fresh.all() else b.select(np.flatnonzero(fresh)))
        self.batches = kept

    def fill_short(self, log: DrawLog) -> None:
        """After the allowed draws, top the buffer up from this step's zero-signal groups."""
        missing = (self.groups_per_step - self.groups()) * self.group_size
        pool = RolloutBatch.concat(log.zero_signal) if log.zero_signal else None
        if pool is None or len(pool) < missing:
            have = 0 if pool is None else len(pool) // self.group_size
            raise RuntimeError(
                f"dynamic sampling: {log.draws} draws left the batch {missing // self.group_size} groups "
                f"short and only {have} zero-signal groups were drawn"
            )
        log.filled_zero_signal_groups += missing // self.group_size
        self.batches.append(pool.select(np.arange(missing)))

    def take(self, trained_version: int) -> RolloutBatch:
        """The step's batch: ``groups_per_step`` whole groups, oldest first, none beyond the staleness bound."""
        rows = self.groups_per_step * self.group_size
        merged = RolloutBatch.concat(self.batches)
        # Oldest groups first, admission order within a version (so each group's rows stay together).
        order = np.argsort(group_versions(merged), kind="stable")
        assert len(merged) >= rows, (len(merged), rows)
        assert (trained_version - merged.policy_version[order[:rows]] <= self.max_staleness).all()
        rest = order[rows:]
        taken = merged.select(order[:rows])
        self.ledger.train(taken, trained_version + 1)
        self.batches = [merged.select(np.sort(rest))] if len(rest) else []
        return taken

    # ---- checkpoints -------------------------------------------------------------------------------------------

    def state(self) -> list[RolloutBatch]:
        return list(self.batches)

    def restore(self, batches: list[RolloutBatch], ledger: dict | None = None) -> None:
        """The checkpoint's groups and ledger (None: a checkpoint written without one; the ledger starts empty)."""
        self.batches = list(batches)
        if ledger is not None:
            self.ledger.restore(ledger)

    def account(self, handed_out: list[dict] | None = None) -> dict:
        """The ledger's account of every drawn group (``Ledger.account``), the buffer's groups waiting."""
        return self.ledger.account([k for b in self.batches for k in group_keys(b, self.group_size)], handed_out)
