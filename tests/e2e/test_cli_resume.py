"""``--resume latest`` continues a command-line run from its own recorded config: no flag needs repeating, a flag
given beside it is checked against the checkpoint (one line per real difference), and the run's summary covers every
step, before and after the resume."""

import json

import pytest
import yaml

from coati.cli import read_run, train

REWARD = "tests.component.reward_fns:digit_fraction"


@pytest.mark.background  # nothing timed, nothing shared with the suite's process
def test_resume_latest_needs_no_repeated_flags_and_reports_every_step(ray_cluster, tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(16)))
    first = ["-m", tiny, "-b", "transformers", "-d", "data.jsonl", "-rt", REWARD, "--algo", "GRPO", "-g", "2"]
    first += ["-tbs", "2", "-mnt", "4", "-lr", "1e-3", "--max-steps", "1", "-p", "proj", "--no-progress"]
    train(first)
    recorded = yaml.safe_load((tmp_path / "runs" / "proj" / "latest" / "config.yaml").read_text())
    assert recorded["data"]["train"] == str(tmp_path / "data.jsonl")  # absolute: it runs again from anywhere
    with pytest.raises(ValueError) as e:  # a real difference, named on a line of its own
        train(["--resume", "latest", "-p", "proj", "-lr", "0.5", "--max-steps", "2", "--no-progress"])
    lines = str(e.value).splitlines()
    assert len(lines) == 2 and "learning_rate: checkpoint 0.001, this run 0.5" in lines[1], lines
    assert "--resume-allow" in lines[0] and "identity" not in lines[0]
    summary = train(["--resume", "latest", "-p", "proj", "--max-steps", "2", "--no-progress"])
    assert summary["steps"] == 2 and summary["run_folder"] == str((tmp_path / "runs" / "proj" / "latest").resolve())
    run = read_run(str(tmp_path / "runs" / "proj"))
    assert [m["step"] for m in run["history"]] == [1, 2] and run["summary"]["steps"] == 2
