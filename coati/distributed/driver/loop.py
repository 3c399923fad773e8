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

from coati.distributed.config.tree import Config
from coati.distributed.driver import eval_cache
from coati.distributed.driver.actor_group import ActorGroups, RunError, get
from coati.distributed.driver.checkpoint import (
    CheckpointManager,
    config_dict,
    export_critic,
    export_lora,
    export_policy,
    final_folder,
    load_teacher,
    read_checkpoint,
    save_teacher,
    write_checkpoint,
)
from coati.distributed.driver.experience import ExperienceMaker
from coati.distributed.driver.preflight import Plan, horizon
from coati.distributed.driver.reporting import FIRST_STEP_TRAINED, actors_started, loop_phase, phase
from coati.distributed.driver.rollouts import Progress, Rollouts
from coati.distributed.guards import RewardFailure, check_engine_trainer_gap, gap_tolerance
from coati.distributed.loggers.metrics import check_declared
from coati.distributed.record import RolloutBatch
from coati.distributed.rollout.evaluation import EvalShare
from coati.distributed.rollout.images import load_processor
from coati.distributed.trainer.step_metrics import rollout_metrics

log = logging.getLogger(__name__)


def evaluation_result(results: list[EvalShare], reward) -> dict:
    """The producers' held-out evaluations as one: the mean reward of the scored items; strict and lenient accuracy
    where the reward defines them, else (a reward returning numbers) the share of items at the reward's maximum;
    counts and every item's prediction (``eval_samples``); too many scoring failures (``reward.max_error_fraction``)
    stop the run."""
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
    scored = sum(r.scored for r in results)
    result = {"eval/reward_mean": sum(r.reward_sum for r in results) / scored if scored else float("nan")}
    if sum(r.plain for r in results) == count - errors:  # a number reward: no strict/lenient check of its own
        result["eval/at_max"] = sum(r.strict_correct for r in results) / count
    else:
        result["eval/strict"] = sum(r.strict_correct for r in results) / count
        result["eval/lenient"] = sum(r.lenient_correct for r in results) / count
    return {
        **result,
        "eval/count": count,
        "eval/reward_errors": errors,
        "eval_samples": sorted((i for r in results for i in r.items), key=lambda i: i["index"]),
    }


