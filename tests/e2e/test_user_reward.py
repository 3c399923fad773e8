"""A newcomer's own reward end to end: a file beside the data, returning plain floats (TRL's convention), trained
from another folder with ``coati train`` and evaluated again with ``coati eval`` from a third; the held-out result is
the reward's mean and the share at its maximum, in the summary, evals.json and ``coati eval``."""

import json
import sys

import pytest

from coati import registry
from coati.cli import evaluate, train

REWARD = '''
def by_answer(completions, answer, **kwargs):
    """1.0 where the row's answer is "1": the held-out mean is known whatever the model writes."""
    return [float(a == "1") for a in answer]
'''


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    user = tmp_path / "user"
    user.mkdir()
    (user / "float_reward_beside_data.py").write_text(REWARD)
    (user / "train.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "1"}) + "\n" for i in range(8)))
    answers = ["1", "1", "1", "0"]
    (user / "eval.jsonl").write_text(
        "".join(json.dumps({"prompt": f"e{i}", "answer": a}) + "\n" for i, a in enumerate(answers))
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(registry, "USER_FOLDERS", [])
    yield user
    sys.modules.pop("float_reward_beside_data", None)


@pytest.mark.background  # nothing timed, nothing shared with the suite's process
def test_a_float_reward_beside_the_data_trains_and_evaluates_as_its_mean(
    ray_cluster, tiny, user_folder, tmp_path, monkeypatch
):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    flags = ["-m", tiny, "-b", "transformers", "-d", str(user_folder / "train.jsonl"), "--data-eval"]
    flags += [str(user_folder / "eval.jsonl"), "-rt", "float_reward_beside_data:by_answer", "--algo", "GRPO"]
    flags += ["-g", "2", "-tbs", "2", "-mnt", "4", "--max-steps", "1", "--run-dir", str(tmp_path / "run")]
    summary = train([*flags, "--no-progress"])
    first, last = summary["evals"][0], summary["evals"][-1]
    for evaluation in (first, last):
        assert evaluation["eval/reward_mean"] == pytest.approx(0.75) and evaluation["eval/at_max"] == 0.75
        assert "eval/lenient" not in evaluation and evaluation["eval/count"] == 4
    written = json.loads((tmp_path / "run" / "evals.json").read_text())
    assert written[-1]["eval/at_max"] == 0.75
    # coati eval from a third folder, in a process that has not imported the reward (as a new command would be)
    sys.modules.pop("float_reward_beside_data", None)
    sys.path[:] = [p for p in sys.path if p not in registry.USER_FOLDERS]
    registry.USER_FOLDERS.clear()
    (tmp_path / "third").mkdir()
    monkeypatch.chdir(tmp_path / "third")
    again = evaluate(str(tmp_path / "run"), ["--no-progress"])
    assert again["eval/reward_mean"] == pytest.approx(0.75) and again["eval/at_max"] == 0.75
