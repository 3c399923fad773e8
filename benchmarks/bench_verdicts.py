"""The math reward's verdicts against completions graded by hand: how many agree, and every false positive (a wrong
answer scored right) and false negative, named by case, for each set:

- ``math_verdicts.jsonl``: hand-written cases, each a form a grader gets wrong (boxes spaced, nested, left open or
  hidden by ``\\left.``; several parts; formatting; a rejected value);
- ``math_verdicts_smollm2.jsonl``: 48 real completions of the embedded SmolLM2-135M-Instruct (bf16, temperature 1,
  seed 0, 96 new tokens, asked for a boxed answer) to 4 GSM8K-style and 4 chain_sum prompts, 6 each.

Writes ``benchmarks/results/verdicts.json``; both sets are a test (``tests/unit/test_math_verdicts.py``).

    python benchmarks/bench_verdicts.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result
from coati.distributed.reward.math_reward import math_reward

DATA = Path(__file__).resolve().parent / "data"
SETS = ("math_verdicts.jsonl", "math_verdicts_smollm2.jsonl")


def main() -> dict:
    return {name.removesuffix(".jsonl"): graded(DATA / name) for name in SETS}


def graded(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    start = time.perf_counter()
    results = math_reward([r["completion"] for r in rows], [r["gold"] for r in rows])
    seconds = time.perf_counter() - start
    verdicts = [bool(r.info["lenient_ok"]) for r in results]
    wrong = [(row, got) for row, got in zip(rows, verdicts, strict=True) if got != row["right"]]
    return {
        "cases": len(rows),
        "right_by_hand": sum(r["right"] for r in rows),
        "agree": len(rows) - len(wrong),
        "false_positives": [row["case"] for row, got in wrong if got],
        "false_negatives": [row["case"] for row, got in wrong if not got],
        "seconds": round(seconds, 3),
    }


if __name__ == "__main__":
    result = main()
    print(json.dumps(result, indent=2))
    print(write_result("verdicts", result))
