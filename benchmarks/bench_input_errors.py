"""A newcomer's commonest mistakes, each typed as a command in a fresh process from the user's own folder: the exit
status, the lines printed, whether Ray started, whether torch was imported (once more, under a wrapper that says so at
exit), and the seconds from the command to the error, beside two floors measured in the same run: the interpreter
alone, and the interpreter importing torch. Writes ``benchmarks/results/input_errors.json``.

    python benchmarks/bench_input_errors.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result

ROOT = Path(__file__).resolve().parents[1]

MISTAKES = {
    "dataset path mistyped": ["-d", "dta.jsonl"],
    "model path not a folder": ["-m", "./my-model"],
    "reward needs a column the data lacks": ["-d", "data.jsonl", "-rt", "my_reward:needs_solution"],
    "flag abbreviated (--lr)": ["--lr", "1e-5"],
    "config value of the wrong type": ["--config", "bad.yaml"],
    "training set smaller than a step": ["-d", "two_rows.jsonl"],
}


def user_folder(path: Path) -> None:
    (path / "data.jsonl").write_text(
        "".join(f'{{"prompt": "{i} + 1 = ?", "gt_answer": "{i + 1}"}}\n' for i in range(64))
    )
    (path / "two_rows.jsonl").write_text('{"prompt": "1 + 1 = ?", "gt_answer": "2"}\n' * 2)
    (path / "my_reward.py").write_text(
        "def needs_solution(completions, solution, **kw):\n"
        "    return [float(c == s) for c, s in zip(completions, solution)]\n"
    )
    (path / "bad.yaml").write_text("consumer:\n  learning_rate: fast\n")


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - start, out


WRAPPER = (
    "import atexit, runpy, sys\n"
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr))\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def torch_imported(args: list[str], cwd: Path) -> bool:
    """Whether the command imported torch before it ended."""
    cmd = [sys.executable, "-c", WRAPPER, str(ROOT / "rl_example.py"), *args, "-sd", str(cwd / "runs")]
    return "torch imported: True" in timed(cmd, cwd)[1].stderr


def main(repeats: int) -> dict:
    result = {"floor": {}, "mistakes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        user_folder(cwd)
        floors = {
            "python": [sys.executable, "-c", "pass"],
            "python + import torch": [sys.executable, "-c", "import torch"],
        }
        for name, cmd in floors.items():
            result["floor"][name] = statistics.median(timed(cmd, cwd)[0] for _ in range(repeats))
        for name, args in MISTAKES.items():
            seconds, outs = [], []
            for _ in range(repeats):
                s, out = timed([sys.executable, str(ROOT / "rl_example.py"), *args, "-sd", str(cwd / "runs")], cwd)
                seconds.append(s)
                outs.append(out)
            out = outs[-1]
            lines = out.stderr.strip().splitlines()
            result["mistakes"][name] = {
                "command": "python rl_example.py " + " ".join(args),
                "exit_status": out.returncode,
                "lines": len(lines),
                "message": lines[-1] if lines else "",
                "ray_started": "Ray" in out.stdout + out.stderr,
                "seconds_median": round(statistics.median(seconds), 2),
                "seconds_max": round(max(seconds), 2),
                "torch_imported": torch_imported(args, cwd),
            }
    torch_floor = result["floor"]["python + import torch"]
    for row in result["mistakes"].values():
        row["over_torch_floor"] = round(row["seconds_median"] / torch_floor, 2)
        row["under_torch_floor_s"] = round(torch_floor - row["seconds_median"], 2)
    result["floor"] = {k: round(v, 2) for k, v in result["floor"].items()}
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = main(args.repeats)
    print(f"floor: {result['floor']}")
    for name, row in result["mistakes"].items():
        print(
            f"{name:40s} exit {row['exit_status']}  {row['lines']} line(s)  ray={row['ray_started']}  "
            f"{row['seconds_median']:.2f} s (max {row['seconds_max']:.2f}, {row['over_torch_floor']:.2f}x the torch "
            f"floor)  torch imported: {row['torch_imported']}"
        )
    print(write_result("input_errors", result))
