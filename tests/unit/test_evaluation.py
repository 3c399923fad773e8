"""A held-out evaluation scored as training scores it: a reward that returns numbers (TRL's convention) is evaluated
by its mean and the share at its maximum, not as a strict/lenient check it never made."""

import math
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from coati.distributed.driver.loop import evaluation_result
from coati.distributed.loggers.metrics import headline
from coati.distributed.record import RolloutBatch
from coati.distributed.reward.base import RewardResult, as_result, max_reward_of
from coati.distributed.reward.config import RewardConfig
from coati.distributed.rollout.evaluation import evaluate_share


@pytest.mark.parametrize(
    "value, reward, right",
    [
        (1.0, 1.0, True),
        (0.25, 0.25, False),
        (1, 1.0, True),
        (True, 1.0, True),
        (np.float32(1.0), 1.0, True),
        (np.int64(0), 0.0, False),
        (torch.tensor(1.0), 1.0, True),
        (torch.tensor([0.5]), 0.5, False),
        ({"score": 1.0}, 1.0, True),
        ({"score": 0.0, "acc": True}, 0.0, True),
    ],
)
def test_numbers_of_every_kind_are_plain_rewards(value, reward, right):
    result = as_result(value, "fn")
    assert result.reward == reward and result.answer_ok is right
    assert bool(result.info.get("plain")) is ("acc" not in value if isinstance(value, dict) else True)


def test_none_is_no_score_nan_stays_to_fail_the_step_and_other_types_are_refused():
    assert as_result(None, "fn").info == {"no_score": True}
    assert math.isnan(as_result(float("nan"), "fn").reward) and "no_score" not in as_result(float("nan"), "fn").info
    with pytest.raises(TypeError, match="fn returned str"):
        as_result("1.0", "fn")
    with pytest.raises(TypeError, match="fn returned ndarray"):
        as_result(np.ones(3), "fn")


def test_a_function_states_its_own_maximum():
    def half(completions, **kw):
        return [0.5] * len(completions)

    half.max_reward = 0.5
    assert max_reward_of(half, "half") == 0.5 and as_result(0.5, "half", max_reward_of(half, "half")).answer_ok
    half.max_reward = float("inf")
    with pytest.raises(ValueError, match="reward function half: max_reward must be a finite number, got inf"):
        max_reward_of(half, "half")


def _share(results: list[RewardResult]):
    n = len(results)
    batch = RolloutBatch.__new__(RolloutBatch)
    batch.response_ids = torch.zeros(n, 2, dtype=torch.long)
    batch.response_lengths = torch.full((n,), 2)

    def rollouts(rows):
        futures = []
        for r in results[: len(rows)]:
            f: Future = Future()
            f.set_result(r)
            futures.append(f)
        return batch, futures

    rows = [{"prompt": f"p{i}", "gt_answer": "1"} for i in range(n)]
    return evaluate_share(rows, list(range(n)), n, rollouts, lambda ids: "x")


def test_a_number_reward_is_evaluated_by_its_mean_and_share_at_its_maximum():
    share = _share([as_result(v, "fn") for v in (1.0, 1.0, 0.5, 0.0)])
    result = evaluation_result([share], RewardConfig())
    assert result["eval/reward_mean"] == pytest.approx(0.625)
    assert result["eval/at_max"] == 0.5
    assert "eval/strict" not in result and "eval/lenient" not in result
    assert headline(result) == "eval/at_max"
    assert [i["reward"] for i in result["eval_samples"]] == [1.0, 1.0, 0.5, 0.0]


def test_a_reward_with_its_own_checks_keeps_strict_and_lenient():
    results = [RewardResult(1.0, True, True), RewardResult(0.2, True, False, {"lenient_ok": True})]
    result = evaluation_result([_share(results)], RewardConfig())
    assert (result["eval/strict"], result["eval/lenient"]) == (0.5, 1.0)
    assert result["eval/reward_mean"] == pytest.approx(0.6) and headline(result) == "eval/lenient"


def test_the_summary_says_when_the_before_figure_came_from_the_cache(capsys, tmp_path):
    from coati.cli import print_summary
    from coati.distributed.driver.report_page import _results

    evals = [
        {"step": 0, "eval/at_max": 0.25, "eval/reward_mean": 0.4, "eval/count": 4, "eval/cached": 1},
        {"step": 2, "eval/at_max": 0.5, "eval/reward_mean": 0.6, "eval/count": 4},
    ]
    summary = {
        "evals": evals,
        "steps": 2,
        "wall_s": 60,
        "run_folder": str(tmp_path),
        "loop": {"totals": {}, "medians": {}},
        "final_model": None,
    }
    print_summary(summary, str(tmp_path))
    out = capsys.readouterr().out
    assert "eval/at_max: 0.250 -> 0.500 (held-out, greedy, 4 items) (before: the base model's cached evaluation)" in out
    assert "eval/reward_mean: 0.400 -> 0.600" in out and "eval/lenient" not in out
    page = _results(evals)
    assert "cached evaluation" in page and "eval/at_max" in page and "eval/reward_mean" in page


def test_a_bad_max_reward_is_refused_before_any_actor(tmp_path, monkeypatch):
    import sys

    from coati.distributed.config.tree import config_from_dict
    from coati.distributed.driver.preflight import check_reward_inputs

    (tmp_path / "capped_reward.py").write_text(
        "def fn(completions, **kw):\n    return [1.0] * len(completions)\nfn.max_reward = 'ten'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        config = config_from_dict({"reward": {"fn": "capped_reward:fn"}})
        with pytest.raises(ValueError, match=r"training set: reward function capped_reward:fn: .*max_reward must be a"):
            check_reward_inputs(config, [{"prompt": "q"}], "training set")
    finally:
        sys.modules.pop("capped_reward", None)
