"""TRL's own reward functions, unchanged, in a run on a conversational dataset (TRL is in the suite's environment:
benchmarks/requirements.txt, installed by `make test`): completions arrive as message lists, the fields TRL's
trainer supplies (completion_ids) arrive, and a None ("no score") is masked from training and counted, not an
error."""

import pytest

from coati.testing import build_tiny_model
from tests.e2e.runs import tiny_config, train

pytest.importorskip("trl", reason="TRL comes with benchmarks/requirements.txt, which make test installs")


def run(tmp_path, reward: str, **options):
    path = str(build_tiny_model(tmp_path / "model", vocab_multiple=8))
    # Conversational rows; every fourth solution is no expression math_verify can parse: TRL's accuracy_reward gives
    # such rows None.
    rows = [
        {
            "messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "solution": "see the text" if i % 4 == 0 else f"${2 * i}$",
        }
        for i in range(8)
    ]
    config = tiny_config(path, data={"train": rows}, consumer={"learning_rate": 1e-3}, reward={"fn": reward, **options})
    return train(config)


def test_trl_accuracy_reward_scores_message_lists_and_its_none_is_no_score(ray_cluster, tmp_path):
    history = run(tmp_path, "trl.rewards:accuracy_reward")["history"]
    assert [m["reward/errors"] for m in history] == [0, 0]
    # The two steps draw each of the 8 prompts once; two have an unparseable solution: 4 completions each.
    assert sum(m["reward/no_score"] for m in history) == 8, [m["reward/no_score"] for m in history]


def test_trl_overlong_punishment_reads_completion_ids(ray_cluster, tmp_path):
    history = run(tmp_path, "tests.component.trl_rewards:overlong")["history"]
    assert [m["reward/errors"] for m in history] == [0, 0]
    # Past 12 - 6 tokens the punishment falls to -1 at 12; a tiny random model mostly writes all 12.
    assert all(-1.0 <= m["reward/mean"] < -0.3 for m in history), [m["reward/mean"] for m in history]


def test_trl_s_list_of_reward_functions_with_weights_is_their_weighted_sum(ray_cluster, tmp_path):
    """TRL's reward_funcs=[accuracy_reward, overlong punishment], reward_weights=[1.0, 0.5], as reward components:
    each function's values are reported, and the reward is their weighted sum (accuracy's None counting 0 where the
    punishment scored, so nothing is left unscored); functions get a group's completions in one call."""
    import math

    acc, fmt = "trl.rewards:accuracy_reward", "tests.component.trl_rewards:overlong"
    calls = "tests.component.reward_fns:batch_sizes"  # each completion's value: the size of the call that scored it
    history = run(tmp_path, acc, components={acc: 1.0, fmt: 0.5, calls: 0.0})["history"]
    for m in history:
        assert m["reward/errors"] == 0 and m["reward/no_score"] == 0  # the punishment scores every completion
        assert m[f"reward/component/{fmt}"] < -0.3  # a tiny random model mostly writes all 12 tokens
        assert m[f"reward/component/{calls}"] == 4.0  # called with each group's 4 completions at once, as TRL does
        total = m[f"reward/component/{acc}"] + 0.5 * m[f"reward/component/{fmt}"]
        assert math.isclose(m["reward/mean"], total, abs_tol=1e-5), (m["reward/mean"], total)