class Run:
    def __init__(self, config: Config, plan: Plan, run_name: str):
        """``config``: the run's tree, whole; ``plan``: what preflight derived from it."""
        r = config.run
        self.cfg, self.plan, self.seed = config, plan, r.seed
        self.timeout_s, self.max_staleness = r.weight_sync_timeout_s, r.max_staleness
        self.sleep_while_training, self.offload_trainers = r.sleep_while_training, r.offload_trainers
        self.actors = ActorGroups(config, plan, run_name)
        self.run_name = run_name
        self.push_stats: dict = {}
        self.last_checkpoint: str | None = None
        self.progress = Progress()
        self.rollouts = Rollouts(config, self.actors, self.progress, plan.in_flight)
        self.experience = ExperienceMaker(config.algo_config, self.actors)
        self.record: dict = {}
        """the config and identity a checkpoint records (set by the driver)"""
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(plan.tokenizer_path)
        self.model_files = load_processor(plan.processor_path) if plan.processor_path else self.tokenizer
        """what an exported model folder holds beside its weights: a vision-language model's processor (its
        tokenizer, image processor and chat template), else the tokenizer"""

    # ---- actors (see actor_group.py) -----------------------------------------------------------------------------

    @property
    def producers(self) -> list:
        return self.actors.producers

    @property
    def consumers(self) -> list:
        return self.actors.consumers

    def start_actors(self) -> None:
        self.actors.start()
        actors_started(self.run_name, self.actors.startup())
        trainers = self.actors.consumer_info + self.actors.critic_info
        if self.offload_trainers and all(i["device"] == "cpu" for i in trainers):
            log.info("offload_trainers: the trainers run on the CPU, where their states already lie: nothing moves")

    def connect_weight_group(self) -> None:
        self.actors.connect_weight_group(self.timeout_s)

    def push_weights(self) -> float:
        start = time.perf_counter()
        self.push_stats = self.actors.push_weights(self.progress.version)
        return time.perf_counter() - start

    def full_weights(self) -> dict:
        return self.actors.full_weights()

    def shutdown(self) -> None:
        self.actors.shutdown()

    # ---- checkpoints and export (see checkpoint.py) --------------------------------------------------------------

    def checkpoint(self, manager, step: int) -> str:

        self.rollouts.settle()  # a round in flight lands in the buffer, which the checkpoint holds
        meta = {
            "version": self.progress.version,
            "config": config_dict(self.cfg),
            "run_name": self.run_name,
            "identity": self.record.get("identity", {}),
            "dataset": self.record.get("dataset", {}),
            "experience": self.experience.state(),
            "teacher_version": self.actors.teacher_version,
        }

        def adapter(folder: str) -> None:  # a LoRA run's checkpoint holds its adapter as a PEFT folder too
            c, path = self.cfg.consumer, os.path.join(folder, "adapter")
            export_lora(self.actors, c, self.plan.train_model_path, self.tokenizer, path)

        def extras(folder: str) -> None:
            if self.actors.teacher_version:  # a self-teacher's weights, older than the checkpoint's policy
                save_teacher(self.actors.teacher_weights, folder)
            if self.cfg.consumer.lora_rank:
                adapter(folder)
            if self.cfg.run.save_hf_checkpoints:  # the policy as a Hugging Face folder, as final/ holds it
                self.save(os.path.join(folder, "hf"))

        buffer = self.rollouts.buffer
        self.last_checkpoint = write_checkpoint(
            self.actors, manager, step, buffer.state(), buffer.ledger.state(), meta, also=extras
        )
        return self.last_checkpoint

    def restore(self, folder: str) -> int:
        """Load a checkpoint (already checked against this run by the driver) into the running actors; returns the
        step it was taken after."""

        meta, state = read_checkpoint(self.actors, folder)
        self.rollouts.buffer.restore(state["buffer"], state["ledger"])
        self.experience.restore(meta.get("experience"))
        if meta.get("teacher_version"):  # the self-teacher the run had at that step
            self.actors.refresh_teachers(meta["teacher_version"], load_teacher(folder))
        p = self.progress
        p.version = p.start_step = p.reported_step = meta["step"]
        self.last_checkpoint = str(folder)
        return self.progress.start_step

    def save(self, path: str) -> str:
        """The trained model as a Hugging Face folder (``export_policy``)."""
        return export_policy(self.actors, self.cfg.consumer, self.plan.train_model_path, self.model_files, path)

    # ---- loop ------------------------------------------------------------------------------------------------

    def evaluate(self) -> dict:
        self.rollouts.settle()
        return evaluation_result(self.actors.evaluate(), self.cfg.reward)

    def loop(self, max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints: int = 2) -> dict:
        try:
            return self._loop(max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints)
        except RunError as e:
            raise RunError(f"{e}\nlast checkpoint: {self.last_checkpoint or 'none'}") from e

    def _loop(self, max_steps, eval_interval, save_interval, save_dir, on_step, keep_checkpoints) -> dict:

        manager = CheckpointManager(os.path.join(save_dir, "checkpoints"), keep_checkpoints) if save_dir else None
        total = horizon(self.cfg.run.num_episodes * self.plan.steps_per_episode, max_steps)
        history, evals = [], []
        tolerance = self._gap_tolerance()
        if self.offload_trainers:  # the evaluation before training and the first rollouts have the accelerators too
            self.actors.offload_trainers()
        # With a held-out set: before training, at the end, and every eval_interval steps when that is > 0.
        if self.plan.eval_dataset and self.progress.start_step == 0:
            predictions = self._evaluate_base(evals)
            check_declared(evals[-1])
            if on_step is not None:
                on_step({**evals[-1], "eval_samples": predictions} if predictions else dict(evals[-1]))
        limit, started = self.cfg.run.time_limit_s, time.monotonic()
        for step in range(self.progress.start_step + 1, total + 1):
            if step == self.progress.start_step + 1:
                phase(loop_phase(step))
            metrics = self._step(step, total)
            if step == self.progress.start_step + 1:
                phase(FIRST_STEP_TRAINED)  # the start-up account ends here, before any evaluation after the step
            last = step == total or (limit is not None and time.monotonic() - started >= limit)
            predictions = None
            if self.plan.eval_dataset and ((eval_interval and step % eval_interval == 0) or last):
                predictions = self._evaluate_at(step, evals)
                metrics.update(evals[-1])
            history.append(metrics)
            check_declared(metrics)
            if on_step is not None:
                on_step({**metrics, "eval_samples": predictions} if predictions else metrics)
            check_engine_trainer_gap(metrics, tolerance, step)
            if manager is not None and ((save_interval and step % save_interval == 0) or last):
                self.checkpoint(manager, step)
                if self.offload_trainers and not last:  # saving moved the states back
                    self.actors.offload_trainers()
            if last:  # the horizon, or the time limit: evaluated and saved as the run's end
                break
        self.rollouts.settle()
        groups = self.account_groups()
        final = self.save(final_folder(save_dir)) if save_dir else None
        if final and self.actors.critics and self.cfg.critic.save_value_network:
            export_critic(self.actors, self.plan.critic_model_path, self.tokenizer, os.path.join(final, "critic"))
        return {"history": history, "evals": evals, "final_model": final, "total_steps": total, "groups": groups}

    def account_groups(self) -> dict:
        """The ledger's account of every group the producers handed out (``Ledger.account``); a group lost or drawn
        twice is logged as an error (the account is kept in the run's summary)."""
        handed_out = get([p.handed_out.remote() for p in self.producers], "the producers' data positions")
        groups = self.rollouts.buffer.account(handed_out)
        if groups["lost"] or groups["drawn_twice"]:
            log.error("groups lost or drawn twice: %s", groups)
        return groups

    def _gap_tolerance(self) -> float:
        """How far the engine's log-probabilities may drift from the trainer's (``gap_tolerance``) given the
        engines' weight dtype and the consumers' compute dtype."""
        info = self.actors.producer_info, self.actors.consumer_info
        engine_dtypes = {i["weight_dtype"] for i in info[0]}
        return gap_tolerance(
            self.cfg.consumer.max_engine_trainer_gap,
            engine_dtypes.pop() if len(engine_dtypes) == 1 else None,
            self.cfg.consumer.plugin.precision == "fp32" and all(i["compute_dtype"] == "fp32" for i in info[1]),
        )

    def _evaluate_base(self, evals: list) -> list | None:
        """The evaluation before training, from the cache where the base model's is there (``eval_cache``), else
        run and stored (also with the cache off: a fresh result replaces the kept one); appended to ``evals``, its
        predictions returned."""
        key = eval_cache.base_key(self.cfg, self.plan, self.actors.producer_info)
        cached = eval_cache.read(key) if key and self.cfg.run.eval_cache else None
        if cached is None:
            phase("evaluating before training")
            predictions = self._evaluate_at(0, evals)
            if key:
                eval_cache.write(key, {**evals[-1], "eval_samples": predictions})
            return predictions
        phase("evaluating before training: the base model's evaluation from the cache")
        predictions = cached.pop("eval_samples", None)
        evals.append({**cached, "step": 0, "eval/cached": 1})
        return predictions

    def _evaluate_at(self, step: int, evals: list) -> list | None:
        """Evaluate on the held-out set, append the result to ``evals``; returns its predictions (or None)."""
        evaluation = self.evaluate()
        predictions = evaluation.pop("eval_samples", None)
        evals.append({"step": step, **evaluation})
        return predictions

    def _step(self, step: int, total: int) -> dict:
        """One training step: take its batch, train on it (drawing the next rollouts meanwhile), push the weights;
        returns its metrics."""
        import ray

        t0 = time.perf_counter()
        batch = self.rollouts.take(step)
        t_rollout = time.perf_counter() - t0
        asleep = self.actors.sleep() if self.sleep_while_training else {}
        if (
            self.rollouts.round is not None
        ):  # still in flight (pushes load mid-round): it gives back the consumers' cores
            self.actors.take_back_from_producers()
        generating = self.rollouts.fills_while_training(step, total)
        t1 = time.perf_counter()
        exp_metrics = {}
        if self.experience.needed:
            batch, exp_metrics = self.experience.attach(batch, generating)
            exp_metrics["time/experience"] = time.perf_counter() - t1
        policy = step > self.cfg.algo_config.freeze_actor_steps  # the critic's warm-up trains the critic alone
        train_refs = self.actors.train(ray.put(batch), generating, total, policy=policy)
        t1 = time.perf_counter()
        if self.max_staleness >= 1 and step < total:
            self.rollouts.fill_while_training(train_refs, step, total)
        results = get(train_refs, f"training step {step}")
        trained = len(self.consumers)
        # With pipeline parallelism only the last stage sees the loss: report the fullest metrics.
        train_metrics = {**max(results[:trained], key=len), **exp_metrics}
        if len(results) > trained:  # the critic's rank 0
            train_metrics.update(results[trained])
        t_train = time.perf_counter() - t1
        self.progress.version = step
        if self.sleep_while_training:
            asleep["time/wake"] = self.actors.wake()
        t_push = self.push_weights()
        lag = self.cfg.teacher.self_lag
        if lag and step % lag == 0:  # a self-teacher becomes the policy as it is now, for the next lag steps
            t2 = time.perf_counter()
            self.actors.refresh_teachers(step)
            t_push += time.perf_counter() - t2
        if (
            self.rollouts.round is not None
        ):  # pushed mid-round: the round still in flight takes the idle consumers' cores
            self.actors.lend_to_producers()
        parked = self.actors.offload_trainers() if self.offload_trainers else {}
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
        metrics.update({**train_metrics, **asleep, **parked})
        if lag:
            metrics["teacher/version"] = self.actors.teacher_version
        if self.plan.sandbox is not None:  # 1: model-written code ran without bwrap (allow_degraded_sandbox)
            metrics["reward/sandbox_degraded"] = float(self.plan.sandbox_degraded)
        return metrics

    def _step_metrics(self, step: int, batch: RolloutBatch) -> dict:
        self.progress.reported_step = step
        return rollout_metrics(
            step,
            batch,
            self.rollouts.buffer.logs.pop(step),
            self.cfg.producer.num_generations,
            self.max_staleness,
            self.model_files,  # a vision-language model's processor: its samples show their images
        )
