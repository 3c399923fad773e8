"""Config validation: each bad value fails at construction with a message that names it and the fix."""

import dataclasses

import pytest

from coati.distributed.algo import ALGO_MAP, resolve_algorithm
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.checks import field_docs
from coati.distributed.config.tree import Config, RunConfig
from coati.distributed.inference.config import GenerationConfig
from coati.distributed.rollout.config import ProducerConfig
from coati.distributed.trainer.config import ConsumerConfig, PluginConfig
from coati.registry import Registry, resolve_callable

BAD = [
    (lambda: GenerationConfig(temperature=0), "temperature must be > 0, got 0"),
    (lambda: GenerationConfig(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
    (lambda: GenerationConfig(max_new_tokens=0), "GenerationConfig.max_new_tokens must be a positive integer, got 0"),
    (lambda: resolve_algorithm("GRPO", advantage_estimator="ppo"), "unknown advantage estimator .ppo.; known: grpo"),
    (lambda: resolve_algorithm("GRPO", policy_loss="clip"), "unknown policy loss 'clip'; known: ppo_clip, gspo, cispo"),
    (lambda: resolve_algorithm("GRPO", loss_agg_mode="mean"), "unknown loss aggregation 'mean'; known: token-mean"),
    (lambda: resolve_algorithm("GRPO", kl_estimator="k4"), "unknown KL estimator 'k4'; known: k1, k2, k3"),
    (lambda: AlgorithmConfig(dual_clip_c=0.5), "dual_clip_c must be > 1"),
    (lambda: AlgorithmConfig(beta=-1), "beta must be >= 0, got -1"),
    (
        lambda: resolve_algorithm("GRPO", off_policy_correction="is"),
        "unknown off-policy correction 'is'; known: none, tis, icepop",
    ),
    (lambda: AlgorithmConfig(tis_cap=None), r"tis_cap must be a number >= 1 \(off: off_policy_correction='none'\)"),
    (lambda: AlgorithmConfig(is_mask_low=1.5), "need 0 < is_mask_low < 1 < is_mask_high, got 1.5 and 2.0"),
    (lambda: ProducerConfig(num_generations=1), "num_generations must be >= 2"),
    (
        lambda: ProducerConfig(inference_batch_size=6, inference_microbatch_size=4),
        "inference_batch_size=6 is not divisible by inference_microbatch_size=4; use inference_microbatch_size=3 or 6",
    ),
    (
        lambda: ConsumerConfig(train_batch_size=6, train_minibatch_size=4),
        "train_batch_size=6 is not divisible by train_minibatch_size=4; use train_minibatch_size=3 or 6",
    ),
    (
        lambda: ConsumerConfig(num_consumer_procs=3, plugin=PluginConfig(tp_size=2)),
        r"num_consumer_procs=3 is not divisible by tp_size \* pp_size=2",
    ),
    (lambda: PluginConfig(zero_stage=3), "zero_stage=3 is refused: ColossalAI 0.5's ZeRO-3 paths need an accelerator"),
    (lambda: PluginConfig(zero_stage=4), "zero_stage must be 0, 1 or 2, got 4"),
    (lambda: PluginConfig(precision="fp8"), "precision must be fp32, bf16 or fp16, got 'fp8'"),
    (lambda: PluginConfig(pp_size=2, zero_stage=2, precision="bf16"), "zero_stage=2 cannot be combined with pp_size=2"),
    (lambda: PluginConfig(zero_stage=1), "zero_stage=1 needs precision bf16 or fp16"),
    (lambda: PluginConfig(ep_size=2, tp_size=2), "ep_size=2 splits experts over data-parallel ranks; it is not"),
    (lambda: PluginConfig(sp_size=2, sp_mode="ring"), "sp_mode=ring is refused: ColossalAI runs split_gather and"),
    (lambda: PluginConfig(sp_size=2, sp_mode="ulysses"), "sp_mode must be one of"),
    (lambda: PluginConfig(sp_size=2, tp_size=2), "sp_size=2 is not combined with tensor, pipeline or expert"),
    (
        lambda: ConsumerConfig(num_consumer_procs=3, plugin=PluginConfig(sp_size=2)),
        r"num_consumer_procs=3 is not divisible by tp_size \* pp_size \* sp_size=2",
    ),
    (
        lambda: PluginConfig(ep_size=2, zero_stage=1, precision="bf16"),
        "ep_size=2 with zero_stage=1 is refused: ColossalAI 0.5's MoE ZeRO optimizer measures",
    ),
    (
        lambda: ConsumerConfig(num_consumer_procs=3, plugin=PluginConfig(ep_size=2)),
        "dp_size=3 is not divisible by ep_size=2; use ep_size=1 or 3",
    ),
    (
        lambda: ConsumerConfig(num_consumer_procs=2, lora_rank=8, plugin=PluginConfig(ep_size=2)),
        "ep_size=2 shards the experts that full fine-tuning trains",
    ),
    (
        lambda: Config(
            producer=ProducerConfig(num_generations=3),
            consumer=ConsumerConfig(train_batch_size=2, train_minibatch_size=2, train_microbatch_size=4),
        ),
        r"train_minibatch_size \* num_generations=6 is not divisible by train_microbatch_size=4",
    ),
    (  # a micro-batch larger than the minibatch used to end in StopIteration while building the message
        lambda: Config(
            producer=ProducerConfig(num_generations=2),
            consumer=ConsumerConfig(train_batch_size=2, train_minibatch_size=2, train_microbatch_size=8),
        ),
        r"train_minibatch_size \* num_generations=4 is not divisible by train_microbatch_size=8; use "
        r"train_microbatch_size=4 \(at most train_minibatch_size \* num_generations\)",
    ),
    (
        lambda: Config(
            producer=ProducerConfig(inference_batch_size=3, inference_microbatch_size=3),
            consumer=ConsumerConfig(train_batch_size=2, train_minibatch_size=2, train_microbatch_size=2),
        ),
        "one must divide the other",
    ),
    (lambda: RunConfig(num_episodes=0), "RunConfig.num_episodes must be a positive integer, got 0"),
    (lambda: resolve_algorithm("TRPO"), "unknown algorithm 'TRPO'; known: CISPO, DAPO, DR_GRPO, GRPO, GSPO, OPD, PPO"),
    (lambda: resolve_algorithm("DAPO", clip_high=0.3), r"unknown algorithm option\(s\) \['clip_high'\]"),
]


@pytest.mark.parametrize("make, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_config_errors_name_value_and_fix(make, message):
    with pytest.raises((ValueError, KeyError), match=message):
        make()


def test_configs_are_frozen():
    cfg = GenerationConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.temperature = 2.0


def test_derived_values():
    cfg = Config(
        producer=ProducerConfig(num_producers=2, inference_batch_size=4, inference_microbatch_size=2),
        consumer=ConsumerConfig(
            num_consumer_procs=4,
            train_batch_size=2,
            train_minibatch_size=1,
            train_microbatch_size=4,
            plugin=PluginConfig(tp_size=2),
        ),
    )
    assert cfg.consumer.dp_size == 2
    assert cfg.global_train_batch_size == 4


def test_every_field_has_a_docstring():
    from coati.distributed.reward.config import EnvConfig, JudgeConfig, RewardConfig, RewardModelConfig

    sections = (GenerationConfig, AlgorithmConfig, ProducerConfig, PluginConfig, ConsumerConfig, Config, RunConfig)
    for cls in (*sections, RewardConfig, EnvConfig, RewardModelConfig, JudgeConfig):
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


def test_dapo_preset_defaults():
    dapo = ALGO_MAP["DAPO"]
    assert (dapo.clip_eps_low, dapo.clip_eps_high) == (0.2, 0.28)
    assert dapo.loss_agg_mode == "token-mean" and dapo.beta == 0
    assert dapo.dynamic_sampling and dapo.overlong_buffer_ratio > 0


def test_resolve_algorithm_overrides():
    cfg = resolve_algorithm("DAPO", beta=0.01, clip_eps_high=None)
    assert cfg.beta == 0.01 and cfg.clip_eps_high == 0.28
    assert ALGO_MAP["DAPO"].beta == 0  # the preset itself is untouched


def test_registry_rejects_duplicates_and_lists_known_names():
    reg = Registry("widget")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 2)
    with pytest.raises(KeyError, match="unknown widget 'b'; known: a"):
        reg.get("b")


def test_resolve_callable_dotted_path():
    reg = Registry("reward function")
    assert resolve_callable("math:sqrt", reg)(4.0) == 2.0
    with pytest.raises(ValueError, match="module 'math' has no attribute 'nope'"):
        resolve_callable("math:nope", reg)
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod_xyz'"):
        resolve_callable("no_such_mod_xyz:f", reg)


def test_compute_dtype_auto_is_bf16_only_over_fp32_weights_on_native_bf16_hardware():
    import torch

    from coati.distributed.model.precision import native_bf16, resolve_compute_dtype

    cpu = torch.device("cpu")
    assert resolve_compute_dtype("fp32", cpu, "fp32") == "fp32" and resolve_compute_dtype("bf16", cpu, "fp32") == "bf16"
    assert resolve_compute_dtype("auto", cpu, "bf16") == "fp32"  # the weights are bf16 already: no autocast on top
    assert resolve_compute_dtype("auto", cpu, "fp32") == ("bf16" if native_bf16(cpu) else "fp32")
    assert resolve_compute_dtype("auto", cpu, "fp32", tp_size=2) == "fp32"  # TP layers' backward ignores autocast


def test_model_paths_and_hub_ids_are_told_apart(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from coati.distributed.driver.preflight import resolve_model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        FileNotFoundError,
        match=r"'HuggingFaceTB/SmolLM2-135M' is not a local folder, and the hub is "
        r"offline \(HF_HUB_OFFLINE=1\)",
    ):
        resolve_model_path("HuggingFaceTB/SmolLM2-135M", "train model")
    with pytest.raises(FileNotFoundError, match=r"'\./models/x' is not a local folder \(nor a hub id"):
        resolve_model_path("./models/x", "train model")
    # Online (this machine has no route to the hub): the download is tried, and its failure named, before any actor.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(
        FileNotFoundError,
        match=r"'HuggingFaceTB/SmolLM2-135M' is not a local folder, and fetching it "
        r"from the hub failed: \w+",
    ):
        resolve_model_path("HuggingFaceTB/SmolLM2-135M", "train model")


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -float("inf"), 1e400, True])
def test_reward_component_weights_must_be_finite_numbers(weight):
    from coati.distributed.reward.config import RewardConfig

    with pytest.raises(ValueError, match="reward components"):
        RewardConfig(components={"math": weight})


