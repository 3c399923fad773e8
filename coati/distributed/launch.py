"""The driver: validate config -> place actors -> connect groups -> initial weight push -> loop (produce, consume,
push, eval, save). ``ALGO_MAP`` is importable from here without starting anything.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Callable

from coati.distributed.algo.presets import ALGO_MAP, resolve_algorithm
from coati.distributed.config import (
    AlgorithmConfig,
    ConsumerConfig,
    GenerationConfig,
    LaunchConfig,
    PluginConfig,
    ProducerConfig,
    RewardConfig,
)

__all__ = ["ALGO_MAP", "launch_distributed", "resolve_algorithm"]
log = logging.getLogger(__name__)
_ALGO_FIELDS = set(AlgorithmConfig.__dataclass_fields__)


def build_config(
    num_producers, num_proc_per_producer, num_consumer_procs, num_episodes, inference_batch_size,
    inference_microbatch_size, train_batch_size, train_minibatch_size, generate_config, grpo_config, plugin_config,
    inference_backend, num_generations, core_algo, reward_workers=1,
) -> LaunchConfig:  # fmt: skip
    """All checks that need no actor: batch arithmetic, algorithm, sampling, parallel layout."""
    grpo_config = dict(grpo_config or {})
    algo_overrides = {k: grpo_config.pop(k) for k in list(grpo_config) if k in _ALGO_FIELDS}
    known_grpo = {"lr", "train_microbatch_size", "reward_fn_type", "reward_kwargs", "weight_decay", "max_grad_norm",
                  "max_skipped_steps", "reward_max_error_fraction", "reward_timeout_s",
                  "reward_stop_on_first_step_error"}
    unknown = sorted(set(grpo_config) - known_grpo)
    if unknown:
        raise ValueError(f"unknown grpo_config key(s) {unknown}; known: {sorted(known_grpo | _ALGO_FIELDS)}")
    return LaunchConfig(
        producer=ProducerConfig(
            num_producers=num_producers,
            num_proc_per_producer=num_proc_per_producer,
            inference_batch_size=inference_batch_size,
            inference_microbatch_size=inference_microbatch_size,
            num_generations=num_generations,
            backend=inference_backend,
        ),
        consumer=ConsumerConfig(
            num_consumer_procs=num_consumer_procs,
            train_batch_size=train_batch_size,
            train_minibatch_size=train_minibatch_size,
            train_microbatch_size=grpo_config.get("train_microbatch_size", train_minibatch_size * num_generations),
            learning_rate=grpo_config.get("lr", 1e-6),
            weight_decay=grpo_config.get("weight_decay", 0.0),
            max_grad_norm=grpo_config.get("max_grad_norm", 1.0),
            max_skipped_steps=grpo_config.get("max_skipped_steps", 3),
            plugin=PluginConfig(**(plugin_config or {})),
        ),
        generation=GenerationConfig(**(generate_config or {})),
        algorithm=resolve_algorithm(core_algo, **algo_overrides),
        reward=RewardConfig(
            fn=grpo_config.get("reward_fn_type", "math"),
            kwargs=grpo_config.get("reward_kwargs") or {},
            workers=reward_workers,
            item_timeout_s=grpo_config.get("reward_timeout_s", 30.0),
            max_error_fraction=grpo_config.get("reward_max_error_fraction", 0.1),
            stop_on_first_step_error=grpo_config.get("reward_stop_on_first_step_error", True),
        ),
        num_episodes=num_episodes,
    )


def launch_distributed(
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
    inference_backend: str = "transformers",
    num_generations: int = 8,
    master_addr: str | None = None,
    master_port: int | None = None,
    core_algo: str = "GRPO",
    project_name: str = "coati",
    save_interval: int = 0,
    save_dir: str | None = None,
    eval_dataset_config: dict[str, Any] | None = None,
    eval_interval: int = 0,
    max_staleness: int = 0,
    max_steps: int | None = None,
    seed: int = 0,
    cpus_per_actor: float = 0.5,
    colocate: bool = False,
    sleep_while_training: bool = False,
    reward_workers: int = 1,
    weight_sync_timeout_s: float = 300.0,
    on_step: Callable[[dict], None] | None = None,
    resume: str | None = None,
    keep_checkpoints: int = 2,
    dataloaders_config: dict[str, Any] | None = None,
    resume_allow: tuple[str, ...] = (),
    overwrite: bool = False,
) -> dict:
    """Run RL training; returns {"history": per-step metrics, "evals": evaluations, "final_model": path or None}.

    Ray must be initialised by the caller (``ray.init(address=...)`` joins a cluster); nothing else changes between
    one box and a cluster. Checkpoints go to ``<save_dir>/checkpoints`` every ``save_interval`` steps and at the end;
    ``resume`` ("latest" or a checkpoint folder) continues a run from one, after checking that its config and identity
    (model, data, reward, seed, staleness) match; ``resume_allow`` names fields that may differ. ``save_dir`` is
    locked for the run; a folder holding another run is refused unless resuming or ``overwrite``.
    ``colocate`` lets producer i and consumer i share GPU i (one GPU is enough); weights then travel through host
    memory instead of NCCL, and the inference engine must leave the trainer room (e.g. vLLM's gpu_memory_utilization).
    ``sleep_while_training`` has producers free their accelerator memory (``sleep``) while consumers train and take it
    back (``wake``) before the weight push; it needs ``max_staleness=0``, since nothing may generate meanwhile.
    """
    from coati.distributed.loop import Run
    from coati.distributed.preflight import preflight

    if dataloaders_config:
        raise ValueError("dataloaders_config is not supported: producers read their shard themselves; remove it")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be a positive integer or None (run every episode), got {max_steps!r}")
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"max_staleness must be a non-negative integer (0: synchronous), got {max_staleness!r}")
    if sleep_while_training and max_staleness:
        raise ValueError(
            f"sleep_while_training=True frees the producers' memory while consumers train, but max_staleness="
            f"{max_staleness} has them generate then; set max_staleness=0 (-nb 0) or turn sleep_while_training off"
        )
    cfg = build_config(
        num_producers, num_proc_per_producer, num_consumer_procs, num_episodes, inference_batch_size,
        inference_microbatch_size, train_batch_size, train_minibatch_size, generate_config, grpo_config,
        plugin_config, inference_backend, num_generations, core_algo, reward_workers,
    )  # fmt: skip
    train_model = train_model_config["path"]
    plan = preflight(
        cfg,
        train_model_path=train_model,
        inference_model_path=inference_model_config["path"],
        tokenizer_path=(tokenizer_config or {}).get("path", train_model),
        train_dataset=train_dataset_config,
        eval_dataset=eval_dataset_config,
        cpus_per_actor=cpus_per_actor,
        colocate=colocate,
        inference_options={k: v for k, v in inference_model_config.items() if k != "path"},
        sleep_while_training=sleep_while_training,
    )
    total_steps = min(cfg.num_episodes * plan.steps_per_episode, max_steps or 10**18)
    record = run_record(cfg, plan, seed, max_staleness)
    folder, checkpoint = claim_save_dir(save_dir, resume, overwrite, record, resume_allow, total_steps,
                                        plan.train_model_path, keep_checkpoints)  # fmt: skip
    run = Run(
        cfg, plan, seed=seed,
        weight_sync_timeout_s=weight_sync_timeout_s, max_staleness=max_staleness, master_addr=master_addr,
        master_port=master_port, run_name=f"{project_name}-{uuid.uuid4().hex[:8]}",
        sleep_while_training=sleep_while_training,
    )  # fmt: skip
    run.record = record
    try:
        run.start_actors()
        run.connect_weight_group()
        if checkpoint is not None:
            run.restore(str(checkpoint))
        run.push_weights()  # producers start from the consumers' weights (after a resume, the trained ones)
        return run.loop(max_steps=max_steps, eval_interval=eval_interval, save_interval=save_interval,
                        save_dir=save_dir, on_step=on_step, keep_checkpoints=keep_checkpoints)  # fmt: skip
    finally:
        run.shutdown()
        if folder is not None:
            folder.release()


def run_record(cfg: LaunchConfig, plan, seed: int, max_staleness: int) -> dict:
    """What a checkpoint must match to be resumed: the config tree and the run's identity (model weights and shape,
    training rows, seed, staleness bound, system prompt). Paths are not part of it: moved files are the same run."""
    from coati.distributed.checkpoint import config_dict, fingerprint

    identity = {
        "train_model": fingerprint(plan.train_model_path),
        "inference_model": fingerprint(plan.inference_model_path),
        "dataset": {"rows": plan.dataset_digest},  # the content, wherever the file now lies
        "seed": seed,
        "max_staleness": max_staleness,
        "system_prompt": plan.system_prompt,
    }  # fmt: skip
    return {"config": config_dict(cfg), "identity": identity}


def claim_save_dir(save_dir, resume, overwrite, record, allow, total_steps, model_path, keep_checkpoints):
    """Lock the run folder (refusing another run's, or a full or read-only disk) and, when resuming, find the
    checkpoint and check it matches this run; returns (folder or None, checkpoint path or None)."""
    import json

    from coati.distributed.checkpoint import CheckpointManager, check_compatible
    from coati.distributed.run_folder import RunFolder, model_bytes

    if resume and not save_dir:
        raise ValueError("resume needs save_dir (checkpoints live in <save_dir>/checkpoints)")
    if resume and overwrite:
        raise ValueError("resume and overwrite contradict each other: choose one")
    if not save_dir:
        return None, None
    folder = RunFolder.claim(save_dir, "resume" if resume else "overwrite" if overwrite else "new")
    try:
        # A checkpoint holds the weights and Adam's two moments (3x the fp32 weights); keep_checkpoints of them
        # plus the one being written, and the final export.
        folder.check_space(model_bytes(model_path) * (3 * (keep_checkpoints + 1) + 1), f"{keep_checkpoints} checkpoints")
        if not resume:
            return folder, None
        checkpoint = CheckpointManager(os.path.join(save_dir, "checkpoints")).resolve(resume)
        meta = json.loads((checkpoint / "meta.json").read_text())
        saved = {"config": meta["config"], "identity": meta.get("identity", {})}
        check_compatible(saved, record, str(checkpoint), allow)
        if meta["step"] >= total_steps:
            raise ValueError(
                f"checkpoint {checkpoint} is at step {meta['step']} and this run has {total_steps} steps: nothing "
                "left to train; raise max_steps or num_episodes to continue"
            )
        return folder, checkpoint
    except BaseException:
        folder.release()
        raise
