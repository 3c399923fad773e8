"""The config tree declared once: the CLI generated from it, config files, and launch_distributed's adapter share one
set of fields, docstrings and defaults."""

import dataclasses
import json

import pytest

from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.checks import field_docs
from coati.distributed.config.cli import build_parser, flags, parse_config
from coati.distributed.config.tree import SECTIONS, Config, config_from_dict
from coati.distributed.driver.launch import config_from_launch_kwargs
from coati.distributed.rollout.data import DatasetSpec


def leaf_keys():
    def leaves(prefix, cls):
        for f in dataclasses.fields(cls):
            sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
            if sub is not None and dataclasses.is_dataclass(sub):
                yield from leaves(f"{prefix}.{f.name}", sub)
            else:
                yield f"{prefix}.{f.name}"

    keys = {"algo"}
    for section, cls in SECTIONS.items():
        keys |= set(leaves(section, cls))
    keys |= {f"algorithm.{f.name}" for f in dataclasses.fields(AlgorithmConfig)}
    assert {"consumer.plugin.tp_size", "reward.rm.path", "reward.judge.template", "reward.env.name"} <= keys
    return keys


def test_every_field_is_a_flag_with_its_docstring_as_help():
    by_key = {f.key: f for f in flags()}
    assert leaf_keys() <= set(by_key), sorted(leaf_keys() - set(by_key))
    for key, flag in by_key.items():
        if key in ("config", "reward_weights"):  # a file of the tree; a spelling of reward.components
            continue
        *parents, name = key.split(".")
        cls = AlgorithmConfig if parents == ["algorithm"] else (SECTIONS[parents[0]] if parents else Config)
        for parent in parents[1:]:  # a nested section: consumer.plugin, reward.rm
            cls = next(f.default_factory for f in dataclasses.fields(cls) if f.name == parent)
        assert flag.help.startswith(field_docs(cls)[name]), key
    text = build_parser(everything=True).format_help()
    assert "completions sampled per prompt (the group size G) (default: 4)" in " ".join(text.split())


def test_help_fits_a_screen_and_help_all_lists_every_flag():
    """``--help`` (599 lines before) shows the flags most runs set, with their choices and short aliases (``-tbs``:
    what the examples use), in about a screen; ``--help-all`` lists every field with every alias, algorithm flags
    with the default preset's value."""
    short, full = build_parser().format_help(), build_parser(everything=True).format_help()
    assert len(short.splitlines()) <= 65, len(short.splitlines())
    assert (
        "--algo {GRPO,DAPO,DR_GRPO,RLOO,REINFORCE_PPB,GSPO,CISPO,PPO,REINFORCE_PP,OPD}" in short
        and "-tbs INT, --train-batch-size" in short
    )
    for alias in ("-m STR, --model-path", "-d STR, --data-train", "-g INT", "-mnt INT", "-rt FN", "-lr FLOAT"):
        assert alias in short, alias
    assert "--num-trainers" not in short and "-t INT, --num-consumer-procs INT, --num-trainers INT" in full
    assert "--backend {transformers,vllm,sglang}" in short and "--clip-eps-high" not in short
    every = {s for f in flags() for s in f.names}
    assert all(name in full for name in every), sorted(n for n in every if n not in full)
    primaries = {next(n for n in f.names if n.startswith("--")) for f in flags()}
    assert all(p in full for p in primaries) and "the preset's; DAPO's is 0.28" in " ".join(full.split())
    assert parse_config(["-tbs", "2", "-g", "8"]).consumer.train_batch_size == 2 and every


def test_several_reward_functions_with_weights_are_the_reward_s_components(capsys):
    """TRL's reward_funcs and reward_weights on the command line."""
    acc, fmt = "trl.rewards:accuracy_reward", "tests.component.reward_fns:plain_floats"
    c = parse_config(["--reward-fn", acc, fmt, "--reward-weights", "1", "0.5"])
    assert c.reward.fn == acc and c.reward.components == {acc: 1.0, fmt: 0.5}
    assert parse_config(["-rt", "math", fmt]).reward.components == {"math": 1.0, fmt: 1.0}
    assert parse_config(["-rt", "boxed"]).reward.components == {}
    for argv, message in [
        (["--reward-fn", "math", fmt, "--reward-weights", "1"], "must give one weight to each distinct"),
        (["--reward-weights", "1"], "but none were given"),
        (["--reward-fn", "math", fmt, "--reward-components", '{"math": 1}'], "use one"),
    ]:
        with pytest.raises(SystemExit):
            parse_config(argv)
        assert message in capsys.readouterr().err


