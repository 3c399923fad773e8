"""Math reward: extraction formats, equivalent forms, wrong answers, malformed input (real math_verify)."""

import pytest

from coati.distributed.reward.math_reward import extract_answer, last_boxed, math_reward


@pytest.mark.parametrize(
    "text, answer, fmt",
    [
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}", "boxed"),
        ("\\boxed{1} then \\boxed{{2}+1}", "{2}+1", "boxed"),
        ("<think>\\boxed{9}</think><answer>42</answer>", "42", "answer_tag"),
        ("<answer>x = \\boxed{3}</answer>", "3", "answer_tag"),
        ("work\n#### 1,234\n", "1,234", "gsm8k"),
        ("no answer here 17", None, "none"),
        ("\\boxed{unclosed", None, "none"),
    ],
)
def test_extract_answer(text, answer, fmt):
    assert extract_answer(text) == (answer, fmt)


def test_last_boxed_nested():
    assert last_boxed("\\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("#### 1,000", "1000"),
        ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}"),
        ("\\boxed{(0, 1]}", "(0,1]"),
    ],
)
def test_equivalent_forms_score_one(completion, gold):
    [r] = math_reward([completion], gt_answer=[gold])
    assert (r.reward, r.format_ok, r.answer_ok) == (1.0, True, True)


@pytest.mark.parametrize(
    "completion, gold, format_ok",
    [
        ("\\boxed{3}", "4", True),
        ("\\boxed{\\frac{1}{3}}", "0.5", True),
        ("\\boxed{\\frac{1}{}", "1", False),
        ("\\boxed{}", "1", True),
        ("the answer is 4", "4", False),  # right number, no required format: strict 0, lenient 1
    ],
)
def test_wrong_or_unformatted_scores_zero(completion, gold, format_ok):
    [r] = math_reward([completion], gt_answer=[gold], format_gate=True)
    assert r.reward == 0.0 and not r.answer_ok and r.format_ok == format_ok


def test_lenient_score_and_format_options():
    [r] = math_reward(["the answer is 4"], gt_answer=["4"])
    assert r.info["lenient_ok"] is True
    assert r.reward == 1.0  # lenient by default
    [r] = math_reward(["the answer is 4"], gt_answer=["4"], format_gate=True)
    assert r.reward == 0.0
    [r] = math_reward(["\\boxed{5}"], gt_answer=["4"], format_bonus=0.1)
    assert r.reward == pytest.approx(0.1)


def test_lengths_must_match():
    with pytest.raises(ValueError):
        math_reward(["a", "b"], gt_answer=["1"])


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{43 = 42}", "42"),  # a relation: math_verify would compare its right side
        ("\\boxed{43 \\to 42}", "42"),
        ("\\boxed{43 \\lor 42}", "42"),
        ("\\boxed{43 \\text{ or } 42}", "42"),
        ("\\boxed{42 \\neq 43}", "42"),
        ("\\boxed{43 \\Rightarrow 42}", "42"),
        ("\\boxed{43 \\leq 42}", "42"),
        ("\\boxed{4200\\%}", "42"),  # a percent where the gold has none
        ("\\boxed{42 \\text{ percent}}", "42"),
        ("\\boxed{1,2}", "12"),  # not a thousands separator
        ("\\boxed{42} or maybe \\boxed{43}", "42"),  # two different final answers
        ("<answer>43</answer> no wait <answer>42</answer>", "42"),
    ],
)
def test_answers_that_say_more_than_one_thing_score_zero(completion, gold):
    [r] = math_reward([completion], gt_answer=[gold], format_gate=False)
    assert r.reward == 0.0 and not r.answer_ok, r


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("\\boxed{x = 42}", "42"),  # naming the variable is one answer
        ("\\boxed{42\\%}", "42\\%"),  # percent on both sides
        ("\\boxed{x > 3}", "x > 3"),  # the gold itself is a relation
        ("\\boxed{42} and again \\boxed{42}", "42"),  # the same answer twice
        ("\\boxed{1,000}", "1000"),
    ],
)
def test_single_answers_in_rich_forms_still_score_one(completion, gold):
    [r] = math_reward([completion], gt_answer=[gold])
    assert r.reward == 1.0, r


@pytest.mark.parametrize(
    "text, number",
    [("the answer is 1,2", "2"), ("total 1,000 apples", "1000"), ("is 12,345.5", "12345.5"), ("a 1,2345", "2345")],
)
def test_lenient_number_reads_only_well_formed_thousands(text, number):
    from coati.distributed.reward.math_reward import last_number

    assert last_number(text) == number


def test_lenient_check_does_not_join_digits():
    [r] = math_reward(["the answer is 1,2"], gt_answer=["12"], format_gate=False)
    assert r.reward == 0.0 and not r.info["lenient_ok"]


@pytest.mark.parametrize("gold", [None, "", "   "])
def test_missing_gold_is_a_data_error_not_a_string(gold):
    with pytest.raises(ValueError, match="non-empty gt_answer"):
        math_reward(["\\boxed{None}", "\\boxed{}"][:1], gt_answer=[gold])