def test_the_math_reward_refuses_a_gold_answer_that_is_not_an_answer_before_the_run(tmp_path):
    from coati.distributed.driver.preflight import check_gold_answers
    from coati.distributed.rollout.data import as_row

    rows = [{"prompt": "p", "gt_answer": "4"}, {"prompt": "q", "gt_answer": 7}]
    check_gold_answers("math", rows, "training set")
    for bad in ([42], {"a": 1}, True, float("nan"), None):
        with pytest.raises(ValueError, match=r"training set row 2 \(\{\"prompt\": \"r\""):
            check_gold_answers("math", [*rows, {"prompt": "r", "gt_answer": bad}], "training set")
    check_gold_answers("code", [{"prompt": "r", "gt_answer": [1]}], "training set")  # not the math reward's column
    # An answer column read from nested data keeps a list a list (refused above), and a number becomes its text.
    assert as_row({"q": "p", "a": {"v": [42]}}, "q", "a.v", "row 0")["gt_answer"] == [42]
    assert as_row({"q": "p", "a": 42}, "q", "a", "row 0")["gt_answer"] == "42"


def test_further_reward_functions_are_components_beside_the_run_s_own():
    from coati.distributed.reward.config import RewardConfig

    r = RewardConfig(fn="math", components={"math": 1.0, "trl.rewards:think_format_reward": 0.5})
    assert r.other_fns == ("trl.rewards:think_format_reward",) and r.weights["math"] == 1.0
    assert RewardConfig(fn="math", components={"math": 1.0, "code": 0.5}).other_fns == ("code",)
    with pytest.raises(ValueError, match="name further reward functions but not the run's own, 'math'"):
        RewardConfig(fn="math", components={"code": 1.0})
    with pytest.raises(ValueError, match="further reward functions \\(registered names, package.module:function\\)"):
        RewardConfig(fn="math", components={"math": 1.0, "nosuch": 0.5})


