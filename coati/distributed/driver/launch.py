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
from typing import Any

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.algo.presets import ALGO_MAP, resolve_algorithm
from coati.distributed.config.tree import Config, config_from_dict
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
from coati.distributed.model_files import run_disk_bytes
from coati.distributed.rollout.data import dataset_spec

__all__ = ["ALGO_MAP", "Config", "launch", "resolve_algorithm"]
log = logging.getLogger(__name__)
_ALGO_FIELDS = set(AlgorithmConfig.__dataclass_fields__)
_DEFAULTS = Config()


_GRPO_KEYS = {
    "lr": "consumer.learning_rate",
    "num_iterations": "consumer.num_iterations",
    "train_microbatch_size": "consumer.train_microbatch_size",
    "train_microbatch_tokens": "consumer.train_microbatch_tokens",
    "weight_decay": "consumer.weight_decay",
    "max_grad_norm": "consumer.max_grad_norm",
    "max_skipped_steps": "consumer.max_skipped_steps",
    "max_engine_trainer_gap": "consumer.max_engine_trainer_gap",
    "compute_dtype": "consumer.compute_dtype",
    "lr_schedule": "consumer.lr_schedule",
    "warmup_steps": "consumer.warmup_steps",
    "min_lr_ratio": "consumer.min_lr_ratio",
    "gradient_checkpointing": "consumer.gradient_checkpointing",
    "share_prompt_forward": "consumer.share_prompt_forward",
    "lora_rank": "consumer.lora_rank",
    "lora_alpha": "consumer.lora_alpha",
    "lora_dropout": "consumer.lora_dropout",
    "lora_target_modules": "consumer.lora_target_modules",
    "lora_export_merged": "consumer.lora_export_merged",
    "reward_fn_type": "reward.fn",
    "reward_kwargs": "reward.kwargs",
    "reward_max_error_fraction": "reward.max_error_fraction",
    "reward_timeout_s": "reward.item_timeout_s",
    "reward_batch_size": "reward.batch_size",
    "reward_stop_on_first_step_error": "reward.stop_on_first_step_error",
    "env": "reward.env.name",
    **{f"env_{k}": f"reward.env.{k}" for k in ("kwargs", "max_turns", "max_tokens", "step_timeout_s")},
    "reward_components": "reward.components",
    **{
        f"rm_{k}": f"reward.rm.{k}"
        for k in ("path", "servers", "cpus", "gpus", "batch_size", "normalize", "placement", "timeout_s")
    },
    **{
        f"judge_{k}": f"reward.judge.{k}"
        for k in (
            "path",
            "backend",
            "template",
            "max_score",
            "max_new_tokens",
            "max_prompt_tokens",
            "servers",
            "cpus",
            "gpus",
            "placement",
            "timeout_s",
        )
    },
}
"""ColossalChat's grpo_config keys -> the tree's fields (any AlgorithmConfig field is accepted too)"""


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
    total_steps = min(r.num_episodes * plan.steps_per_episode, config.step_limit or 10**18)
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


def config_from_launch_kwargs(
    num_producers: int,
    num_proc_per_producer: int,
    num_consumer_procs: int,
    num_episodes: int,
    inference_batch_size: int,
    inference_microbatch_size: int,
    train_batch_size: int,
    train_minibatch_size: int,
    train_dataset_config: dict[str, Any],
    inference_model_config: dict[str, Any],
    generate_config: dict[str, Any],
    train_model_config: dict[str, Any],
    grpo_config: dict[str, Any],
    plugin_config: dict[str, Any],
    tokenizer_config: dict[str, Any] | None = None,
    inference_backend: str = _DEFAULTS.producer.backend,
    num_generations: int = _DEFAULTS.producer.num_generations,
    master_addr: str | None = None,
    master_port: int | None = None,
    core_algo: str = _DEFAULTS.algo,
    project_name: str = _DEFAULTS.run.project,
    save_interval: int = _DEFAULTS.run.save_interval,
    save_dir: str | None = None,
    eval_dataset_config: dict[str, Any] | None = None,
    eval_interval: int = _DEFAULTS.run.eval_interval,
    max_staleness: int = _DEFAULTS.run.max_staleness,
    in_flight_weight_updates: bool | None = _DEFAULTS.run.in_flight_weight_updates,
    stream_prompts: int = _DEFAULTS.producer.stream_prompts,
    threads_follow_work: bool = _DEFAULTS.run.threads_follow_work,
    max_steps: int | None = None,
    seed: int = _DEFAULTS.run.seed,
    cpus_per_actor: float = _DEFAULTS.run.cpus_per_actor,
    colocate: bool = False,
    sleep_while_training: bool = False,
    reward_workers: int = _DEFAULTS.reward.workers,
    weight_sync_timeout_s: float = _DEFAULTS.run.weight_sync_timeout_s,
    hang_timeout_s: float = _DEFAULTS.run.hang_timeout_s,
    resume: str | None = None,
    keep_checkpoints: int = _DEFAULTS.run.keep_checkpoints,
    dataloaders_config: dict[str, Any] | None = None,
    resume_allow: tuple[str, ...] = (),
    overwrite: bool = False,
    max_restarts: int = 0,
) -> Config:
    """ColossalChat's ``launch_distributed`` arguments as the config tree (``run_config.Config``): each maps onto one
    field; whatever has no field is refused, never dropped. ``save_dir`` is the run folder itself (None: write
    nothing); ``max_steps=None`` runs every episode."""
    given = dict(locals())  # the arguments, by name
    if dataloaders_config:
        raise ValueError("dataloaders_config is not supported: producers read their shard themselves; remove it")
    tree = _grpo_tree(grpo_config)
    for name, key in _LAUNCH_ARGS.items():
        _put(tree, key, given[name])
    train, held_out = _dataset_fields(train_dataset_config, "train"), _dataset_fields(eval_dataset_config, "eval")
    inference = dict(inference_model_config)
    tree["model"] = {
        "path": train_model_config["path"],
        "inference_path": inference.pop("path"),
        "tokenizer_path": (tokenizer_config or {}).get("path"),
        "inference_options": inference,
    }
    tree["data"] = {
        **_merge_datasets(train, held_out),
        "system_prompt": (train_dataset_config or {}).get("system_prompt"),
    }
    tree["consumer"]["plugin"] = dict(plugin_config or {})
    tree["generation"] = dict(generate_config or {})
    tree["run"]["save_dir"] = None if save_dir is None else os.path.dirname(save_dir) or "."
    tree["run"]["resume_allow"] = tuple(resume_allow)
    return config_from_dict(tree)


