"""OpenRLHF's ``train_ppo_ray`` flags on coati's command line, written as OpenRLHF writes them (``--actor_num_nodes``,
underscores). ``translate`` turns them into coati's flags before the command line is parsed, converting units
where the two differ: OpenRLHF's batch sizes count samples (completions) over the whole cluster, coati's count prompts
per data-parallel rank; its role node and GPU counts become coati's process counts and layout. A flag of OpenRLHF's
that coati has no setting for is refused naming the nearest one (``REFUSED``). The docs' table
(``docs/coming-from-openrlhf.md``) is checked against these tables by ``tests/unit/test_openrlhf.py``."""

from __future__ import annotations

import difflib
import os

SAME: dict[str, str] = {
    "pretrain": "--model-path",
    "reward_pretrain": "--reward-rm-path",
    "critic_pretrain": "--critic-model",
    "prompt_data": "--data-train",
    "input_key": "--prompt-column",
    "label_key": "--answer-column",
    "max_samples": "--train-size",
    "seed": "--seed",
    "n_samples_per_prompt": "-g",
    "prompt_max_len": "-mpt",
    "generate_max_len": "-mnt",
    "max_epochs": "--num-iterations",
    "num_episodes": "-e",
    "actor_learning_rate": "-lr",
    "critic_learning_rate": "--critic-learning-rate",
    "init_kl_coef": "--init-kl-coef",
    "kl_target": "--kl-target",
    "kl_horizon": "--kl-horizon",
    "kl_estimator": "--kl-reward-estimator",
    "gamma": "--gamma",
    "lambd": "--lam",
    "value_clip": "--value-clip",
    "freezing_actor_steps": "--freeze-actor-steps",
    "ckpt_path": "--run-dir",
    "temperature": "-temp",
    "top_p": "-topp",
    "max_norm": "--max-grad-norm",
    "l2": "--weight-decay",
    "vllm_num_engines": "-i",
    "zero_stage": "-zero",
    "micro_train_batch_size": "-tmbs",
}
"""OpenRLHF flag -> the coati flag of the same meaning and unit (its value passed as it is)"""

SWITCHES: dict[str, tuple[str, ...]] = {
    "normalize_reward": ("--normalize-reward",),
    "gradient_checkpointing": ("--gradient-checkpointing",),
    "save_value_network": ("--critic-save-value-network",),
    "save_hf_ckpt": ("--save-hf-checkpoints",),
    "colocate_actor_ref": ("--colocate-actor-ref",),
    "colocate_critic_reward": ("--colocate-critic-reward",),
    "colocate_all_models": ("--colocate-all-models",),
    "vllm_enable_sleep": ("--sleep-while-training",),
    "deepspeed_enable_sleep": ("--offload-trainers",),
    "load_checkpoint": ("--resume", "latest"),
    "bf16": ("--precision", "bf16"),
    "adam_offload": ("--cpu-offload",),
    "apply_chat_template": (),
}
"""OpenRLHF's store_true flags -> the coati flags they set (apply_chat_template is coati's default)"""

COUNTS = ("actor", "critic", "ref", "reward")
"""roles with --{role}_num_nodes and --{role}_num_gpus_per_node"""

BATCH = ("rollout_batch_size", "train_batch_size", "micro_rollout_batch_size")
"""batch sizes converted from OpenRLHF's samples over the cluster to coati's prompts per rank"""

ESTIMATORS = {
    "gae": ("PPO", "gae"),
    "reinforce": ("REINFORCE_PP", "reinforce_pp"),
    "reinforce_baseline": ("REINFORCE_PPB", "reinforce_ppb"),
    "rloo": ("RLOO", "rloo"),
    "group_norm": ("GRPO", "grpo"),
    "dr_grpo": ("DR_GRPO", "drgrpo"),
}
"""OpenRLHF's --advantage_estimator -> (coati's preset of it, coati's estimator): the preset where --algo is not
given, the estimator over the given --algo's preset"""

OTHER = ("advantage_estimator", "use_wandb", "use_kl_loss", "eps_clip", "eps_clip_low_high")
"""flags converted by hand below"""