def test_defaults_are_the_default_jobs_and_launch_distributed_shares_them():
    cli = parse_config([])
    assert cli == Config()
    launch = config_from_launch_kwargs(
        num_producers=1,
        num_proc_per_producer=1,
        num_consumer_procs=1,
        num_episodes=1,
        inference_batch_size=16,
        inference_microbatch_size=16,
        train_batch_size=4,
        train_minibatch_size=4,
        train_dataset_config={"path": "x.jsonl"},
        inference_model_config={"path": "m"},
        generate_config={},
        train_model_config={"path": "m"},
        grpo_config={},
        plugin_config={},
    )
    for field in ("producer", "consumer", "generation", "reward", "algo", "algorithm"):
        assert getattr(launch, field) == getattr(cli, field), field
    for name in ("max_staleness", "eval_interval", "seed", "keep_checkpoints", "weight_sync_timeout_s"):
        assert getattr(launch.run, name) == getattr(cli.run, name), name
    lc = cli
    assert (
        lc.producer.backend,
        lc.producer.num_generations,
        lc.producer.inference_batch_size,
        lc.consumer.train_microbatch_size,
        lc.consumer.learning_rate,
        lc.generation.max_new_tokens,
        cli.run.max_staleness,
    ) == ("vllm", 4, 16, None, 2e-5, 48, 1)
    a = lc.algo_config  # the default job is DAPO with dynamic sampling and signal-less prompts skipped after one group
    assert (a.dynamic_sampling, a.skip_no_signal_after, a.skip_recheck) == (True, 1, 0.1)
    assert parse_config(["--skip-no-signal-after", "0"]).algo_config.skip_no_signal_after == 0


def test_reference_flags_stay_as_aliases_and_algorithm_flags_override_the_preset():
    c = parse_config(
        [
            "-g",
            "8",
            "-tbs",
            "2",
            "--n-behind",
            "0",
            "-kl",
            "0.1",
            "-a",
            "GRPO",
            "--clip-eps-high",
            "0.3",
            "-t",
            "2",
            "-tp",
            "2",
            "--inference-options",
            '{"dtype": "bfloat16"}',
            "--no-progress",
        ]
    )
    assert c.producer.num_generations == 8 and c.consumer.train_batch_size == 2 and c.run.max_staleness == 0
    assert c.consumer.plugin.tp_size == 2 and c.model.inference_options == {"dtype": "bfloat16"} and not c.run.progress
    algo = c.algo_config
    assert (algo.beta, algo.clip_eps_high, algo.clip_eps_low, algo.kl_estimator) == (0.1, 0.3, 0.2, "k3")  # GRPO's rest


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file_then_flags(tmp_path, suffix):
    tree = {
        "algo": "RLOO",
        "producer": {"num_generations": 6, "backend": "transformers"},
        "consumer": {"learning_rate": 1e-4, "plugin": {"precision": "bf16"}},
        "algorithm": {"beta": 0.05},
        "run": {"max_steps": 7, "resume_allow": ["consumer.learning_rate"]},
        "data": {"train": "a.jsonl"},
    }
    path = tmp_path / f"c{suffix}"
    if suffix == ".yaml":
        import yaml

        path.write_text(yaml.safe_dump(tree))
    else:
        path.write_text(json.dumps(tree))
    c = parse_config(["--config", str(path), "-g", "2", "--max-steps", "none"])
    assert c.algo == "RLOO" and c.producer.num_generations == 2 and c.producer.backend == "transformers"
    assert c.consumer.learning_rate == 1e-4 and c.consumer.plugin.precision == "bf16" and c.algorithm == {"beta": 0.05}
    assert c.run.max_steps is None and c.run.resume_allow == ("consumer.learning_rate",) and c.data.train == "a.jsonl"
    assert config_from_dict(dataclasses.asdict(c)) == c  # a saved tree loads back as itself


