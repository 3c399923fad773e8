"""The ledger of a run's prompt groups: which groups were drawn, which step trained each, which were dropped and why.
Pure (no Ray); the rollout buffer keeps it, a checkpoint saves it, a resume or restart loads it with the weights.

A group is named by (epoch, dataset row): a producer's cursor hands out each row of its shard once per epoch, so the
pair names one group over the whole run, across producers, kills and restarts. A group's fate is one of: trained (by
exactly one step; a step that takes a group already trained is refused before it trains), dropped (``zero_signal``:
DAPO's dynamic sampling; ``stale``: beyond the staleness bound), or waiting (drawn ahead, in the buffer when the run
ended). ``account`` checks the fates against what the producers' cursors handed out: a group handed out but never
drawn, or drawn but given no fate, is lost.

After a kill, the run goes on from its last checkpoint: the weights, the cursors and this ledger as they were then,
so the groups trained or drawn since (in flight at the kill) are drawn again and trained once, in the timeline that
continues.
"""

from __future__ import annotations

import numpy as np

from coati.distributed.record import RolloutBatch

DROP_REASONS = ("zero_signal", "stale")


def group_keys(batch: RolloutBatch, group_size: int) -> list[tuple[int, int]]:
    """(epoch, dataset row) of each group of ``batch`` (whole groups of ``group_size`` consecutive rows)."""
    rows = np.asarray(batch.extras["prompt_index"])[::group_size]
    epochs = np.asarray(batch.extras.get("episode", np.zeros(len(batch), dtype=np.int64)))[::group_size]
    return [(int(e), int(r)) for e, r in zip(epochs, rows, strict=True)]


class GroupTrainedTwice(RuntimeError):
    """A step took a group that an earlier step of the same run trained."""


class Ledger:
    def __init__(self, group_size: int):
        self.group_size = group_size
        self.drawn: dict[tuple[int, int], int] = {}
        """group -> the step it was drawn for"""
        self.trained: dict[tuple[int, int], int] = {}
        """group -> the step that trained it"""
        self.dropped: dict[tuple[int, int], str] = {}
        """group -> why it was dropped (``DROP_REASONS``); a zero-signal group a short step took is trained instead"""
        self.drawn_twice: list[tuple[int, int]] = []
        """groups that arrived a second time (a cursor handed a row out twice in one epoch)"""

    # ---- events ----------------------------------------------------------------------------------------------

    def draw(self, batch: RolloutBatch, step: int) -> None:
        for key in group_keys(batch, self.group_size):
            if key in self.drawn:
                self.drawn_twice.append(key)
            self.drawn[key] = step

    def drop(self, batch: RolloutBatch, why: str) -> None:
        assert why in DROP_REASONS, why
        for key in group_keys(batch, self.group_size):
            self.dropped[key] = why

    def train(self, batch: RolloutBatch, step: int) -> None:
        """Record that ``step`` trains ``batch``'s groups; refuse (``GroupTrainedTwice``) a group trained before."""
        keys = group_keys(batch, self.group_size)
        again = [(k, self.trained[k]) for k in keys if k in self.trained]
        if again:
            (epoch, row), earlier = again[0]
            raise GroupTrainedTwice(
                f"step {step} would train the group of dataset row {row} (epoch {epoch}) that step {earlier} trained "
                f"({len(again)} such groups); the run's data order is broken: report it with the run folder"
            )
        for key in keys:
            self.trained[key] = step
            self.dropped.pop(key, None)

    # ---- the account -----------------------------------------------------------------------------------------

    def account(self, waiting: list[tuple[int, int]], handed_out: list[dict] | None = None) -> dict:
        """Every drawn group's fate, counted: {drawn, trained, dropped_zero_signal, dropped_stale, waiting, skipped,
        drawn_twice, lost, lost_groups (the first ten)}. ``waiting``: the groups in the buffer; ``handed_out``: each
        producer's cursor's ``handed_out()`` ({"taken", "skipped"}: (epoch, row) pairs), to find groups handed out
        but never drawn (None: not checked)."""
        waiting_set = set(waiting) - set(self.trained)
        dropped = [why for key, why in self.dropped.items() if key not in waiting_set]  # ``train`` takes a key out
        fated = set(self.trained) | set(self.dropped) | waiting_set
        lost = sorted(set(self.drawn) - fated)
        skipped = 0
        if handed_out is not None:
            taken = {tuple(p) for h in handed_out for p in h["taken"]}
            skipped = sum(len(h["skipped"]) for h in handed_out)
            lost = sorted(set(lost) | (taken - set(self.drawn)))
        return {
            "drawn": len(self.drawn),
            "trained": len(self.trained),
            "dropped_zero_signal": dropped.count("zero_signal"),
            "dropped_stale": dropped.count("stale"),
            "waiting": len(waiting_set),
            "skipped": skipped,
            "drawn_twice": len(self.drawn_twice),
            "lost": len(lost),
            "lost_groups": [list(k) for k in lost[:10]],
        }

    # ---- checkpoints -----------------------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON: [epoch, row, step] triples and [epoch, row, reason] ones."""
        return {
            "drawn": [[e, r, s] for (e, r), s in self.drawn.items()],
            "trained": [[e, r, s] for (e, r), s in self.trained.items()],
            "dropped": [[e, r, why] for (e, r), why in self.dropped.items()],
            "drawn_twice": [list(k) for k in self.drawn_twice],
        }

    def restore(self, state: dict) -> None:
        self.drawn = {(int(e), int(r)): int(s) for e, r, s in state["drawn"]}
        self.trained = {(int(e), int(r)): int(s) for e, r, s in state["trained"]}
        self.dropped = {(int(e), int(r)): str(why) for e, r, why in state["dropped"]}
        self.drawn_twice = [(int(e), int(r)) for e, r in state.get("drawn_twice", [])]
