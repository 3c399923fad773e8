"""How a producer draws the groups of a rollout call (``Draw``: which prompts, their rollouts, their reward futures).
``Rounds`` generates the next prompts to the end, micro-batch by micro-batch, each micro-batch's completions sent to
the reward pool as it ends; ``Stream`` keeps the engine at ``stream_prompts`` groups, adds a prompt as each group
finishes and returns groups in the order they finish, the unfinished ones staying in the engine for the next call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from coati.distributed.record import RolloutBatch, oldest_versions
from coati.distributed.rollout.data import DataCursor


@dataclass
class Draw:
    """The groups of one rollout call."""

    picks: list[tuple[int, int]] = field(default_factory=list)
    """(episode, row) of each group, in the order of the batches' groups"""
    batches: list[RolloutBatch] = field(default_factory=list)
    futures: list = field(default_factory=list)
    """the reward futures of the batches' rows, in order"""
    generate_s: float = 0.0
    """seconds spent generating"""

    def label(self, n: int) -> None:
        """Mark each batch's rows with their prompt's row and episode, and number the groups across the batches."""
        lo = 0
        for batch in self.batches:
            chunk = self.picks[lo : lo + len(batch) // n]
            batch.extras["prompt_index"] = np.repeat(np.array([i for _, i in chunk], dtype=np.int64), n)
            batch.extras["episode"] = np.repeat(np.array([e for e, _ in chunk], dtype=np.int64), n)
            batch.group_ids = batch.group_ids + lo  # unique within this call
            lo += len(chunk)
        assert lo == len(self.picks), (lo, len(self.picks))


def label_versions(out: RolloutBatch, start_version: int) -> None:
    """Each token's weight version and each row's oldest: a backend that loads pushes mid-batch labels each token;
    otherwise the whole batch is of the version its call started with."""
    start = np.full(len(out), start_version, dtype=np.int64)
    if out.token_versions is None:
        out.token_versions = np.where(out.response_mask, start[:, None], 0)
    out.policy_version = oldest_versions(out.token_versions, out.trained_mask(), start)


class Rounds:
    """Each call generates its prompts to the end."""

    def __init__(
        self,
        cursor: DataCursor,
        rows: list[dict],
        microbatch_size: int,
        rollouts: Callable[[list[dict]], tuple[RolloutBatch, list]],
    ):
        self.cursor, self.rows, self.microbatch_size, self.rollouts = cursor, rows, microbatch_size, rollouts

    def draw(self, num_prompts: int) -> Draw:
        out = Draw(picks=self.cursor.take(num_prompts))
        for lo in range(0, len(out.picks), self.microbatch_size):
            t0 = time.perf_counter()
            batch, scored = self.rollouts([self.rows[i] for _, i in out.picks[lo : lo + self.microbatch_size]])
            out.generate_s += time.perf_counter() - t0
            out.futures.extend(scored)
            out.batches.append(batch)
        return out

    def withdraw(self) -> None:
        """Nothing stays in the engine between calls."""


class Stream:
    """The engine kept at ``size`` groups across calls (their tokens record the versions that sampled them)."""

    def __init__(
        self,
        cursor: DataCursor,
        rows: list[dict],
        size: int,
        backend,
        encode: Callable[[dict], list[int]],
        num_generations: int,
        score: Callable[[RolloutBatch, list[dict]], list],
    ):
        self.cursor, self.rows, self.size, self.backend = cursor, rows, size, backend
        self.encode, self.n, self.score = encode, num_generations, score
        self.in_engine: dict[int, tuple[int, int]] = {}
        """submitted key -> (episode, row) of each group the engine holds"""
        self.submitted = 0
        """groups submitted so far (each one's key)"""

    def draw(self, num_prompts: int) -> Draw:
        out = Draw()
        while len(out.picks) < num_prompts:
            t0 = time.perf_counter()
            for pick in self.cursor.take(self.size - len(self.in_engine)):
                self.submitted += 1
                self.in_engine[self.submitted] = pick
                self.backend.submit(self.submitted, self.encode(self.rows[pick[1]]), self.n)
            finished = self.backend.collect()
            out.generate_s += time.perf_counter() - t0
            for key, batch in finished:
                pick = self.in_engine.pop(key)
                out.picks.append(pick)
                out.batches.append(batch)
                out.futures.extend(self.score(batch, [self.rows[pick[1]]]))
        return out

    def withdraw(self) -> None:
        """Empty the engine: its unfinished groups' prompts go back to the cursor, to be drawn first."""
        if self.in_engine:
            self.cursor.give_back([self.in_engine.pop(key) for key in self.backend.withdraw()])
        assert not self.in_engine, "every group in the engine was withdrawn"
