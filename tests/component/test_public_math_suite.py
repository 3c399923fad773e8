"""The math reward against a public grader's own regression suite (math_verify's, read from its source distribution
on PyPI by ``benchmarks/public_math_suite.py``): no wrong answer is scored right. The suite's right answers that
coati's lenient check does not read (an unboxed expression) are counted in ``benchmarks/results/verdicts.json``."""

from benchmarks.bench_verdicts import case_id, public_verdicts
from benchmarks.public_math_suite import CONVENTIONS, cases_in, public_cases


def test_no_wrong_answer_in_the_public_suite_scores_right():
    cases = public_cases()
    assert len(cases) > 250  # the tables were read, not skipped
    verdicts = public_verdicts(cases)
    false_positives = [
        (c["gold"], c["pred"]) for c, got in zip(cases, verdicts, strict=True)
        if got and not c["expected"] and case_id(c) not in CONVENTIONS
    ]  # fmt: skip
    assert false_positives == []
    assert sum(got and c["expected"] for c, got in zip(cases, verdicts, strict=True)) > 100


def test_tables_that_change_the_verdict_are_left_out():
    source = """
import pytest
@pytest.mark.parametrize("gold,pred,expected", [("$1$", "$1$", 1)])
def test_default(gold, pred, expected):
    assert compare_strings(gold, pred, match_types=["latex"]) == expected
@pytest.mark.parametrize("gold,pred,strict,expected", [("$x$", "$y$", False, 1)])
def test_loose(gold, pred, strict, expected):
    assert compare_strings(gold, pred, strict=strict) == expected
"""
    assert [(c["test"], c["expected"]) for c in cases_in("test_x.py", source)] == [("test_default", 1)]
