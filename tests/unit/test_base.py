"""The reward contract read from a function's signature: what it needs from the data, which options it takes."""

import pytest

from coati.distributed.reward import REWARD_FNS, RewardSignature
from coati.distributed.reward.base import call_reward


def ours(completions, gt_answer, scale: float = 1.0, strict: bool = True, **fields):
    return [scale] * len(completions)


def trl(prompts, completions, **kwargs):
    return [float(p == c) for p, c in zip(prompts, completions, strict=True)]


def test_signature_of_a_native_reward():
    sig = RewardSignature.of(ours, "ours")
    assert sig.required == ("gt_answer",) and sig.options == {"scale": 1.0, "strict": True}
    assert not sig.wants("prompts")
    sig.check({"gt_answer"}, {"scale": 2, "strict": False})  # an int where a float is expected is fine


def test_completions_go_to_the_first_parameter_whatever_its_name():
    def texts_first(texts, gt_answer):
        return [float(t == g) for t, g in zip(texts, gt_answer, strict=True)]

    sig = RewardSignature.of(texts_first, "texts_first")
    assert not sig.completions_by_name and sig.required == ("gt_answer",)
    assert call_reward(texts_first, sig, ["1", "2"], {"gt_answer": ["1", "1"]}, {}) == [1.0, 0.0]


def test_signature_of_a_trl_reward_gets_prompts_and_completions_by_name():
    sig = RewardSignature.of(trl, "trl")
    assert sig.completions_by_name and sig.wants("prompts") and sig.required == ("prompts",)
    sig.check(set(), {})
    assert call_reward(trl, sig, ["a", "b"], {"prompts": ["a", "x"]}, {}) == [1.0, 0.0]


@pytest.mark.parametrize(
    "columns, kwargs, match",
    [
        ({"gt_answer"}, {"scael": 2.0}, r"takes no option 'scael'; known options: \['scale', 'strict'\]"),
        ({"gt_answer"}, {"strict": "false"}, r"strict='false' is a str, but ours expects a bool .* JSON true"),
        ({"gt_answer"}, {"scale": True}, r"scale=True is a bool, but ours expects a float"),
        ({"gt_answer"}, {"scale": "2"}, r"scale='2' is a str"),
        ({"answer"}, {}, r"needs column\(s\) \['gt_answer'\], which the dataset lacks \(its columns: \['answer'\]\)"),
        ({"gt_answer"}, ["scale"], r"must be a JSON object"),
    ],
)
def test_bad_options_and_missing_columns_are_named(columns, kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardSignature.of(ours, "ours").check(columns, kwargs)


def test_builtin_rewards_declare_their_columns():
    assert RewardSignature.of(REWARD_FNS.get("math"), "math").required == ("gt_answer",)
    assert RewardSignature.of(REWARD_FNS.get("code"), "code").required == ("test_cases",)


def test_a_function_without_a_completions_parameter_is_refused():
    def nothing(*, gt_answer):
        return []

    with pytest.raises(ValueError, match="takes no completions parameter"):
        RewardSignature.of(nothing, "nothing")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's contract: one sample per call, a float or a dict with a score."""
    if data_source == "dict":
        return {"score": float(solution_str.strip() == ground_truth), "acc": solution_str.strip() == ground_truth}
    return float(solution_str.strip() == ground_truth) + (extra_info or {}).get("bonus", 0.0)


def test_a_verl_reward_function_works_unchanged():
    from coati.distributed.reward.pool import _call

    sig = RewardSignature.of(compute_score, "m:compute_score")
    assert sig.per_sample == ("data_source", "solution_str", "ground_truth", "extra_info") and sig.required == ()
    sig.check({"reward_model", "data_source"}, {})
    with pytest.raises(ValueError, match=r"needs a ground truth: a ground_truth or gt_answer column"):
        sig.check({"question"}, {})
    fields = [
        {"data_source": "gsm8k", "reward_model": {"ground_truth": "42"}, "extra_info": {"bonus": 0.5}},
        {"data_source": "dict", "reward_model": {"ground_truth": "7"}, "extra_info": None},
        {"data_source": "gsm8k", "gt_answer": "3", "reward_model": None, "extra_info": None},
    ]
    fields = [{k: f.get(k) for k in ("data_source", "reward_model", "extra_info", "gt_answer")} for f in fields]
    results = _call(
        compute_score, "m:compute_score", sig, ["42", "8", [{"role": "assistant", "content": "3"}]], fields, {}
    )
    assert [r.reward for r in results] == [1.5, 0.0, 1.0]
    assert not results[1].answer_ok and "plain" not in results[1].info  # the dict's acc is the correctness
    assert results[2].answer_ok and results[2].info["plain"]
