"""Reward throughput through RewardPool on this machine: math verifications/s and code solutions/s. Writes
``benchmarks/results/rewards.json``.

python benchmarks/bench_rewards.py [--workers 2] [--n 400]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result
from coati.distributed.reward import RewardPool


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--n", type=int, default=400, help="math items (code items: n / 4)")
    args = parser.parse_args()
    rng = random.Random(0)
    gold = [str(rng.randint(0, 10_000)) for _ in range(args.n)]
    forms = ["\\boxed{{{}}}", "#### {}", "<answer>{}</answer>", "\\boxed{{\\frac{{{}}}{{1}}}}"]
    completions = [f"Some reasoning. {forms[i % 4].format(g if i % 3 else int(g) + 1)}" for i, g in enumerate(gold)]
    with RewardPool("math", num_workers=args.workers) as pool:
        pool.score(completions[:8], {"gt_answer": gold[:8]})  # warm-up: workers import math_verify
        start = time.perf_counter()
        results = pool.score(completions, {"gt_answer": gold})
        math_s = time.perf_counter() - start
    correct = sum(r.answer_ok for r in results)
    n_code = max(args.n // 4, 1)
    cases = json.dumps(
        {"inputs": [f"{i} {i + 1}\n" for i in range(5)], "outputs": [f"{2 * i + 1}\n" for i in range(5)]}
    )
    code = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    with RewardPool("code", num_workers=args.workers) as pool:
        pool.score([code], {"test_cases": [cases]})
        start = time.perf_counter()
        code_results = pool.score([code] * n_code, {"test_cases": [cases] * n_code})
        code_s = time.perf_counter() - start
    failed = [r.info for r in code_results if not r.answer_ok]
    assert not failed, failed[:3]
    print(f"workers: {args.workers}")
    print(f"math: {args.n} items in {math_s:.2f} s = {args.n / math_s:.0f} verifications/s ({correct} correct)")
    print(f"code: {n_code} solutions x 5 stdin/stdout cases in {code_s:.2f} s = {n_code / code_s:.1f} solutions/s")
    result = {
        "workers": args.workers,
        "math": {"items": args.n, "seconds": math_s, "per_s": args.n / math_s, "correct": correct},
        "code": {"solutions": n_code, "cases_each": 5, "seconds": code_s, "per_s": n_code / code_s},
    }
    print(f"wrote {write_result('rewards', result)}")


if __name__ == "__main__":
    main()
