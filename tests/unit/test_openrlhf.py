"""OpenRLHF's train_ppo_ray flags on coati's command line: same-meaning flags pass through, batch sizes convert from
samples over the cluster to prompts per rank, role node counts become process counts and the layout, and a flag
without a coati setting is refused in one line naming the nearest; the docs' table lists every flag handled."""

import re
from pathlib import Path

import pytest

from coati.distributed.config import openrlhf
from coati.distributed.config.cli import parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_guides_flags_convert_in_coatis_units():
    cfg = parse_config(
        "--advantage_estimator gae --actor_num_nodes 2 --actor_num_gpus_per_node 2 --critic_num_nodes 1 "
        "--critic_num_gpus_per_node 2 --ref_num_nodes 1 --ref_num_gpus_per_node 1 --n_samples_per_prompt 4 "
        "--train_batch_size 32 --rollout_batch_size 16 --micro_train_batch_size 2 --micro_rollout_batch_size 8 "
        "--max_epochs 2 --prompt_max_len 256 --generate_max_len 64 --init_kl_coef 0.02 --kl_target 0.1 "
        "--critic_learning_rate 5e-6 --actor_learning_rate 1e-6 --normalize_reward --save_value_network "
        "--save_hf_ckpt --gradient_checkpointing --zero_stage 2 --bf16 --save_steps 5 --gamma 0.99 --lambd 0.9 "
        "--value_clip 0.3 --freezing_actor_steps 2 --deepspeed_enable_sleep --vllm_enable_sleep -nb 0".split()
    )
    c, k, a = cfg.consumer, cfg.critic, cfg.algo_config
    assert cfg.algo == "PPO" and a.advantage_estimator == "gae"
    assert c.num_consumer_procs == 4 and cfg.layout.actor_nodes == 2  # 2 nodes x 2 GPUs
    assert k.num_procs == 2 and cfg.layout.critic_nodes == 1 and k.learning_rate == 5e-6
    assert cfg.layout.ref_procs == 1 and cfg.layout.ref_nodes == 1
    assert cfg.producer.num_generations == 4
    assert c.train_batch_size == 4  # 16 prompts a rollout over 4 DP ranks
    assert c.train_minibatch_size == 2  # 32 samples an update = 8 prompts, over 4 ranks
    assert c.train_microbatch_size == 2 and c.num_iterations == 2  # samples per forward: the same unit
    assert cfg.producer.inference_batch_size == 16 and cfg.producer.inference_microbatch_size == 2
    assert (cfg.generation.max_prompt_tokens, cfg.generation.max_new_tokens) == (256, 64)
    assert (a.init_kl_coef, a.kl_target, a.gamma, a.lam, a.value_clip) == (0.02, 0.1, 0.99, 0.9, 0.3)
    assert a.normalize_reward and a.freeze_actor_steps == 2 and c.learning_rate == 1e-6
    assert k.save_value_network and cfg.run.save_hf_checkpoints and c.gradient_checkpointing
    assert c.plugin.zero_stage == 2 and c.plugin.precision == "bf16" and cfg.run.save_interval == 5
    assert cfg.run.offload_trainers and cfg.run.sleep_while_training  # both sides give up memory between phases


def test_kl_in_the_loss_and_the_estimators_map():
    cfg = parse_config("--advantage_estimator group_norm --use_kl_loss --init_kl_coef 0.001 --kl_estimator k3".split())
    a = cfg.algo_config
    assert cfg.algo == "GRPO" and a.beta == 0.001 and a.init_kl_coef == 0 and a.kl_estimator == "k3"
    over = parse_config("--algo DAPO --advantage_estimator rloo".split())
    assert over.algo == "DAPO" and over.algo_config.advantage_estimator == "rloo"
    assert parse_config(["--eps_clip_low_high", "0.2 0.28"]).algo_config.clip_eps_high == 0.28


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        ("--packing_samples", "OpenRLHF's --packing_samples is not a coati flag: each group's prompt"),
        ("--adam_offload", "cpu_offload moves ZeRO's optimizer states to host memory: it needs zero_stage 1 or 2"),
        ("--advantage_estimator gea", r"unknown; one of .* \(did you mean gae\?\)"),
        ("--train_batch_size 30 --n_samples_per_prompt 4", r"\(samples\) / --n_samples_per_prompt = 30 does not"),
        ("-t 2 --rollout_batch_size 8", "give the actor's size as --actor_num_nodes"),
        ("--actor_num_nodes x", "takes an integer, got 'x'"),
    ],
)
def test_what_does_not_convert_is_refused_in_one_line(argv, match, capsys):
    with pytest.raises(SystemExit):
        parse_config(argv.split())
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(match, err), err


def test_the_docs_table_lists_every_flag_handled():
    page = (ROOT / "docs/coming-from-openrlhf.md").read_text()
    listed = set(re.findall(r"`--([a-z_0-9]+)`", page))
    assert openrlhf.known() <= listed, sorted(openrlhf.known() - listed)
