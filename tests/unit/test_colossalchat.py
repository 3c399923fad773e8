"""ColossalChat's parameters onto the config tree, one by one: each lands on its field with its meaning, a value with no
equivalent is refused naming it, and the parameters without a field are stated."""

import pytest
import torch

from coati.distributed.config.colossalchat import translate
from coati.distributed.driver.launch import config_from_launch_kwargs


def base(**over) -> dict:
    kw = dict(
        num_producers=1,
        num_proc_per_producer=1,
        num_consumer_procs=1,
        num_episodes=1,
        inference_batch_size=4,
        inference_microbatch_size=4,
        train_batch_size=4,
        train_minibatch_size=4,
        train_dataset_config={"rows": [{"prompt": "q"}], "max_length": 100, "system_prompt": None},
        inference_model_config={"path": "m"},
        generate_config={},
        train_model_config={"path": "m"},
        grpo_config={"reward_fn_type": "boxed"},
        plugin_config={},
        num_generations=8,
        core_algo="DAPO",
    )
    for key, value in over.items():
        kw[key] = {**kw[key], **value} if isinstance(kw.get(key), dict) and isinstance(value, dict) else value
    return kw


def tree(**over):
    kw, said = translate(base(**over))
    return config_from_launch_kwargs(**kw), said


def test_each_parameter_lands_on_its_field():
    cfg, _ = tree(
        n_behind=2,
        grpo_config={
            "algo": "DAPO",
            "loss_variation": "sample_level",
            "max_length": 164,
            "max_new_tokens": 64,
            "filter_range": [0.01, 0.99],
            "dynamic_batching": True,
            "soft_over_length_punishment": True,
            "cache_length": 16,
            "filter_truncated_response": True,
            "response_format_tags": {"a": {}},
        },
        plugin_config={"max_norm": 0.5, "microbatch_size": 2},
        inference_model_config={"torch_dtype": torch.bfloat16, "use_flash_attention_2": True},
        generate_config={"top_k": -1, "stop": ["</answer>"], "max_tokens": 64},
    )
    assert cfg.run.max_staleness == 2
    a = cfg.algo_config
    assert (a.loss_agg_mode, a.dynamic_sampling, a.overlong_buffer_ratio, a.mask_truncated) == (
        "seq-mean-token-mean",
        True,
        0.25,
        True,
    )
    g = cfg.generation
    assert (g.max_new_tokens, g.max_prompt_tokens, g.top_k, g.stop_strings) == (64, 100, 0, ("</answer>",))
    assert cfg.consumer.max_grad_norm == 0.5 and cfg.model.inference_options == {"dtype": "bfloat16"}
    assert cfg.reward.kwargs == {"tags": {"a": {}}}


def test_the_response_budget_follows_from_max_length_as_colossalchat_computes_it():
    cfg, said = tree(
        generate_config={
            "max_length": 140,
            "max_new_tokens": None,
            "do_sample": True,
            "early_stopping": False,
            "stop_strings": None,
        }
    )
    assert (cfg.generation.max_new_tokens, cfg.generation.max_prompt_tokens) == (40, 100)
    assert any(s.startswith("do_sample=True") for s in said) and any(s.startswith("early_stopping") for s in said)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"grpo_config": {"filter_range": [0.2, 0.8], "dynamic_batching": True}}, "filter_range=\\[0.2, 0.8\\]"),
        ({"grpo_config": {"loss_variation": "seq_level"}}, "loss_variation='seq_level'"),
        ({"grpo_config": {"algo": "GRPO"}}, "algo='GRPO' but core_algo='DAPO'"),
        ({"train_model_config": {"checkpoint_path": "/x"}}, "checkpoint_path='/x'"),
        ({"train_model_config": {"torch_dtype": torch.float16}}, "train_model_config keys \\['dtype'\\]"),
        ({"inference_model_config": {"tensor_parallel_size": 2}}, "tensor_parallel_size=2 but num_proc_per_producer=1"),
        ({"generate_config": {"do_sample": False}}, "do_sample=False"),
        ({"n_behind": 1, "max_staleness": 0}, "n_behind=1 and max_staleness=0"),
        ({"eval_dataset_config": {"a": {"path": "x", "max_length": 50}}}, "max_length \\[50, 100\\]"),
    ],
)
def test_a_value_without_an_equivalent_is_refused_naming_it(over, message):
    with pytest.raises(ValueError, match=message):
        tree(**over)


def test_parameters_without_a_field_are_stated_once():
    _, said = tree(
        eval_save_dir="e",
        rollout_save_dir="r",
        log_rollout_interval=20,
        enable_profiling=True,
        eval_generation_config={"temperature": 0.6},
        grpo_config={"skip_threshold": 20.0},
        plugin_config={"enable_flash_attention": True},
        train_model_config={"use_cache": False, "use_flash_attention_2": True},
    )
    keys = sorted(s.split("=")[0] for s in said)
    assert keys == sorted(
        [
            "eval_save_dir",
            "rollout_save_dir",
            "log_rollout_interval",
            "enable_profiling",
            "eval_generation_config",
            "skip_threshold",
            "enable_flash_attention",
            "use_cache",
            "use_flash_attention_2",
        ]
    ), keys


def test_sequence_and_expert_parallelism_land_on_the_plugin():
    base_kw = {"num_consumer_procs": 4}
    cfg, said = tree(
        **base_kw,
        plugin_config={"sp_size": 2, "enable_sequence_parallelism": True, "sequence_parallelism_mode": "all_to_all"},
    )
    assert (cfg.consumer.plugin.sp_size, cfg.consumer.plugin.sp_mode, cfg.consumer.dp_size) == (2, "all_to_all", 2)
    assert not said
    cfg, _ = tree(**base_kw, plugin_config={"ep_size": 2})
    assert cfg.consumer.plugin.ep_size == 2
    with pytest.raises(ValueError, match="sp_mode=split_gather is refused: ColossalAI runs split_gather and ring"):
        tree(
            **base_kw,
            plugin_config={
                "sp_size": 2,
                "enable_sequence_parallelism": True,
                "sequence_parallelism_mode": "split_gather",
            },
        )
    with pytest.raises(ValueError, match="sp_size=2 without enable_sequence_parallelism=True"):
        tree(**base_kw, plugin_config={"sp_size": 2})
