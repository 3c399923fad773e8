"""The driver: validate config -> place actors -> connect groups -> initial weight push -> loop (produce, consume,
push, eval, save). ``launch(config)`` runs a config tree (``run_config.Config``); ``launch_distributed`` takes
ColossalChat's arguments and maps them onto the same tree. ``ALGO_MAP`` is importable from here without starting
anything.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import Callable

from coati.distributed.algo.presets import ALGO_MAP, resolve_algorithm
from coati.distributed.config.colossalchat import config_from_launch_kwargs
from coati.distributed.config.tree import Config
from coati.distributed.driver.actor_group import RunError
from coati.distributed.driver.checkpoint import (
    CheckpointManager,
    check_compatible,
    checkpoint_meta,
    config_dict,
    final_folder,
    fingerprint,
)
from coati.distributed.driver.loop import Run
from coati.distributed.driver.preflight import Inputs, Plan, preflight
from coati.distributed.driver.reporting import end_account, phase
from coati.distributed.driver.run_folder import RunFolder, check_shared
from coati.distributed.model.files import run_disk_bytes

__all__ = ["ALGO_MAP", "Config", "config_from_launch_kwargs", "launch", "resolve_algorithm"]
log = logging.getLogger(__name__)


def launch(config: Config, on_step: Callable[[dict], None] | None = None, inputs: Inputs | None = None) -> dict:
    """Run ``config``; returns {"history": per-step metrics, "evals": evaluations, "final_model": path or None,
    "total_steps", "restarts": the error that ended each failed attempt, "sandbox": how model-written code was
    isolated (None: the run executed none)}. Ray must be initialised by the caller
    (``ray.init(address=...)`` joins a cluster); nothing else changes between one box and a cluster. After a failure
    (``RunError``: an actor died, failed or stopped answering) the run restarts from its last checkpoint, up to
    ``run.max_restarts`` times (from the start when it failed before its first checkpoint)."""
    restarts: list[str] = []
    try:
        for attempt in range(config.run.max_restarts + 1):
            try:
                return {**_launch_once(config, on_step, inputs), "restarts": restarts}
            except RunError as e:
                if attempt == config.run.max_restarts:
                    raise
                restarts.append(str(e))
                log.warning(
                    "run failed (%s); restarting from the last checkpoint (%d/%d)",
                    e,
                    attempt + 1,
                    config.run.max_restarts,
                )
                config = restarted(config)
        raise AssertionError("unreachable")
    finally:
        end_account()  # its reporter, if any, still reads this run's account; the next run starts its own


def restarted(config: Config) -> Config:
    """The config of the attempt after a failure: from the run folder's last checkpoint, or, when the failed attempt
    wrote none (it failed before its first checkpoint, or keeps no run folder), as the failed attempt began."""
    folder = config.run.folder
    if folder and CheckpointManager(os.path.join(folder, "checkpoints")).list():
        return dataclasses.replace(config, run=dataclasses.replace(config.run, resume="latest", overwrite=False))
    return config


def _launch_once(config: Config, on_step, inputs: Inputs | None) -> dict:
    """validate -> place -> connect -> push -> loop."""

    cfg, r = config, config.run
    plan = preflight(config, inputs)
    log_dropped_rows(plan, cfg.generation.max_prompt_tokens)
    total_steps = plan.total_steps
    record = run_record(config, plan)
    folder, checkpoint = claim_save_dir(
        r.folder, r.resume, r.overwrite, record, r.resume_allow, total_steps, plan.train_model_path, r.keep_checkpoints
    )
    if folder is not None:
        try:
            check_shared(r.folder, [slot.node_id for slot in plan.consumer_slots])
        except BaseException:
            folder.release()
            raise
        if r.overwrite:  # every check that needs no actor has passed: the results this run replaces go now
            folder.clear()
    run = Run(config, plan, run_name=f"{r.project}-{uuid.uuid4().hex[:8]}")
    run.record = record
    try:
        phase(
            f"starting {cfg.producer.num_producers} producer(s) and {cfg.consumer.num_consumer_procs} consumer(s): "
            "loading models"
        )
        log_plan(plan, r.in_flight_weight_updates)
        run.start_actors()
        run.connect_weight_group()
        if checkpoint is not None:
            phase(f"restoring {checkpoint.name}")
            run.restore(str(checkpoint))
        phase("first weight push")
        run.push_weights()  # producers start from the consumers' weights (after a resume, the trained ones)
        result = run.loop(
            max_steps=config.step_limit,
            eval_interval=r.eval_interval,
            save_interval=r.save_interval,
            save_dir=r.folder,
            on_step=on_step,
            keep_checkpoints=r.keep_checkpoints,
        )
        return {**result, "sandbox": record.get("sandbox")}
    finally:
        run.shutdown()
        if folder is not None:
            folder.release()


def log_dropped_rows(plan: Plan, max_prompt_tokens: int) -> None:
    """Say how many rows were dropped for overlong prompts."""
    for what, n in plan.overlong.items():
        if n:
            log.warning(
                "dropped %d %s rows whose prompts have more than max_prompt_tokens=%d tokens (filter_overlong_prompts)",
                n,
                what,
                max_prompt_tokens,
            )


def log_plan(plan: Plan, in_flight_setting) -> None:
    """Say how weights load, whether producers stream, and how model-written code is isolated."""
    log.info(
        "weight pushes %s (in_flight_weight_updates=%s)",
        "load while producers generate" if plan.in_flight else "wait for the producers' batch",
        in_flight_setting,
    )
    if plan.stream_prompts:
        log.info("producers keep %d groups generating across draws", plan.stream_prompts)
    if plan.sandbox_degraded:
        log.warning(
            "SANDBOX DEGRADED (allow_degraded_sandbox): model-written code runs without filesystem isolation: %s",
            plan.sandbox,
        )
    elif plan.sandbox is not None and not plan.sandbox_per_run:
        log.warning("code sandbox without a control group per run (its memory bound is per process): %s", plan.sandbox)
    elif plan.sandbox is not None:
        log.info("code sandbox: %s", plan.sandbox)


def run_record(config: Config, plan) -> dict:
    """What a checkpoint must match to be resumed: the config tree and the run's identity (model weights and shape,
    training rows, seed, staleness bound, system prompt). Paths are not part of it: moved files are the same run."""

    identity = {
        "train_model": fingerprint(plan.train_model_path),
        "inference_model": fingerprint(plan.inference_model_path),
        "dataset": {"rows": plan.dataset_digest},  # the content, wherever the file now lies
        "seed": config.run.seed,
        "max_staleness": config.run.max_staleness,
        "system_prompt": plan.prompt_format.system_prompt,
        "raw_prompt": plan.prompt_format.raw,
    }
    dataset = {
        **plan.train_dataset.description(),
        "rows": plan.num_rows,
        "overlong_dropped": plan.overlong.get("train", 0),
    }
    record = {"config": config_dict(config), "identity": identity, "dataset": dataset}
    if plan.sandbox is not None:  # how model-written code is isolated (not part of what a resume must match)
        record["sandbox"] = {
            "isolation": plan.sandbox,
            "degraded": plan.sandbox_degraded,
            "per_run_bounds": plan.sandbox_per_run,
        }
    return record


def claim_save_dir(save_dir, resume, overwrite, record, allow, total_steps, model_path, keep_checkpoints):
    """Lock the run folder (refusing another run's, or a full or read-only disk, counting what an overwrite will free)
    and, when resuming, find the checkpoint and check it matches this run; returns (folder or None, checkpoint path or
    None). A checkpoint of the run's last step resumes while the final model is not exported yet (the run stopped
    between the two): the resumed run trains nothing and exports it."""

    if resume and not save_dir:
        raise ValueError("resume needs save_dir (checkpoints live in <save_dir>/checkpoints)")
    if resume and overwrite:
        raise ValueError("resume and overwrite contradict each other: choose one")
    if not save_dir:
        return None, None
    folder = RunFolder.claim(save_dir, "resume" if resume else "overwrite" if overwrite else "new")
    try:
        folder.check_space(
            run_disk_bytes(model_path, keep_checkpoints),
            f"{keep_checkpoints} checkpoints",
            freed_bytes=folder.results_bytes() if overwrite else 0,
        )
        if not resume:
            return folder, None
        checkpoint = CheckpointManager(os.path.join(save_dir, "checkpoints")).resolve(resume)
        meta = checkpoint_meta(checkpoint)
        saved = {"config": meta["config"], "identity": meta.get("identity", {})}
        current = {"config": record["config"], "identity": record["identity"]}  # the dataset's description aside
        check_compatible(saved, current, str(checkpoint), allow)
        finished = os.path.isdir(final_folder(save_dir)) and os.path.exists(os.path.join(save_dir, "summary.json"))
        if meta["step"] > total_steps or (meta["step"] == total_steps and finished):
            raise ValueError(
                f"checkpoint {checkpoint} is at step {meta['step']} and this run has {total_steps} steps: nothing "
                "left to train; raise max_steps or num_episodes to continue"
            )
        return folder, checkpoint
    except BaseException:
        folder.release()
        raise
