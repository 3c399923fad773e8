"""Rollout rounds into the buffer: how many prompts each producer draws, the round in flight, admitting its rows
for the step being assembled, and drawing ahead while a step trains, within the staleness bound (``Run`` drives it
step by step)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from coati.distributed.driver.actor_group import get, ready, wait_any
from coati.distributed.driver.rollout_buffer import RolloutBuffer
from coati.distributed.guards import check_reward_failures, check_unscored
from coati.distributed.record import RewardStatus, RolloutBatch

log = logging.getLogger(__name__)


@dataclass
class Round:
    """A rollout round in flight."""

    refs: list
    for_step: int
    version: int
    """the producers' weight version when it started: its rows' oldest tokens"""


@dataclass
class Progress:
    """Where the run stands, shared by the loop and its rollouts."""

    version: int = 0
    """the weights the producers hold (the last step trained and pushed)"""
    start_step: int = 0
    """the step the run started after (a resumed checkpoint's)"""
    reported_step: int = 0
    """the last step whose metrics were reported (a round that outlives its step counts toward the next)"""


class Rollouts:
    """The rollout rounds of a run and the buffer they fill."""

    def __init__(self, config, actors, progress: Progress, in_flight: bool):
        self.cfg, self.actors, self.progress, self.in_flight = config, actors, progress, in_flight
        self.max_staleness = config.run.max_staleness
        a = config.algo_config
        self.buffer = RolloutBuffer(
            config.global_train_batch_size,
            config.producer.num_generations,
            self.max_staleness,
            a.dynamic_sampling,
            a.dynamic_sampling_signal,
            a.dynamic_sampling_max_draws,
        )
        self.round: Round | None = None
        self.unscored_draws = 0
        """draws in a row in which the reward scored no completion"""

    def draw_sizes(self, missing_groups: int) -> list[int]:
        """Prompts each producer draws in one round. A run that keeps every group it draws (no dynamic sampling) asks
        for no more than the steps it draws for lack (the step's, or with k >= 1 the next k steps'), since a leftover
        group would be dropped as stale later (PPO drew 16 prompts a round for steps of 4 and dropped 12); with
        dynamic sampling, which drops groups without signal, every producer draws ``inference_batch_size``."""
        size, n = self.cfg.producer.inference_batch_size, len(self.actors.producers)
        if self.max_staleness >= 1 and self.cfg.algo_config.dynamic_sampling:
            return [size] * n
        missing = max(missing_groups, 1)
        return [min(size, missing // n + (i < missing % n)) for i in range(n)]

    def start_round(self, for_step: int, missing_groups: int, training: bool) -> None:
        assert self.round is None, "one rollout round at a time"
        self.buffer.log(for_step).draws += 1
        refs = self.actors.generate(self.draw_sizes(missing_groups), training)
        self.round = Round(refs, for_step, self.progress.version)

    def collect(self) -> None:
        """Wait for the round in flight; each producer's draw is checked, then admitted for the step being
        assembled (a round that outlived the step it was started for counts toward the next)."""
        r, self.round = self.round, None
        for_step = max(r.for_step, self.progress.reported_step + 1)
        for batch in get(r.refs, "rollout"):
            check_reward_failures(
                batch.failed(),
                batch.reward_status == RewardStatus.TIMEOUT,
                batch.reward_error,
                batch.extras["prompt_index"],
                self.cfg.reward.scored_by,
                self.cfg.reward.max_error_fraction,
                self.cfg.reward.stop_on_first_step_error and self.progress.version == self.progress.start_step,
                f"rollout for step {for_step}",
            )
            self.unscored_draws = check_unscored(
                batch.unscored(),
                self.unscored_draws,
                self.progress.version == self.progress.start_step,
                self.cfg.reward.scored_by,
                f"rollout for step {for_step}",
            )
            self.buffer.admit(batch, for_step)

    def settle(self) -> None:
        """Land the round in flight (before evaluating, checkpointing or stopping)."""
        if self.round is not None:
            self.collect()

    def take(self, step: int) -> RolloutBatch:
        """The batch of ``step`` (trained from version step - 1), drawing while the buffer is short. A round still in
        flight is waited for when the batch needs it, or when its rows would be beyond the bound a step later."""
        buf, draws, need = self.buffer, self.buffer.log(step), self.buffer.groups_per_step
        if self.round is not None and (buf.groups(step - 1) < need or self.round.version + self.max_staleness < step):
            self.collect()
        buf.drop_stale(step - 1, draws)
        per_draw = sum(self.draw_sizes(need))
        while buf.groups() < need:
            if draws.draws >= buf.draws_allowed(per_draw):
                short = need - buf.groups()
                buf.fill_short(draws)
                log.warning(
                    "dynamic sampling: %d draws left step %d short; filled with %d zero-signal groups",
                    draws.draws,
                    step,
                    short,
                )
                break
            self.start_round(step, need - buf.groups(), training=False)
            self.collect()
            buf.drop_stale(step - 1, draws)  # a streaming engine returns groups it began versions ago
        return buf.take(step - 1)

    def fills_while_training(self, step: int, total: int) -> bool:
        """Whether producers will roll out while step ``step`` trains (a round in flight, or the next steps' groups
        still short of what ``max_staleness`` lets them draw ahead)."""
        if self.max_staleness < 1 or step >= total:
            return False
        return self.round is not None or self.buffer.groups(step) < self.buffer.fill_target(total - step)

    def fill_while_training(self, train_refs, step: int, total: int) -> None:
        """While step ``step`` trains, roll out with the weights the producers hold (version step - 1) for the next
        steps, up to ``max_staleness`` steps' worth of groups (the pacing that keeps the bound), and only while
        training is still running. Draining, the push then waits for the round in flight, which takes the consumers'
        cores once training has ended; in flight, the push does not wait, and the round takes them once the push has
        landed (not during the push, which has the consumers sending), and gives them back if the next step's training
        starts before it ends."""
        target = self.buffer.fill_target(total - step)
        while not ready(train_refs):
            if self.round is None:
                if self.buffer.groups(step) >= target:
                    self.actors.lend_to_consumers()  # the producers are done until the push
                    break
                self.start_round(step + 1, target - self.buffer.groups(step), training=True)
            wait_any(self.round.refs, train_refs, what=f"rollout and training step {step}")
            if ready(self.round.refs):
                self.collect()
        if not self.in_flight:  # the push waits for the round in flight, which takes the idle consumers' cores
            if self.round is not None:
                self.actors.lend_to_producers()
            self.settle()
