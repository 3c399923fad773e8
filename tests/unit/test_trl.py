"""TRL's GRPOConfig names, checked against TRL's own class: every field it documents is a coati flag of the same
meaning or is refused in one line naming what to write instead."""

import dataclasses
import re

import pytest

from coati.distributed.config import openrlhf
from coati.distributed.config.cli import flags, parse_command
from coati.distributed.config.trl import REFUSED, SAME

trl = pytest.importorskip("trl")  # installed with the test requirements (benchmarks/requirements.txt)


def _grpo_fields() -> list[str]:
    from transformers import TrainingArguments

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f.name for f in dataclasses.fields(trl.GRPOConfig) if f.name not in inherited]


def test_every_grpo_config_field_is_mapped_or_refused():
    converted = set(openrlhf.SWITCHES)  # --bf16: a switch of both, converted with OpenRLHF's flags
    missing = [name for name in _grpo_fields() if name not in SAME and name not in REFUSED and name not in converted]
    assert not missing, f"GRPOConfig fields with no entry in coati/distributed/config/trl.py: {missing}"
    assert not set(SAME) & set(REFUSED)


VALUES = {"report_to": "tensorboard", "output_dir": "/tmp/out", "lr_scheduler_type": "cosine", "num_train_epochs": "2"}
VALUES["vllm_importance_sampling_cap"] = "3"
CONTEXT = {"vllm_enable_sleep_mode": ["-nb", "0"], "reward_weights": ["--reward-fn", "math", "boxed"]}


@pytest.mark.parametrize("name", sorted(SAME))
def test_a_mapped_name_is_the_coati_setting_of_the_same_meaning(name):
    """``--<trl name> V`` gives the config that coati's own flag with V gives."""
    flag = next(f for f in flags() if f.key == SAME[name])
    primary = next(n for n in flag.names if n.startswith("--"))
    if flag.kind is bool:
        values = []
    elif name == "reward_weights":
        values = ["1", "0.5"]
    else:
        values = [VALUES.get(name, "7" if flag.kind is int else "0.25")]
    context = CONTEXT.get(name, [])
    ours, _ = parse_command([*context, primary, *values], "", "x")
    theirs, _ = parse_command([*context, f"--{name}", *values], "", "x")
    default, _ = parse_command(context, "", "x")
    assert theirs == ours and ours != default


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_name_says_what_to_write_instead(name, capsys):
    with pytest.raises(SystemExit) as e:
        parse_command([f"--{name}", "1"], "", "x")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"x: error: TRL's --{name} is not a coati flag: ") and "\n" not in err
    named = re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", REFUSED[name])
    known = {n for f in flags() for n in f.names} | {"-b"}
    assert set(named) <= known, f"{name}'s hint names flags coati lacks: {set(named) - known}"


def test_the_common_trl_command_line_runs_as_coati_settings():
    argv = "--max_completion_length 64 --num_generations 8 --learning_rate 1e-6 --beta 0.04 --epsilon_high 0.28"
    config, _ = parse_command(argv.split(), "", "x")
    assert config.generation.max_new_tokens == 64 and config.producer.num_generations == 8
    assert config.consumer.learning_rate == 1e-6 and config.algo_config.beta == 0.04
    assert config.algo_config.clip_eps_high == 0.28