REFUSED: dict[str, str] = {
    "flash_attn": "the attention implementation follows the model and device (SDPA on CPU)",
    "packing_samples": "each group's prompt is computed once (--share-prompt-forward); groups are not packed together",
    "save_path": "the final model is <run folder>/final (--run-dir or --save-dir)",
    "ptx_coef": "no pre-training loss mix-in",
    "pretrain_data": "no pre-training loss mix-in",
    "agent_func_path": "multi-turn environments: --env NAME",
    "remote_rm_url": "reward functions run in the producers: -rt module:function",
    "async_train": "producers roll out while consumers train by default (-nb 1)",
    "enable_prefix_caching": "--inference-options '{\"enable_prefix_caching\": true}'",
    "max_len": "-mpt and -mnt bound prompt and response apart",
    "lr_warmup_ratio": "--warmup-steps",
    "zpg": "ZeRO partitions over the consumers' data-parallel ranks",
    "ring_attn_size": "ring attention is not built; sequence parallelism is all-to-all (--sp-size)",
}
"""OpenRLHF flag -> what to write instead, or why there is nothing to write (names TRL shares are refused by TRL's
table, ``trl.REFUSED``: --eval_steps, --logging_steps, --vllm_gpu_memory_utilization; --save_steps and
--vllm_tensor_parallel_size are coati flags through TRL's table, ``trl.SAME``)"""


def known() -> set[str]:
    roles = {f"{r}_num_{k}" for r in COUNTS for k in ("nodes", "gpus_per_node")}
    return set(SAME) | set(SWITCHES) | roles | set(BATCH) | set(OTHER) | set(REFUSED)


def _split(argv: list[str], ours: set[str]) -> tuple[dict[str, str | None], list[str]]:
    """(OpenRLHF flags -> value, or None for a switch; the other tokens): a known name written with underscores, or
    one that is no coati flag (``ours``) either way."""
    theirs: dict[str, str | None] = {}
    rest: list[str] = []
    i = 0
    names = known()
    while i < len(argv):
        token = argv[i]
        name, eq, value = token.partition("=")
        key = name[2:]
        if not (name.startswith("--") and key in names and ("_" in key or name not in ours)):
            rest.append(token)
            i += 1
            continue
        if key in REFUSED:
            raise ValueError(f"OpenRLHF's --{key} is not a coati flag: {REFUSED[key]}")
        if key in SWITCHES or key == "use_kl_loss":
            following = argv[i + 1].lower() if i + 1 < len(argv) else ""
            if following in ("true", "1", "false", "0"):  # TRL's style: --bf16 True
                i += 1
            if following not in ("false", "0"):
                theirs[key] = None
        elif eq:
            theirs[key] = value
        elif key == "use_wandb" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            theirs[key] = ""
        else:
            if i + 1 == len(argv):
                raise ValueError(f"OpenRLHF's --{key} needs a value")
            theirs[key], i = argv[i + 1], i + 1
        i += 1
    return theirs, rest


def _int(theirs: dict, key: str) -> int:
    try:
        return int(theirs[key])
    except ValueError:
        raise ValueError(f"OpenRLHF's --{key} takes an integer, got {theirs[key]!r}") from None


def _per(total: int, parts: int, what: str, fix: str) -> int:
    if total % parts:
        raise ValueError(f"{what} = {total} does not divide over {parts}; {fix}")
    return total // parts


def translate(argv: list[str], ours: set[str]) -> list[str]:
    """``argv`` with OpenRLHF's flags as coati's (``ours``: coati's flags); raises ValueError for one that has no coati
    setting, or whose units do not convert."""
    theirs, rest = _split(argv, ours)
    if not theirs:
        return list(argv)
    out: list[str] = []
    for key, value in theirs.items():
        if key in SAME:
            out += [SAME[key], str(value)]
        elif key in SWITCHES:
            out += list(SWITCHES[key])
    out += _estimator_and_kl(theirs, any(t.split("=")[0] in ("--algo", "-a") for t in rest))
    counts = _roles(theirs, rest, out)
    out += _batches(theirs, counts["actor"])
    return rest + out


