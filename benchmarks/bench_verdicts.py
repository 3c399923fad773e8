"""The math reward's verdicts against completions graded by hand: how many agree, and every false positive (a wrong
answer scored right) and false negative, named by case, for each set:

- ``math_verdicts.jsonl``: hand-written cases, each a form a grader gets wrong (boxes spaced, nested, left open or
  hidden by ``\\left.``; several parts; formatting; a rejected value);
- ``math_verdicts_smollm2.jsonl``: 48 real completions of the embedded SmolLM2-135M-Instruct (bf16, temperature 1,
  seed 0, 96 new tokens, asked for a boxed answer) to 4 GSM8K-style and 4 chain_sum prompts, 6 each.
- math_verify's own regression suite (``benchmarks/public_math_suite.py``: its tables read from its source
  distribution), each prediction scored as a completion against the gold answer (a gold solution's boxed answer
  where it has one). Its cases where a right answer is expected to fail its parser are listed apart.

Writes ``benchmarks/results/verdicts.json``; the sets are tests (``tests/unit/test_math_reward.py``,
``tests/component/test_public_math_suite.py``).

    python benchmarks/bench_verdicts.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.public_math_suite import CONVENTIONS, VERSION, public_cases
from benchmarks.results_file import write_result
from coati.distributed.reward.math_reward import extract_answer, math_reward

DATA = Path(__file__).resolve().parent / "data"
SETS = ("math_verdicts.jsonl", "math_verdicts_smollm2.jsonl")


def main() -> dict:
    result = {name.removesuffix(".jsonl"): graded(DATA / name) for name in SETS}
    result[f"math_verify_{VERSION}_suite"] = public_graded()
    return result


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


def public_verdicts(cases: list[dict]) -> list[bool]:
    """coati's lenient verdict on each public case: the prediction as a completion, the gold as an answer."""
    golds = [extract_answer(c["gold"])[0] or c["gold"] for c in cases]
    return [bool(r.info["lenient_ok"]) for r in math_reward([c["pred"] for c in cases], golds)]


def case_id(case: dict) -> tuple:
    return case["file"], case["test"], case["gold"], case["pred"]


def public_graded() -> dict:
    cases = public_cases()
    start = time.perf_counter()
    verdicts = public_verdicts(cases)
    seconds = time.perf_counter() - start
    wrong = [(c, got) for c, got in zip(cases, verdicts, strict=True) if got != bool(c["expected"])]
    by_test: dict[str, int] = {}
    for case, got in wrong:
        if not got:
            by_test[case["test"]] = by_test.get(case["test"], 0) + 1
    return {
        "cases": len(cases),
        "right_by_suite": sum(c["expected"] for c in cases),
        "agree": len(cases) - len(wrong),
        "false_positives": [case_id(c) for c, got in wrong if got and case_id(c) not in CONVENTIONS],
        "parser_conventions": [[*case_id(c), CONVENTIONS[case_id(c)]] for c, got in wrong if case_id(c) in CONVENTIONS],
        "false_negatives_by_test": by_test,
        "seconds": round(seconds, 3),
    }


if __name__ == "__main__":
    result = main()
    print(json.dumps(result, indent=2))
    print(write_result("verdicts", result))