def test_a_run_of_your_own_data_runs_every_episode_unless_told_to_stop():
    """``max_steps`` left unset stops only the built-in demo task (the default job) after DEMO_STEPS; a dataset of
    one's own runs all its episodes (it was cut at 30 steps without a word)."""
    from coati.distributed.config.tree import DEMO_STEPS, DataConfig

    assert Config().step_limit == DEMO_STEPS == 30
    assert Config(data=DataConfig(train="my_data.jsonl")).step_limit is None
    assert Config(data=DataConfig(train_size=64)).step_limit is None  # the task, sized by its user
    assert Config(run=RunConfig(max_steps=5), data=DataConfig(train="my_data.jsonl")).step_limit == 5


def test_a_run_folder_s_config_yaml_runs_the_same_tree_again(tmp_path, monkeypatch):
    """``config.yaml`` holds the resolved tree (the preset written out) and ``--config`` reads it back to the same
    run; ``command.txt`` and ``env.json`` say how and where it ran. From a folder of its own: an existing ``runs/``
    (``make run`` before ``make test``) is written out absolute, which a relative default would not equal."""
    import json

    monkeypatch.chdir(tmp_path)
    from coati.distributed.config.cli import parse_config
    from coati.distributed.driver.job import description

    config = parse_config(["--algo", "grpo", "--clip-eps-high", "0.3", "-lr", "3e-6", "-d", "my.jsonl"])
    files = description(config)
    (tmp_path / "config.yaml").write_text(files["config.yaml"])
    again = parse_config(["--config", str(tmp_path / "config.yaml")])
    assert again.algo_config == config.algo_config and again.algo_config.clip_eps_high == 0.3
    for section in ("model", "data", "producer", "consumer", "generation", "reward", "run"):
        assert getattr(again, section) == getattr(config, section), section
    env = json.loads(files["env.json"])
    assert env["machine"]["cores"] >= 1 and "torch" in env["versions"] and env["matmul_gflops_1_thread"]["float32"] > 0
    assert "python" in files["command.txt"]


