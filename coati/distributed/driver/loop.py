"""The produce -> consume -> push loop, over the actors of ``actor_group.py``.

The loop keeps scored groups in a ``RolloutBuffer`` (``rollout_buffer.py``). A step takes ``train_batch_size *
dp_size`` groups from it (drawing more rollouts while it is short: DAPO's dynamic sampling drops zero-signal groups and
refills instead of skipping steps), trains, and pushes weights. With ``max_staleness = k >= 1`` the producers keep
rolling out with the weights they hold while the consumers train, up to k steps' worth of groups ahead; every token
records the weight version that sampled it, and no row whose oldest token is more than k versions behind the weights
it is trained from is trained.

One rollout round (a call to every producer) is in flight at a time. By default a push waits for it (drain); with
in-flight updates the push goes out at once and the producers load it mid-round, and the round stays in flight into
the next step as long as its rows would still be within the bound when trained one step later.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from coati.distributed.config.tree import Config
from coati.distributed.driver.actor_group import ActorGroups, RunError, get, ready, wait_any
from coati.distributed.driver.checkpoint import (
    CheckpointManager,
    config_dict,
    export_adapter,
    export_model,
    read_checkpoint,
    write_checkpoint,
)
from coati.distributed.driver.preflight import Plan
from coati.distributed.driver.reporting import phase
from coati.distributed.driver.rollout_buffer import RolloutBuffer
from coati.distributed.guards import RewardFailure, check_engine_trainer_gap, check_reward_failures, gap_tolerance
from coati.distributed.lora import peft_config
from coati.distributed.metrics import check_declared
from coati.distributed.record import RewardStatus, RolloutBatch
from coati.distributed.rollout.evaluation import EvalShare
from coati.distributed.trainer.step_metrics import rollout_metrics

log = logging.getLogger(__name__)


@dataclass
class Round:
    """A rollout round in flight."""

    refs: list
    for_step: int
    version: int
    """the producers' weight version when it started: its rows' oldest tokens"""


def evaluation_result(results: list[EvalShare], reward) -> dict:
    """The producers' held-out evaluations as one: strict and lenient accuracy, counts and every item's prediction
    (``eval_samples``); too many scoring failures (``reward.max_error_fraction``) stop the run."""
    count = sum(r.count for r in results)
    if not count:
        return {}
    errors = sum(r.reward_errors for r in results)
    if errors > reward.max_error_fraction * count:
        first = next(r.first_error for r in results if r.first_error)
        raise RewardFailure(
            f"evaluation: reward function {reward.fn} failed on {errors} of {count} held-out items; "
            f"first error: {first}"
        )
    return {
        "eval/strict": sum(r.strict_correct for r in results) / count,
        "eval/lenient": sum(r.lenient_correct for r in results) / count,
        "eval/count": count,
        "eval/reward_errors": errors,
        "eval_samples": sorted((i for r in results for i in r.items), key=lambda i: i["index"]),
    }


class Run:
    def __init__(self, config: Config, plan: Plan, run_name: str):
        """``config``: the run's tree, whole; ``plan``: what preflight derived from it."""
        cfg, r = config, config.run
        self.cfg, self.plan, self.seed = config, plan, r.seed
        self.timeout_s, self.max_staleness = r.weight_sync_timeout_s, r.max_staleness
        self.sleep_while_training, self.in_flight = r.sleep_while_training, plan.in_flight
        self.actors = ActorGroups(config, plan, run_name)
        self.run_name = run_name
        self.version = 0
        self.push_stats: dict = {}
        self.start_step = 0
        self.last_checkpoint: str | None = None
        a = cfg.algo_config
        self.buffer = RolloutBuffer(
            cfg.global_train_batch_size,
            cfg.producer.num_generations,
            self.max_staleness,
            a.dynamic_sampling,
            a.dynamic_sampling_signal,
            a.dynamic_sampling_max_draws,
        )
        self.round: Round | None = None
        self.reported_step = 0
        self.record: dict = {}
        """the config and identity a checkpoint records (set by the driver)"""
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(plan.tokenizer_path)

    # ---- actors (see actor_group.py) -----------------------------------------------------------------------------

    @property
    def producers(self) -> list:
        return self.actors.producers

    @property
    def consumers(self) -> list:
        return self.actors.consumers

    def start_actors(self) -> None:
        self.actors.start()

    def connect_weight_group(self) -> None:
        self.actors.connect_weight_group(self.timeout_s)

    def push_weights(self) -> float:
        start = time.perf_counter()
        self.push_stats = self.actors.push_weights(self.version)
        return time.perf_counter() - start

    def full_weights(self) -> dict:
        return self.actors.full_weights()

    def shutdown(self) -> None:
        self.actors.shutdown()

    # ---- checkpoints and export (see checkpoint.py) --------------------------------------------------------------

    def checkpoint(self, manager, step: int) -> str:

        self._settle()  # a round in flight lands in the buffer, which the checkpoint holds
        meta = {
            "version": self.version,
            "config": config_dict(self.cfg),
            "run_name": self.run_name,
            "identity": self.record.get("identity", {}),
            "dataset": self.record.get("dataset", {}),
        }

        def adapter(folder: str) -> None:  # a LoRA run's checkpoint holds its adapter as a PEFT folder too
            self.save_adapter(os.path.join(folder, "adapter"))

        also = adapter if self.cfg.consumer.lora_rank else None
        self.last_checkpoint = write_checkpoint(self.actors, manager, step, self.buffer.state(), meta, also=also)
        return self.last_checkpoint

    def restore(self, folder: str) -> int:
        """Load a checkpoint (already checked against this run by the driver) into the running actors; returns the
        step it was taken after."""

        meta, buffer = read_checkpoint(self.actors, folder)
        self.buffer.restore(buffer)
        self.version = self.start_step = self.reported_step = meta["step"]
        self.last_checkpoint = str(folder)
        return self.start_step

    def save(self, path: str) -> str:
        """Write the trained model as a Hugging Face folder (weights, config, tokenizer), atomically; with LoRA the
        adapter as a PEFT folder, and the merged model in ``<path>/merged`` when ``lora_export_merged``."""

        c = self.cfg.consumer
        if not c.lora_rank:
            return export_model(self.full_weights(), self.plan.train_model_path, self.tokenizer, path)
        self.save_adapter(path)
        if c.lora_export_merged:
            export_model(self.full_weights(), self.plan.train_model_path, self.tokenizer, os.path.join(path, "merged"))
        return path

    def save_adapter(self, path: str) -> str:
        """The consumers' LoRA adapter (DP replicas hold the same one) as a PEFT folder."""

        adapter = get(self.actors.consumers[0].adapter.remote(), "gathering the adapter")
        c = self.cfg.consumer
        config = peft_config(
            c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_target_modules, self.plan.train_model_path
        )
        return export_adapter(adapter, config, self.tokenizer, path)

    # ---- rollouts --------------------------------------------------------------------------------------------

    def _draw_sizes(self, missing_groups: int) -> list[int]:
        """Prompts each producer draws in one round. Synchronous runs (k = 0) ask for no more than the step lacks, since
        a leftover group would be stale by the next step; otherwise every producer draws ``inference_batch_size``."""
        size, n = self.cfg.producer.inference_batch_size, len(self.producers)
        if self.max_staleness >= 1:
            return [size] * n
        missing = max(missing_groups, 1)
        return [min(size, missing // n + (i < missing % n)) for i in range(n)]

    def _start_round(self, for_step: int, missing_groups: int, training: bool) -> None:
        assert self.round is None, "one rollout round at a time"
        self.buffer.log(for_step).draws += 1
        refs = self.actors.generate(self._draw_sizes(missing_groups), training)
        self.round = Round(refs, for_step, self.version)

    def _collect(self) -> None:
        """Wait for the round in flight; each producer's draw is checked, then admitted for the step being
        assembled (a round that outlived the step it was started for counts toward the next)."""
        r, self.round = self.round, None
        for_step = max(r.for_step, self.reported_step + 1)
        for batch in get(r.refs, "rollout"):
            check_reward_failures(
                batch.failed(),
                batch.reward_status == RewardStatus.TIMEOUT,
                batch.reward_error,
                batch.extras["prompt_index"],
                self.cfg.reward.fn,
                self.cfg.reward.max_error_fraction,
                self.cfg.reward.stop_on_first_step_error and self.version == self.start_step,
                f"rollout for step {for_step}",
            )
            self.buffer.admit(batch, for_step)

    def _settle(self) -> None:
        """Land the round in flight (before evaluating, checkpointing or stopping)."""
        if self.round is not None:
            self._collect()

    def _take(self, step: int) -> RolloutBatch:
        """The batch of ``step`` (trained from version step - 1), drawing while the buffer is short. A round still in
        flight is waited for when the batch needs it, or when its rows would be beyond the bound a step later."""
        buf, draws, need = self.buffer, self.buffer.log(step), self.buffer.groups_per_step
        if self.round is not None and (buf.groups(step - 1) < need or self.round.version + self.max_staleness < step):
            self._collect()
        buf.drop_stale(step - 1, draws)
        per_draw = sum(self._draw_sizes(need))
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
            self._start_round(step, need - buf.groups(), training=False)
            self._collect()
            buf.drop_stale(step - 1, draws)  # a streaming engine returns groups it began versions ago
        return buf.take(step - 1)

    def _fills_while_training(self, step: int, total: int) -> bool:
        """Whether producers will roll out while step ``step`` trains (a round in flight, or the next steps' groups
        still short of what ``max_staleness`` lets them draw ahead)."""
        if self.max_staleness < 1 or step >= total:
            return False
        return self.round is not None or self.buffer.groups(step) < self.buffer.fill_target(total - step)

    def _fill_while_training(self, train_refs, step: int, total: int) -> None:
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
                self._start_round(step + 1, target - self.buffer.groups(step), training=True)
            wait_any(self.round.refs, train_refs)
            if ready(self.round.refs):
                self._collect()
        if not self.in_flight:  # the push waits for the round in flight, which takes the idle consumers' cores
            if self.round is not None:
                self.actors.lend_to_producers()
            self._settle()

    # ---- loop ------------------------------------------------------------------------------------------------

    def evaluate(self) -> dict:
        self._settle()
        return evaluation_result(self.actors.evaluate(), self.cfg.reward)

    def loop(self, max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints: int = 2) -> dict:
        try:
            return self._loop(max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints)
        except RunError as e:
            raise RunError(f"{e}\nlast checkpoint: {self.last_checkpoint or 'none'}") from e

    def _loop(self, max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints) -> dict:
        import ray

        manager = CheckpointManager(os.path.join(save_dir, "checkpoints"), keep_checkpoints) if save_dir else None
        total = self.cfg.run.num_episodes * self.plan.steps_per_episode
        total = min(total, max_steps) if max_steps else total
        history, evals = [], []
        info = self.actors.producer_info, self.actors.consumer_info
        engine_dtypes = {i["weight_dtype"] for i in info[0]}
        tolerance = gap_tolerance(
            self.cfg.consumer.max_engine_trainer_gap,
            engine_dtypes.pop() if len(engine_dtypes) == 1 else None,
            self.cfg.consumer.plugin.precision == "fp32" and all(i["compute_dtype"] == "fp32" for i in info[1]),
        )
        # With a held-out set: before training, at the end, and every eval_interval steps when that is > 0.
        if self.plan.eval_dataset and self.start_step == 0:
            phase("evaluating before training")
            evaluation = self.evaluate()
            predictions = evaluation.pop("eval_samples", None)
            evals.append({"step": 0, **evaluation})
            check_declared(evals[-1])
            if on_step is not None:
                on_step({**evals[-1], "eval_samples": predictions} if predictions else dict(evals[-1]))
        for step in range(self.start_step + 1, total + 1):
            if step == self.start_step + 1:
                phase(f"step {step}: first rollouts and training")
            t0 = time.perf_counter()
            batch = self._take(step)
            t_rollout = time.perf_counter() - t0
            asleep = self.actors.sleep() if self.sleep_while_training else {}
            if self.round is not None:  # still in flight (pushes load mid-round): it gives back the consumers' cores
                self.actors.take_back_from_producers()
            train_refs = self.actors.train(ray.put(batch), self._fills_while_training(step, total), total)
            t1 = time.perf_counter()
            if self.max_staleness >= 1 and step < total:
                self._fill_while_training(train_refs, step, total)
            # With pipeline parallelism only the last stage sees the loss: report the fullest metrics.
            train_metrics = max(get(train_refs, f"training step {step}"), key=len)
            t_train = time.perf_counter() - t1
            self.version = step
            if self.sleep_while_training:
                asleep["time/wake"] = self.actors.wake()
            t_push = self.push_weights()
            if self.round is not None:  # pushed mid-round: the round still in flight takes the idle consumers' cores
                self.actors.lend_to_producers()
            metrics = {
                "step": step,
                "total_steps": total,
                **self._step_metrics(step, batch),
                "time/rollout_wait": t_rollout,
                "time/train": t_train,
                "time/weight_push": t_push,
                "time/step": time.perf_counter() - t0,
                **self.push_stats,
            }
            # Driver time that is none of: waiting for rollouts, training, pushing weights (batching, object store
            # puts, metrics). Rollout wait itself is generation + reward + transfer, reported by the producers.
            metrics["time/overhead"] = max(metrics["time/step"] - t_rollout - t_train - t_push, 0.0)
            metrics.update({**train_metrics, **asleep})
            if self.plan.sandbox is not None:  # 1: model-written code ran without bwrap (allow_degraded_sandbox)
                metrics["reward/sandbox_degraded"] = float(self.plan.sandbox_degraded)
            predictions = None
            if self.plan.eval_dataset and ((eval_interval and step % eval_interval == 0) or step == total):
                evaluation = self.evaluate()
                predictions = evaluation.pop("eval_samples", None)
                evals.append({"step": step, **evaluation})
                metrics.update(evals[-1])
            history.append(metrics)
            check_declared(metrics)
            if on_step is not None:
                on_step({**metrics, "eval_samples": predictions} if predictions else metrics)
            check_engine_trainer_gap(metrics, tolerance, step)
            if manager is not None and ((save_interval and step % save_interval == 0) or step == total):
                self.checkpoint(manager, step)
        self._settle()
        final = self.save(os.path.join(save_dir, "final")) if save_dir else None
        return {"history": history, "evals": evals, "final_model": final, "total_steps": total}

    def _step_metrics(self, step: int, batch: RolloutBatch) -> dict:
        self.reported_step = step
        return rollout_metrics(
            step,
            batch,
            self.buffer.logs.pop(step),
            self.cfg.producer.num_generations,
            self.max_staleness,
            self.tokenizer,
        )
