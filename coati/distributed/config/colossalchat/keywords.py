"""ColossalChat's ``launch_distributed`` keywords as the config tree: each argument, each ``grpo_config`` key and each
dataset dict maps onto one field (``config_from_launch_kwargs``); whatever has no field is refused, never dropped.
Pure mapping of keyword arguments; no Ray."""

from __future__ import annotations

import os
from typing import Any

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.config.tree import Config, config_from_dict
from coati.distributed.rollout.data import dataset_spec

_ALGO_FIELDS = set(AlgorithmConfig.__dataclass_fields__)
_DEFAULTS = Config()

GRPO_KEYS = {
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
    "routing_replay": "consumer.routing_replay",
    "router_aux_loss_coef": "consumer.router_aux_loss_coef",
    "router_z_loss_coef": "consumer.router_z_loss_coef",
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
    for name, key in LAUNCH_ARGS.items():
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


LAUNCH_ARGS = {
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
    unknown = sorted(set(grpo) - set(GRPO_KEYS) - _ALGO_FIELDS)
    if unknown:
        raise ValueError(f"unknown grpo_config key(s) {unknown}; known: {sorted(set(GRPO_KEYS) | _ALGO_FIELDS)}")
    tree: dict = {"algorithm": {k: v for k, v in grpo.items() if k in _ALGO_FIELDS}, "consumer": {}, "run": {}}
    for key, value in grpo.items():
        if key not in _ALGO_FIELDS:
            _put(tree, GRPO_KEYS[key], value)
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