@pytest.mark.parametrize(
    "tree, match",
    [
        ({"producers": {}}, r"unknown config section\(s\) \['producers'\]; known: \['algo', 'algorithm', 'model'"),
        (
            {"producer": {"num_generation": 4}},
            r"unknown field\(s\) \['num_generation'\] in config section producer; "
            r"known: \['backend', 'inference_batch_size'",
        ),
        ({"consumer": {"plugin": {"tp": 2}}}, r"unknown field\(s\) \['tp'\] in config section consumer.plugin"),
        ({"algorithm": {"clip_high": 0.3}}, r"unknown algorithm field\(s\) \['clip_high'\]"),
        ({"run": {"max_staleness": -1}}, r"max_staleness must be a non-negative integer, got -1"),
        ({"run": {"sleep_while_training": True}}, r"sleep_while_training=True .* set max_staleness=0"),
        ({"run": {"offload_trainers": True}}, r"offload_trainers=True .* set max_staleness=0"),
        ({"run": {"resume": "latest", "save_dir": None}}, r"resume needs a run folder"),
        ({"consumer": {"compute_dtype": "fp16"}}, r"compute_dtype must be auto, fp32 or bf16, got 'fp16'"),
        (
            {"consumer": {"compute_dtype": "bf16", "plugin": {"precision": "bf16"}}},
            r"compute_dtype=bf16 autocasts over fp32 weights, but plugin precision=bf16 .* use one of the two",
        ),
        (
            {"consumer": {"num_consumer_procs": 2, "compute_dtype": "bf16", "plugin": {"tp_size": 2}}},
            r"compute_dtype=bf16 autocasts, but ColossalAI's tensor-parallel layers \(tp_size=2\) .* use compute_dtype",
        ),
        (
            {"algo": "GRPO", "algorithm": {"skip_no_signal_after": 2}},
            r"skip_no_signal_after=2 skips prompts .* dynamic_sampling is off; turn it on",
        ),
        (
            {"algorithm": {"dynamic_sampling": False}},  # DAPO's preset skips signal-less prompts: the error names it
            r"skip_no_signal_after=1 skips prompts .* dynamic_sampling is off; .* or set skip_no_signal_after=0",
        ),
        (
            {"algorithm": {"dynamic_sampling_max_draws": 0}},
            r"dynamic_sampling_max_draws must be an integer >= 1, got 0",
        ),
        (
            {"run": {"in_flight_weight_updates": True, "max_staleness": 0}},
            r"in_flight_weight_updates=True .* max_staleness=0 has them idle at every push; set max_staleness >= 1",
        ),
        (
            {"producer": {"stream_prompts": 8}},
            r"stream_prompts=8: a draw keeps all its inference_batch_size=16 prompts in the engine; use 0 \(rounds\) "
            r"or an integer >= 16",
        ),
        (
            {"run": {"in_flight_weight_updates": "yes"}},
            r"in_flight_weight_updates must be true, false or null \(auto\), got 'yes'",
        ),
    ],
)
def test_unknown_or_bad_keys_are_errors(tree, match):
    with pytest.raises(ValueError, match=match):
        config_from_dict(tree)


