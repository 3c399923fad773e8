"""TRL's ``GRPOConfig`` names on coati's command line: each field TRL documents either is a flag (``SAME``: the same
setting under TRL's name, ``--max_completion_length 64`` is ``-mnt 64``) or is refused with the nearest coati
setting or the reason there is none (``REFUSED``); ``--bf16``, a switch in both TRL and OpenRLHF, is converted
with OpenRLHF's flags (``openrlhf.SWITCHES``: ``--precision bf16``). ``tests/unit/test_trl.py`` checks the table
against TRL's own class, so a field TRL adds is noticed."""

from __future__ import annotations

SAME: dict[str, str] = {
    "max_completion_length": "generation.max_new_tokens",
    "num_generations": "producer.num_generations",
    "temperature": "generation.temperature",
    "top_p": "generation.top_p",
    "top_k": "generation.top_k",
    "beta": "algorithm.beta",
    "num_iterations": "consumer.num_iterations",
    "epsilon": "algorithm.clip_eps_low",
    "epsilon_high": "algorithm.clip_eps_high",
    "mask_truncated_completions": "algorithm.mask_truncated",
    "reward_weights": "reward_weights",
    "learning_rate": "consumer.learning_rate",
    "weight_decay": "consumer.weight_decay",
    "max_grad_norm": "consumer.max_grad_norm",
    "warmup_steps": "consumer.warmup_steps",
    "lr_scheduler_type": "consumer.lr_schedule",
    "gradient_checkpointing": "consumer.gradient_checkpointing",
    "router_aux_loss_coef": "consumer.router_aux_loss_coef",
    "max_steps": "run.max_steps",
    "num_train_epochs": "run.num_episodes",
    "seed": "run.seed",
    "report_to": "run.report_to",
    "output_dir": "run.run_dir",
    "vllm_importance_sampling_cap": "algorithm.tis_cap",
    "vllm_enable_sleep_mode": "run.sleep_while_training",
    "vllm_tensor_parallel_size": "producer.num_proc_per_producer",
    "save_steps": "run.save_interval",
}
"""TRL name -> the coati setting of the same meaning (accepted as ``--name`` and ``--name-with-dashes``)"""

_ENGINE = "coati's producers run their own engine (-b transformers|vllm|sglang)"
_NO_PRESET = (
    "no {} preset; the presets are --algo GRPO, DAPO, DR_GRPO, RLOO, REINFORCE_PPB, GSPO, CISPO, PPO, REINFORCE_PP"
)
_LOGS = "every step's metrics and sample completions are written to the run folder (metrics.jsonl, samples.jsonl)"

