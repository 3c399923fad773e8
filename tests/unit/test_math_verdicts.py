"""The math reward's verdicts against hand-graded cases (``benchmarks/data/math_verdicts.jsonl``): wrong answers
stated beside the right one (an unclosed, spaced, nested or ``\\left.``-hidden box) score 0, and right answers in
one box per part, with formatting commands, or followed by a rejected value score 1; and 48 real completions of the
embedded model, graded by hand. No false positive is allowed."""

import json
from pathlib import Path

import pytest

from coati.distributed.reward.math_reward import math_reward

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
CASES = [
    json.loads(line)
    for name in ("math_verdicts.jsonl", "math_verdicts_smollm2.jsonl")
    for line in (DATA / name).read_text().splitlines()
]


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_the_verdict_is_the_hand_graded_one(case):
    [result] = math_reward([case["completion"]], [case["gold"]])
    assert result.info["lenient_ok"] is case["right"], (case["completion"], case["gold"])