def test_launch_distributed_refuses_what_has_no_field():
    base = dict(
        num_producers=1,
        num_proc_per_producer=1,
        num_consumer_procs=1,
        num_episodes=1,
        inference_batch_size=4,
        inference_microbatch_size=4,
        train_batch_size=4,
        train_minibatch_size=4,
        inference_model_config={"path": "m"},
        generate_config={},
        train_model_config={"path": "m"},
        plugin_config={},
    )
    with pytest.raises(ValueError, match=r"unknown grpo_config key\(s\) \['learning_rate'\]"):
        config_from_launch_kwargs(**base, train_dataset_config={"path": "x"}, grpo_config={"learning_rate": 1})
    with pytest.raises(ValueError, match=r"unknown dataset config key\(s\) \['shuffle'\]"):
        config_from_launch_kwargs(**base, train_dataset_config={"path": "x", "shuffle": True}, grpo_config={})
    with pytest.raises(ValueError, match="dataloaders_config is not supported"):
        config_from_launch_kwargs(
            **base, train_dataset_config={"path": "x"}, grpo_config={}, dataloaders_config={"a": 1}
        )
    c = config_from_launch_kwargs(
        **base,
        train_dataset_config={"rows": [{"prompt": "q"}], "seed": 5, "size": 1},
        grpo_config={"lr": 1e-3, "reward_kwargs": {"a": 1}},
        save_dir="out/run",
    )
    assert c.data.datasets(0)[0] == DatasetSpec([{"prompt": "q"}], seed=5, size=1)
    assert c.consumer.learning_rate == 1e-3 and c.reward.kwargs == {"a": 1} and c.run.folder == "out/run"
    # The reward's flat keys reach its nested sections.
    grpo = {"rm_path": "rm", "rm_servers": 2, "reward_components": {"math": 1, "rm": 1}, "env": "retry"}
    c = config_from_launch_kwargs(
        **base, train_dataset_config={"path": "x"}, grpo_config={**grpo, "env_max_turns": 2, "judge_max_score": 5}
    )
    assert (c.reward.rm.path, c.reward.rm.servers, c.reward.judge.max_score) == ("rm", 2, 5)
    assert (c.reward.env.name, c.reward.env.max_turns) == ("retry", 2)
    # A dataset dict's split and column options reach the data section (none is dropped) ...
    c = config_from_launch_kwargs(
        **base,
        train_dataset_config={"path": "d", "split": "dev", "answer_column": "a.b"},
        eval_dataset_config={"path": "d", "split": "val", "answer_column": "a.b"},
        grpo_config={},
    )
    assert (c.data.train_split, c.data.eval_split, c.data.answer_column) == ("dev", "val", "a.b")
    # ... and the shared column options must agree.
    with pytest.raises(ValueError, match=r"disagree on \{'prompt_column': \('q', 'question'\)\}"):
        config_from_launch_kwargs(
            **base,
            train_dataset_config={"path": "d", "prompt_column": "q"},
            eval_dataset_config={"path": "d", "prompt_column": "question"},
            grpo_config={},
        )


@pytest.mark.parametrize("page, least", [("README.md", 10), ("docs/coming-from-trl-verl.md", 30)])
def test_the_trl_verl_tables_name_only_real_flags(page, least):
    """Every flag in the coati column of the "Coming from TRL or verl" tables (the README's ten rows, the docs'
    whole table) is one the command line has, and every row has one."""
    import re
    from pathlib import Path

    from coati.distributed.config.cli import build_parser

    text = (Path(__file__).resolve().parents[2] / page).read_text()
    section = text.split("Coming from TRL or verl", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][1].strip() == "coati" and len(rows) > least
    options = {o for action in build_parser()._actions for o in action.option_strings}
    for setting, coati, *_ in rows[1:]:
        flags = re.findall(r"`(-[-\w]+)", coati)
        assert flags, f"row {setting.strip()!r} names no coati flag"
        unknown = [f for f in flags if f not in options]
        assert not unknown, f"row {setting.strip()!r}: {unknown} are not flags of rl_example.py"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seed", "-1"], "run.seed must be an integer in 0..4294967295"),
        (["--seed", str(2**32)], "run.seed must be an integer in 0..4294967295"),
        (["--data-train-seed", "-3"], "data.train_seed must be an integer in 0..4294967295"),
        (["--stop-strings", ""], "stop_strings must be non-empty strings"),
        (["-m", ""], "model path must be a model folder or hub id, got ''"),
        (["-lr", "inf"], "learning_rate must be a finite number > 0, got inf"),
        (["-lr", "nan"], "learning_rate must be a finite number > 0, got nan"),
        (["--weight-decay", "-0.1"], "weight_decay must be a finite number >= 0, got -0.1"),
        (["--cpus-per-actor", "-1"], "cpus_per_actor must be a finite number > 0, got -1.0"),
        (["--reward-rm-cpus", "-2"], "reward.rm.cpus must be a finite number >= 0, got -2.0"),
        (["--reward-components", '{"math": NaN}'], "reward components need finite weights, got {'math': nan}"),
        (["--reward-components", '{"math": 1e400}'], "reward components need finite weights, got {'math': inf}"),
    ],
)
def test_values_the_workers_would_refuse_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_config(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err[-400:]


BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    )
    + "run: {seed: *i}\n"
)


