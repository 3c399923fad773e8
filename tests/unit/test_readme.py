"""The README's own-data example as a user copies it: its two JSONL lines, its reward file and its command pass the
checks a run makes of data and reward, and the reward scores a right and a wrong completion."""

import json
import re
import shlex
import sys
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def block(language: str, starts: str = "") -> str:
    found = [b for b in re.findall(rf"```{language}\n(.*?)```", README, re.S) if b.startswith(starts)]
    assert len(found) == 1, (language, starts)
    return found[0]


def test_the_readme_s_data_reward_and_command_are_checked_and_score(tmp_path, monkeypatch):
    from coati.distributed.config.cli import parse_command
    from coati.distributed.driver.preflight import check_reward_inputs
    from coati.distributed.reward import resolve_reward_fn
    from coati.distributed.rollout.data import load_rows

    (tmp_path / "data.jsonl").write_text(block("json"))
    (tmp_path / "my_reward.py").write_text(block("python", "# my_reward.py"))
    command = block("bash", "python rl_example.py -m path/to/model -d data.jsonl").strip()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    config, _ = parse_command(shlex.split(command)[2:], "", "rl_example.py")
    rows = load_rows(source=str(tmp_path / "data.jsonl"))
    check_reward_inputs(config, rows, "training set")  # the columns the function takes are in every row
    fn = resolve_reward_fn(config.reward.fn)
    answer = [json.loads(line)["answer"] for line in block("json").splitlines()][:1] * 2
    scores = fn(["17 * 3 = 51", "It is 50"], answer=answer)
    assert [float(getattr(s, "reward", s)) for s in scores] == [1.0, 0.0]
    sys.modules.pop("my_reward", None)