def test_the_reward_section_nests_its_environment_reward_model_and_judge(tmp_path):
    """A config file writes ``reward.rm``, ``reward.judge`` and ``reward.env`` as sections of their own (an
    environment also by its name alone); the flat spelling of a nested field is refused naming its place; the flags
    keep their names."""
    from coati.distributed.config.cli import parse_config
    from coati.distributed.config.tree import config_from_dict

    tree = {
        "reward": {
            "components": {"math": 1.0, "rm": 0.5},
            "rm": {"path": "rm_folder", "normalize": "group", "servers": 2},
            "judge": {"max_score": 5},
            "env": "retry",
        }
    }
    cfg = config_from_dict(tree)
    assert (cfg.reward.rm.path, cfg.reward.rm.normalize, cfg.reward.rm.servers) == ("rm_folder", "group", 2)
    assert cfg.reward.judge.max_score == 5.0 and cfg.reward.env.name == "retry" and cfg.reward.episodes
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['rm_path'\].*reward.rm_path is reward.rm.path"):
        config_from_dict({"reward": {"rm_path": "rm_folder"}})
    with pytest.raises(ValueError, match=r"reward.rm.normalize must be one of"):
        config_from_dict({"reward": {"rm": {"normalize": "zscore"}}})
    argv = ["--reward-rm-path", "rm_folder", "--reward-components", '{"math": 1, "rm": 1}', "--env", "retry"]
    flagged = parse_config(argv + ["--env-max-turns", "2", "--reward-judge-timeout-s", "9"])
    assert flagged.reward.rm.path == "rm_folder" and flagged.reward.env == type(cfg.reward.env)("retry", max_turns=2)
    assert flagged.reward.judge.timeout_s == 9.0


