"""The staleness bound and the batch arithmetic through real runs (real Ray, ColossalAI, transformers backend)."""

import pytest

from tests.e2e.runs import tiny_config, train


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from coati.testing import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("staleness_model"), vocab_multiple=8))


def test_synchronous_runs_train_only_rows_of_the_weights_being_trained(ray_cluster, tiny):
    """k = 0 with 4 prompts per draw and 2 groups per step: leftover groups of the previous version used to be
    trained every other step. Now each step draws what it lacks and trains rows of its own version only."""
    out = train(
        tiny_config(
            tiny,
            run={"max_staleness": 0, "max_steps": 3},
            producer={"num_generations": 2},
            consumer={"train_batch_size": 2, "train_minibatch_size": 2, "train_microbatch_size": 4},
        )
    )
    for m in out["history"]:
        assert m["rollout/policy_lag_max"] == 0 and m["rollout/policy_lag_mean"] == 0, m
        assert m["rollout/drawn_groups"] == 2 and m["rollout/stale_dropped_groups"] == 0, m


def test_any_accepted_batch_size_runs_and_metrics_describe_the_steps_own_draws(ray_cluster, tiny):
    """9 groups per step from one producer drawing 1 prompt at a time: more than the old fixed 8 draws could give
    (it crashed at step 1 filling from an empty zero-signal list). With overlap (k = 1) the draws made while step 1
    trains belong to step 2: each step reports the 9 groups drawn for it, not the next step's."""
    out = train(
        tiny_config(
            tiny,
            run={"max_staleness": 1, "max_steps": 2},
            producer={"num_generations": 2, "inference_batch_size": 1, "inference_microbatch_size": 1},
            consumer={"train_batch_size": 9, "train_minibatch_size": 9, "train_microbatch_size": 6},
        )
    )
    first, second = out["history"]
    assert first["rollout/drawn_groups"] == 9 and first["rollout/draws"] == 9 and first["rollout/policy_lag_max"] == 0
    assert second["rollout/drawn_groups"] == 9 and second["rollout/policy_lag_max"] <= 1
    assert first["rollout/stale_dropped_groups"] == second["rollout/stale_dropped_groups"] == 0


def test_dynamic_sampling_draws_up_to_its_cap_then_fills_the_batch(ray_cluster, tiny):
    """Every group without signal (each row's reward is its reference answer, 0): with dynamic_sampling_max_draws=2
    a step of 4 groups, drawn 4 prompts at a time, makes 2 draws (not the default's 8) and trains the zero-signal
    groups it drew."""
    out = train(
        tiny_config(
            tiny,
            algo="DAPO",
            data={"train": [{"prompt": f"q{i}", "gt_answer": "0"} for i in range(64)]},
            reward={"fn": "tests.component.reward_fns:gt_as_reward"},
            algorithm={"dynamic_sampling_max_draws": 2},
        )
    )
    for m in out["history"]:
        assert m["rollout/draws"] == 2 and m["rollout/drawn_groups"] == 8, m
        assert m["rollout/dropped_zero_signal_groups"] == 8 and m["rollout/filled_zero_signal_groups"] == 4, m