_LAUNCH_ARGS = {
    "core_algo": "algo",
    **{
        k: f"producer.{k}"
        for k in ("num_producers", "num_proc_per_producer", "inference_batch_size", "inference_microbatch_size")
    },
    "num_generations": "producer.num_generations",
    "inference_backend": "producer.backend",
    "stream_prompts": "producer.stream_prompts",
    **{k: f"consumer.{k}" for k in ("num_consumer_procs", "train_batch_size", "train_minibatch_size")},
    "reward_workers": "reward.workers",
    "project_name": "run.project",
    "save_dir": "run.run_dir",
    **{
        k: f"run.{k}"
        for k in (
            "max_steps",
            "num_episodes",
            "max_staleness",
            "in_flight_weight_updates",
            "threads_follow_work",
            "eval_interval",
            "save_interval",
            "keep_checkpoints",
            "resume",
            "overwrite",
            "max_restarts",
            "seed",
            "colocate",
            "sleep_while_training",
            "cpus_per_actor",
            "weight_sync_timeout_s",
            "hang_timeout_s",
            "master_addr",
            "master_port",
        )
    },
}
"""``launch_distributed``'s plain arguments -> the tree's fields (the dict arguments are read apart)"""


def _put(tree: dict, key: str, value) -> None:
    """Set the dotted ``key`` (``reward.rm.path``) in the nested dict ``tree``."""
    *parents, name = key.split(".")
    for parent in parents:
        tree = tree.setdefault(parent, {})
    tree[name] = value


def _grpo_tree(grpo_config: dict | None) -> dict:
    """ColossalChat's grpo_config as the tree: the algorithm's fields as overrides, every other key at its field."""
    grpo = dict(grpo_config or {})
    unknown = sorted(set(grpo) - set(_GRPO_KEYS) - _ALGO_FIELDS)
    if unknown:
        raise ValueError(f"unknown grpo_config key(s) {unknown}; known: {sorted(set(_GRPO_KEYS) | _ALGO_FIELDS)}")
    tree: dict = {"algorithm": {k: v for k, v in grpo.items() if k in _ALGO_FIELDS}, "consumer": {}, "run": {}}
    for key, value in grpo.items():
        if key not in _ALGO_FIELDS:
            _put(tree, _GRPO_KEYS[key], value)
    return tree


def _dataset_fields(spec: dict | None, prefix: str) -> dict:
    """A ColossalChat dataset dict ({path or rows, size, seed, system_prompt}, plus split and the column options) as
    the data section's fields."""

    if spec is None:
        return {}
    checked = dataset_spec(spec)
    out = {prefix: checked.source, f"{prefix}_size": checked.size, f"{prefix}_seed": spec.get("seed")}
    if "split" in spec:
        out[f"{prefix}_split"] = checked.split
    return out | {k: spec[k] for k in ("subset", "prompt_column", "answer_column") if spec.get(k) is not None}


def _merge_datasets(train: dict, held_out: dict) -> dict:
    """The training and held-out dataset fields as one data section; the column options are shared, so the two
    configs must agree on them."""
    clash = {k: (train[k], v) for k, v in held_out.items() if k in train and train[k] != v}
    if clash:
        raise ValueError(
            f"train and eval dataset configs disagree on {clash} (train, eval); the column options are "
            "shared: set them once"
        )
    return train | held_out


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
