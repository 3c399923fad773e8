"""GSM8K-style RL from a JSONL file (the documented schema), with DAPO.

    python examples/gsm8k_jsonl.py [path/to/train.jsonl] [rl_example flags...]

Each line: {"messages": [{"role": "user", "content": "..."}], "gt_answer": "18"} or {"prompt": "...", "gt_answer":
"18"}. Answers are read from "#### 18", \\boxed{18} or <answer>18</answer>. The sample file here is small; point the
script at your own file. Evaluation reads the same file unless -ed names a held-out one; the end of the run then says
"training rows", not "held-out". A budget (-mnt) too small for the task's reasoning is reported as the share of
responses cut at it.
"""

import sys
from pathlib import Path

import rl_example

HERE = Path(__file__).parent

if __name__ == "__main__":
    path = (
        sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else str(HERE / "data/gsm8k_sample.jsonl")
    )
    rest = sys.argv[2:] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else sys.argv[1:]
    rl_example.main(
        [
            "--algo",
            "DAPO",
            "-d",
            path,
            "-ed",
            path,
            "--eval-size",
            "8",
            "-mnt",
            "96",
            "--max-steps",
            "10",
            "-s",
            "Solve step by step, then write the final answer on its own line as '#### <number>'.",
            "--reward-kwargs",
            '{"format_gate": false}',
            "-p",
            "gsm8k",
            *rest,
        ]
    )
