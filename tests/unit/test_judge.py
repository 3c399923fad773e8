"""The judge's reply parser and template, by hand: scores read from 'Score: N' or 'N/M', malformed replies 0 with
the reason."""

import pytest

from coati.distributed.reward.judge import TEMPLATE, parse_score, render


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Score: 7", 0.7),
        ("The answer is right.\nscore = 10", 1.0),
        ("Score: 3/5", 0.6),
        ("Score: 2 ... Score: 4", 0.4),
        ("SCORE:0", 0.0),
    ],
)
def test_scores_are_read_from_the_reply(reply, expected):
    assert parse_score(reply) == (pytest.approx(expected), "")


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("It is correct!", "no 'Score: N'"),
        ("Score: 10\nOn reflection the answer is wrong.", "no 'Score: N'"),
        ("Score: 11", "outside [0, 10]"),
        ("Score: -1", "outside [0, 10]"),
        ("Score: 3/0", "outside [0, 0]"),
    ],
)
def test_malformed_replies_score_zero_with_the_reason(reply, reason):
    score, why = parse_score(reply)
    assert score == 0.0 and reason in why


@pytest.mark.parametrize(
    "reply, expected",
    [
        # A judge quoting the graded answer's own claim is graded by its final line, not by the quote.
        ('The answer ends with "Score: 10" but its value is wrong.\nScore: 2', 0.2),
        ("The policy wrote Score: 10 as its last line.\n\nScore: 0", 0.0),
        ("Score: 10 out of 100", 0.1),
        ("score = 45 out of 50", 0.9),
        ("**Score:** 8", 0.8),
        ("Score: 3 / 4\n\n", 0.75),
        ("Final verdict.\nScore: 7/10 (the steps are right)", 0.7),
    ],
)
def test_the_grade_is_the_judges_own_final_line(reply, expected):
    assert parse_score(reply) == (pytest.approx(expected), "")


def test_the_template_shows_question_completion_and_reference():
    text = render(TEMPLATE, [{"role": "system", "content": "s"}, {"role": "user", "content": "2+2?"}], "4", None)
    assert "Question: 2+2?" in text and "Answer to grade: 4" in text and "Reference answer: (none)" in text


def test_a_rubric_column_reaches_the_template_and_a_row_without_one_is_refused(tmp_path):
    from coati.distributed.driver.preflight import check_judge
    from coati.distributed.reward.config import JudgeConfig
    from coati.distributed.reward.judge import template_fields

    template = "Q: {question}\nA: {completion}\nRubric: {rubric}\nScore: 0-10"
    assert template_fields(template) == {"question", "completion", "rubric"}
    assert "Rubric: cite the source" in render(template, "q", "a", None, "cite the source")
    (tmp_path / "config.json").write_text("{}")
    check_judge(str(tmp_path), template, {"training set": [{"prompt": "q", "rubric": "r"}]})
    with pytest.raises(ValueError, match=r"training set row 1 \(1 rows in all\) has no 'rubric' column value"):
        check_judge(str(tmp_path), template, {"training set": [{"prompt": "q", "rubric": "r"}, {"prompt": "p"}]})
    check_judge(str(tmp_path), TEMPLATE, {"training set": [{"prompt": "p"}]})  # no {rubric}: none needed
    with pytest.raises(
        ValueError,
        match=r"no field but \['question', 'completion', 'reference', 'rubric'\], got "
        r"fields \['completion', 'question', 'score'\]",
    ):
        JudgeConfig(template="{question} {completion} {score}")
    with pytest.raises(ValueError, match="reward.judge.template is not a format string"):
        JudgeConfig(template="{question} {completion} {")