def test_a_checkpoint_recorded_with_the_flat_reward_section_resumes_under_the_nested_names():
    """A checkpoint's record from a run whose reward section was flat (``rm_path``, ``env``) matches the same run
    now; a value that really differs is still named."""
    from coati.distributed.driver.checkpoint import check_compatible, config_dict
    from coati.distributed.reward.config import RewardConfig, RewardModelConfig

    cfg = Config(reward=RewardConfig(components={"math": 1.0, "rm": 1.0}, rm=RewardModelConfig(path="rm", servers=2)))
    record = config_dict(cfg)
    flat = {k: v for k, v in record["reward"].items() if k not in ("env", "rm", "judge")}
    for section in ("rm", "judge", "env"):
        for name, value in record["reward"][section].items():
            flat[section if (section, name) == ("env", "name") else f"{section}_{name}"] = value
    old = {**record, "reward": flat}
    check_compatible({"config": old}, {"config": record}, "step-3")
    with pytest.raises(ValueError, match=r"config.reward.rm.servers: checkpoint 3, this run 2"):
        check_compatible({"config": {**old, "reward": {**flat, "rm_servers": 3}}}, {"config": record}, "step-3")


def test_a_checkpoint_recorded_before_ppos_fields_existed_resumes_a_run_that_leaves_them_at_their_defaults():
    """A DAPO checkpoint written before the critic section and PPO's algorithm fields existed matches the same run
    now; a run that sets one of those fields is told so."""
    from coati.distributed.driver.checkpoint import check_compatible, config_dict

    record = config_dict(Config())
    old = {k: v for k, v in record.items() if k != "critic"}
    old["algorithm"] = {k: v for k, v in record["algorithm"].items() if k not in ("gamma", "lam", "init_kl_coef")}
    check_compatible({"config": old}, {"config": record}, "step-3")
    changed = config_dict(Config(algorithm={"gamma": 0.9}))
    with pytest.raises(ValueError, match=r"config.algorithm.gamma: checkpoint None, this run 0.9"):
        check_compatible({"config": old}, {"config": changed}, "step-3")


def test_every_preset_names_registered_functions():
    """A run that overrides no function name is not checked against the registries (they import torch): the
    presets' names are checked here instead."""
    from coati.distributed.algo.config import check_registered

    for name in ALGO_MAP:
        check_registered(ALGO_MAP[name])


def test_the_command_line_and_the_file_checks_run_without_torch(tmp_path):
    """Parsing a command and the input checks that read files import no torch (seconds on a 2-core machine): a
    mistyped dataset path or model folder ends in one line before it loads."""
    import subprocess
    import sys

    script = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch fails
        "from coati.distributed.config.cli import parse_config\n"
        "from coati.distributed.driver.preflight import check_files\n"
        "config = parse_config(['-d', 'nope.jsonl', '--algo', 'RLOO'])\n"
        "try:\n"
        "    check_files(config)\n"
        "except FileNotFoundError as e:\n"
        "    print('refused:', e)\n"
    )
    import os
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout's coati
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: dataset file or folder nope.jsonl does not exist" in out.stdout, out.stdout


def test_a_machine_without_a_gpu_is_told_without_importing_torch(tmp_path, monkeypatch):
    """``local_gpus`` decides from torch's build and the GPU device files, importing torch (seconds) only where a GPU
    may be there."""
    import importlib.metadata
    import sys

    from coati.distributed.driver import preflight

    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch would fail
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.13.0+cpu")
    (tmp_path / "nvidia0").touch()
    assert preflight.local_gpus(str(tmp_path)) is False  # a CPU build sees no GPU, device file or not
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.11.0+cu130")
    (tmp_path / "nvidia0").unlink()
    assert preflight.local_gpus(str(tmp_path)) is False  # a CUDA build, but no device file
    (tmp_path / "nvidia0").touch()
    try:
        preflight.local_gpus(str(tmp_path))
    except ImportError:
        pass  # with a device file it asks torch
    else:
        raise AssertionError("local_gpus decided without torch where a GPU may be there")