REFUSED: dict[str, str] = {
    "model_init_kwargs": "the model is a folder (-m); its dtype follows --precision and --compute-dtype",
    "trust_remote_code": "only architectures transformers ships are loaded (docs/models.md)",
    "disable_dropout": "dropout is off in training as in the engines (eval mode); no setting needed",
    "cast_lm_head_to_fp32": "the log-probs are computed in fp32 already (--precision sets the rest)",
    "num_generations_eval": "held-out evaluation is greedy, one completion per prompt (--eval-size)",
    "ds3_gather_for_generation": "weights reach the engines by push (docs/transport.md); no ZeRO-3 gather",
    "shuffle_dataset": "training rows are always shuffled per episode (--seed)",
    "pad_to_multiple_of": "micro-batches are packed by tokens (--train-microbatch-tokens)",
    "generation_batch_size": "prompts per producer draw: -ibs (inference_batch_size)",
    "steps_per_generation": "rollouts ahead of training: -nb (max_staleness)",
    "min_p": "sampling takes --temperature, --top-k and --top-p",
    "generation_kwargs": "engine options: --inference-options (a JSON object)",
    "chat_template_kwargs": "prompts use the tokenizer's chat template as it is (--raw-prompt to skip it)",
    "repetition_penalty": "sampling takes --temperature, --top-k and --top-p",
    "cache_implementation": "the engine manages its cache (--inference-options)",
    "use_vllm": f"choose the engine with -b vllm; {_ENGINE}",
    "vllm_mode": f"-b vllm, with --colocate to share GPUs; {_ENGINE}",
    "vllm_model_impl": "engine options: --inference-options (a JSON object)",
    "vllm_structured_outputs_regex": "engine options: --inference-options (a JSON object)",
    "vllm_server_base_url": f"{_ENGINE}, placed by Ray (--address)",
    "vllm_server_host": f"{_ENGINE}, placed by Ray (--address)",
    "vllm_server_port": f"{_ENGINE}, placed by Ray (--address)",
    "vllm_server_timeout": "waits on actors are bounded by --hang-timeout-s",
    "vllm_group_port": "the weight group's port is picked free (--master-port for the trainers')",
    "vllm_gpu_memory_utilization": "--inference-options '{\"gpu_memory_utilization\": 0.5}'",
    "vllm_max_model_length": "--inference-options '{\"max_model_len\": N}' (and -mpt, -mnt)",
    "delta": "the two-sided clip is --dual-clip-c",
    "sapo_temperature_neg": _NO_PRESET.format("SAPO"),
    "sapo_temperature_pos": _NO_PRESET.format("SAPO"),
    "vespo_k_pos": _NO_PRESET.format("VESPO"),
    "vespo_lambda_pos": _NO_PRESET.format("VESPO"),
    "vespo_k_neg": _NO_PRESET.format("VESPO"),
    "vespo_lambda_neg": _NO_PRESET.format("VESPO"),
    "importance_sampling_level": "sequence-level ratios: --algo GSPO (--policy-loss gspo)",
    "multi_objective_aggregation": "several rewards are summed with weights: --reward-fn f g --reward-weights 1 0.5",
    "scale_rewards": "--advantage-estimator grpo (std-scaled) or drgrpo (not scaled)",
    "loss_type": "--algo (GRPO, DAPO, DR_GRPO, CISPO, ...) or --loss-agg-mode and --policy-loss",
    "sync_ref_model": "the reference model is the initial policy; no reference sync",
    "ref_model_mixup_alpha": "the reference model is the initial policy; no reference sync",
    "ref_model_sync_steps": "the reference model is the initial policy; no reference sync",
    "top_entropy_quantile": "every response token is trained (--mask-truncated drops cut responses)",
    "entropy_coef": "no entropy bonus; actor/entropy is logged every step",
    "use_adaptive_entropy": "no entropy bonus; actor/entropy is logged every step",
    "entropy_coef_min": "no entropy bonus; actor/entropy is logged every step",
    "entropy_coef_max": "no entropy bonus; actor/entropy is logged every step",
    "entropy_coef_delta": "no entropy bonus; actor/entropy is logged every step",
    "entropy_target": "no entropy bonus; actor/entropy is logged every step",
    "max_tool_calling_iterations": "multi-turn environments: --env NAME --env-max-turns N",
    "vllm_importance_sampling_correction": "--off-policy-correction (tis by default)",
    "vllm_importance_sampling_mode": "--off-policy-correction (tis, or a mask with --is-mask-low/--is-mask-high)",
    "vllm_importance_sampling_clip_max": "--tis-cap, or --is-mask-high for a mask",
    "vllm_importance_sampling_clip_min": "--is-mask-low",
    "off_policy_mask_threshold": "--is-mask-low and --is-mask-high",
    "use_bias_correction_kl": "--kl-estimator (k1, k2, k3, ...)",
    "log_completions": _LOGS,
    "log_multimodal": _LOGS,
    "num_completions_to_print": _LOGS,
    "log_unique_prompts": _LOGS,
    "log_completions_hub_repo": "nothing is pushed to the hub; the run folder holds every sample",
    "use_transformers_continuous_batching": "-b transformers batches each draw; -b vllm batches continuously",
    "transformers_continuous_batching_config": "-b transformers batches each draw; -b vllm batches continuously",
    "use_transformers_paged": "-b vllm (paged attention)",
    "per_device_train_batch_size": (
        "-tbs counts prompts per DP rank (TRL counts completions): -tbs = per_device_train_batch_size / num_generations"
    ),
    "gradient_accumulation_steps": "-tMbs (train_minibatch_size) and -tmbs (train_microbatch_size) per update",
    "fp16": "--precision fp16",
    "logging_steps": _LOGS,
    "eval_steps": "-ei (eval_interval)",
    "eval_strategy": "-ei (eval_interval): held-out evaluations before, every N steps and after",
    "save_strategy": "-si (save_interval)",
    "save_total_limit": "--keep-checkpoints",
    "resume_from_checkpoint": "--resume latest|DIR",
    "run_name": "-p (project) or --run-dir",
    "warmup_ratio": "--warmup-steps",
    "optim": "the optimizer is ColossalAI's HybridAdam",
    "adam_beta1": "the optimizer is ColossalAI's HybridAdam with its default betas",
    "adam_beta2": "the optimizer is ColossalAI's HybridAdam with its default betas",
    "adam_epsilon": "the optimizer is ColossalAI's HybridAdam with its default epsilon",
    "push_to_hub": "nothing is pushed to the hub; final/ is a Hugging Face folder",
    "max_prompt_length": "-mpt (max_prompt_tokens)",
}
"""TRL name -> what to write instead, or why there is nothing to write"""


def refusal(name: str) -> str | None:
    """The one-line answer to TRL's ``--name`` where coati has no flag of that name, or None."""
    hint = REFUSED.get(name.lstrip("-").replace("-", "_"))
    return None if hint is None else f"TRL's --{name.lstrip('-').replace('-', '_')} is not a coati flag: {hint}"
