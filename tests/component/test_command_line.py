"""The command line as a user meets it, in a fresh process from the user's own folder: a mistake in the inputs ends in
one line and exit status 2 before Ray starts, and a reward module beside the user's data is found by the driver as
the actors find it."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "rl_example.py"), *args, "-sd", str(cwd / "runs")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_input_mistakes_end_in_one_line_before_ray_starts(tmp_path):
    (tmp_path / "my_reward.py").write_text(
        "def fmt(completions, solution, **kw):\n    return [1.0] * len(completions)\n"
    )
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n{"prompt": "ho"}\n')
    cases = {
        ("-d", "missing.jsonl"): "dataset file or folder missing.jsonl does not exist; check the path",
        # the module is found in the current folder (the driver did not look there): the data lacks its column
        ("-d", "data.jsonl", "-rt", "my_reward:fmt"): "reward function my_reward:fmt needs column(s) ['solution']",
        ("-d", "data.jsonl", "-m", str(tmp_path / "no_model")): "is not a local folder",
    }
    for args, message in cases.items():
        out = run(list(args), tmp_path)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, out.stderr[-2000:])
        assert "Ray" not in out.stdout + out.stderr, (args, out.stderr[-2000:])
    assert not (tmp_path / "runs").exists()  # nothing written
