"""Input that is accepted silently elsewhere is refused here, naming the value and the fix: repeated keys, deep or
undecodable data, non-finite settings, a string where a list belongs, absurd worker counts; and model text is
printed with its terminal controls escaped."""

import json

import numpy as np
import pytest

from coati.cli import resume_hint
from coati.distributed.checks import console_safe, strict_json
from coati.distributed.config.cli import load_file
from coati.distributed.config.tree import config_from_dict
from coati.distributed.guards import UNSCORED_DRAWS, RewardFailure, check_unscored
from coati.distributed.reward.base import truncate_for_log
from coati.distributed.rollout.data import load_rows, read_jsonl


def test_a_repeated_key_in_a_yaml_config_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("consumer:\n  learning_rate: 1.0e-5\nproducer:\n  num_generations: 4\nconsumer:\n  beta: 0.1\n")
    with pytest.raises(ValueError, match=r"run.yaml, line 5: the key 'consumer' appears twice in one section"):
        load_file(str(path))


def test_a_repeated_key_in_a_json_config_or_row_is_refused(tmp_path):
    (tmp_path / "run.json").write_text('{"generation": {"temperature": 0.5, "temperature": 2.0}}')
    with pytest.raises(ValueError, match=r"run.json: the key 'temperature' appears twice in one object"):
        load_file(str(tmp_path / "run.json"))
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "gt_answer": "1"}\n{"prompt": "b", "prompt": "c"}\n')
    with pytest.raises(ValueError, match=r"data.jsonl:2: the key 'prompt' appears twice"):
        read_jsonl(tmp_path / "data.jsonl")


def test_deep_rows_and_lone_surrogates_are_refused_naming_the_line(tmp_path):
    (tmp_path / "deep.jsonl").write_text('{"prompt": "a", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ValueError, match=r"deep.jsonl:1: nested too deeply to read"):
        read_jsonl(tmp_path / "deep.jsonl")
    (tmp_path / "deep2.jsonl").write_text('{"prompt": "a", "x": ' + "[" * 100 + "]" * 100 + "}\n")
    with pytest.raises(ValueError, match=r"deep2.jsonl:1: nested more than 64 levels deep"):
        read_jsonl(tmp_path / "deep2.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "gt_answer": "4\\ud8002"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: .*lone surrogate \(\\ud800\)"):
        read_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match=r"row 0: .*lone surrogate"):
        load_rows([{"prompt": "a", "gt_answer": "\udc00"}])
    assert strict_json('{"a": [1, {"b": "ok"}]}', "x") == {"a": [1, {"b": "ok"}]}


@pytest.mark.parametrize(
    "tree, match",
    [
        ({"generation": {"temperature": float("inf")}}, r"generation.temperature=inf is not a finite number"),
        ({"reward": {"kwargs": {"scale": float("nan")}}}, r"reward.kwargs.scale=nan is not a finite number"),
        ({"consumer": {"learning_rate": float("inf")}}, r"learning_rate"),
        ({"reward": {"workers": 100_000}}, r"reward workers=100000 is over 8 per core .* \(--reward-workers\)"),
    ],
)
def test_non_finite_and_absurd_settings_are_refused(tree, match):
    with pytest.raises(ValueError, match=match):
        config_from_dict(tree)


def test_a_string_where_a_list_belongs_is_taken_whole():
    config = config_from_dict({"generation": {"stop_strings": "</answer>"}, "run": {"resume_allow": "num_episodes"}})
    assert config.generation.stop_strings == ("</answer>",) and config.run.resume_allow == ("num_episodes",)
    with pytest.raises(ValueError, match="stop_strings must be a list of strings, got 5"):
        config_from_dict({"generation": {"stop_strings": 5}})


def test_a_reward_that_scores_nothing_stops_the_run():
    none = np.ones(8, dtype=bool)
    with pytest.raises(RewardFailure, match="scored none of the 8 completions of the run's first draw"):
        check_unscored(none, 0, True, "reward function my:fn", "rollout for step 1")
    streak = 0
    for _ in range(UNSCORED_DRAWS - 1):
        streak = check_unscored(none, streak, False, "reward function my:fn", "rollout")
    with pytest.raises(RewardFailure, match=f"{UNSCORED_DRAWS} draws in a row"):
        check_unscored(none, streak, False, "reward function my:fn", "rollout")
    assert check_unscored(np.array([True, False]), streak, True, "reward function my:fn", "rollout") == 0


def test_model_text_is_printed_with_its_terminal_controls_escaped():
    text = "answer\x1b[2J\x1b]0;pwned\x07 42\nnext\tline\x9b"
    assert console_safe(text) == "answer\\x1b[2J\\x1b]0;pwned\\x07 42\nnext\tline\\x9b"
    assert "\x1b" not in truncate_for_log(text * 100)
    assert json.loads(json.dumps(console_safe(text)))  # still text


def test_an_interrupted_run_says_how_to_resume():
    hint = resume_hint(["-m", "model", "-p", "exp one", "--save-dir=/data/runs", "-lr", "1e-5"], "rl_example.py")
    assert hint.endswith("python rl_example.py --resume latest -p 'exp one' --save-dir=/data/runs")