@pytest.mark.parametrize(
    "text, message",
    [
        (BOMB, r"config.yaml, line 2: the YAML alias \*a is not read .* write the value out"),
        ("run: {seed: 1\n", r"config.yaml: not valid YAML \(.*line \d+\)"),
        ("run:\n  project: " + "x" * (1 << 20) + "\n", r"config.yaml has \d+ bytes, over the 1048576"),
    ],
    ids=["alias bomb", "malformed YAML", "over 1 MiB"],
)
def test_config_files_that_would_blow_up_or_do_not_parse_are_usage_errors(tmp_path, capsys, text, message):
    """A 2 KB YAML alias bomb took 15 s and 1.6 GB to parse; malformed YAML printed a traceback."""
    import re

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--config", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err, err[-400:]


def error_of(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse_config(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err  # one line: no usage block above it
    return err


def test_parsing_has_no_traps(tmp_path, capsys):
    """No abbreviations (``--lr`` was taken as ``--lr-schedule``), TRL's underscore spellings, enum names in any
    case, ``--report-to none`` as its help says, and an unknown flag answered with the nearest one."""
    assert "unknown flag --lr; did you mean -lr?" in error_of(["--lr", "1e-5"], capsys)
    assert "did you mean --temperature?" in error_of(["--temprature", "0.5"], capsys)
    assert "'x' follows no flag that takes it" in error_of(["x"], capsys)
    c = parse_config(["--learning_rate", "1e-6", "--num_generations", "8", "--algo", "grpo", "-b", "VLLM"])
    assert (c.consumer.learning_rate, c.producer.num_generations, c.algo, c.producer.backend) == (
        1e-6,
        8,
        "GRPO",
        "vllm",
    )
    assert (
        parse_config(["--algo", "dr.grpo"]).algo == "DR_GRPO"
        and parse_config(["--report-to", "none"]).run.report_to == ()
    )


def test_config_file_values_take_their_field_s_type(tmp_path, capsys):
    """YAML reads ``1e-6`` as text: it is the number the field takes; a value that is no number names the field."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("consumer:\n  learning_rate: 1e-6\n  train_batch_size: '4'\nrun:\n  max_steps: null\n")
    bad.write_text("consumer:\n  learning_rate: fast\n")
    c = parse_config(["--config", str(good)])
    assert c.consumer.learning_rate == 1e-6 and c.consumer.train_batch_size == 4 and c.run.max_steps is None
    message = error_of(["--config", str(bad)], capsys)
    assert "consumer.learning_rate='fast' is not a number; write a number, e.g. learning_rate: 1.0e-6" in message


def test_print_config_prints_the_resolved_tree_that_config_reads_back(tmp_path, capsys):
    import rl_example

    assert rl_example.main(["--print-config", "--algo", "rloo", "-g", "8"]) == {"printed": "config"}
    (tmp_path / "c.yaml").write_text(capsys.readouterr().out)
    again = parse_config(["--config", str(tmp_path / "c.yaml")])
    assert again.algo == "RLOO" and again.producer.num_generations == 8
    assert again.algo_config == parse_config(["--algo", "RLOO"]).algo_config


def test_every_launch_argument_reaches_the_tree():
    """``launch_distributed``'s arguments are mapped by a table; an argument added to the signature and not to the
    table (or read apart) would be dropped."""
    import inspect

    from coati.distributed.config.colossalchat import LAUNCH_ARGS as _LAUNCH_ARGS
    from coati.distributed.config.colossalchat import config_from_launch_kwargs

    read_apart = {
        "train_dataset_config",
        "eval_dataset_config",
        "inference_model_config",
        "train_model_config",
        "tokenizer_config",
        "generate_config",
        "grpo_config",
        "plugin_config",
        "dataloaders_config",
        "resume_allow",
    }
    params = set(inspect.signature(config_from_launch_kwargs).parameters)
    assert params == set(_LAUNCH_ARGS) | read_apart, params ^ (set(_LAUNCH_ARGS) | read_apart)