def _estimator_and_kl(theirs: dict, algo_given: bool) -> list[str]:
    out = []
    if "advantage_estimator" in theirs:
        name = theirs["advantage_estimator"]
        if name not in ESTIMATORS:
            near = difflib.get_close_matches(name, list(ESTIMATORS), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ValueError(f"OpenRLHF's --advantage_estimator {name} is unknown; one of {sorted(ESTIMATORS)}{hint}")
        preset, estimator = ESTIMATORS[name]
        out += ["--advantage-estimator", estimator] if algo_given else ["--algo", preset]
    if "use_kl_loss" in theirs:  # the coefficient goes to the loss, not the reward
        coef = theirs.get("init_kl_coef", "0.01")
        out += ["--init-kl-coef", "0", "-kl", str(coef)]
        if "kl_estimator" in theirs:
            out += ["--kl-estimator", theirs["kl_estimator"]]
    if "eps_clip" in theirs:
        out += ["--clip-eps-low", theirs["eps_clip"], "--clip-eps-high", theirs["eps_clip"]]
    if "eps_clip_low_high" in theirs:
        low, _, high = theirs["eps_clip_low_high"].replace(",", " ").partition(" ")
        out += ["--clip-eps-low", low, "--clip-eps-high", high.strip()]
    if "use_wandb" in theirs:
        token = theirs["use_wandb"]
        if token and token.lower() not in ("true", "1"):
            os.environ.setdefault("WANDB_API_KEY", token)  # OpenRLHF passes the key as the flag's value
        out += ["--report-to", "jsonl", "wandb"]
    return out


def _roles(theirs: dict, rest: list[str], out: list[str]) -> dict[str, int]:
    """Each role's processes (nodes x GPUs per node) as coati's counts and layout; {role: processes}."""
    counts = {}
    flags = {"actor": "-t", "critic": "--critic-num-procs", "ref": "--ref-procs", "reward": "--reward-rm-servers"}
    for role in COUNTS:
        nodes_key, gpus_key = f"{role}_num_nodes", f"{role}_num_gpus_per_node"
        if nodes_key not in theirs and gpus_key not in theirs:
            continue
        nodes = _int(theirs, nodes_key) if nodes_key in theirs else 1
        per = _int(theirs, gpus_key) if gpus_key in theirs else 1
        counts[role] = nodes * per
        out += [flags[role], str(nodes * per), f"--{role}-nodes", str(nodes)]
    if "actor" not in counts:
        given = [t for t in rest if t.split("=")[0] in ("-t", "--num-trainers", "--num-consumer-procs")]
        if given and any(k in theirs for k in BATCH):
            raise ValueError(
                "OpenRLHF's batch sizes count samples over the actor's GPUs: give the actor's size as "
                "--actor_num_nodes and --actor_num_gpus_per_node, not -t"
            )
        counts["actor"] = 1
    for flag in ("colocate_actor_ref", "colocate_all_models"):
        if flag in theirs and "ref" not in counts and "init_kl_coef" in theirs:
            out += ["--ref-procs", str(counts["actor"])]  # OpenRLHF's reference group mirrors the actor
            counts["ref"] = counts["actor"]
    return counts


def _batches(theirs: dict, dp: int) -> list[str]:
    """OpenRLHF's sample counts over the cluster as coati's prompts per data-parallel rank."""
    if not any(k in theirs for k in BATCH):
        return []
    n = _int(theirs, "n_samples_per_prompt") if "n_samples_per_prompt" in theirs else 1
    out = []
    train = _int(theirs, "train_batch_size") if "train_batch_size" in theirs else None
    rollout = _int(theirs, "rollout_batch_size") if "rollout_batch_size" in theirs else None
    if train is not None:
        prompts = _per(train, n, "--train_batch_size (samples) / --n_samples_per_prompt", "make it a multiple")
        minibatch = _per(prompts, dp, "prompts per update", f"use a multiple of {n * dp} samples")
        out += ["-tMbs", str(minibatch)]
        rollout = prompts if rollout is None else rollout
    if rollout is not None:
        out += ["-tbs", str(_per(rollout, dp, "--rollout_batch_size (prompts)", f"use a multiple of {dp}"))]
        engines = _int(theirs, "vllm_num_engines") if "vllm_num_engines" in theirs else 1
        out += ["-ibs", str(_per(rollout, engines, "--rollout_batch_size over --vllm_num_engines", "use a multiple"))]
    if "micro_rollout_batch_size" in theirs:
        micro = _per(
            _int(theirs, "micro_rollout_batch_size"),
            n,
            "--micro_rollout_batch_size (samples) / n",
            "use a multiple of n",
        )
        out += ["-imbs", str(micro)]
    return out
