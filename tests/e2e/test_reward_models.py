"""A reward model in its own Ray actors drives the reward up end to end: a tiny reward model fitted to prefer digits
over letters, the policy trained on its scores alone (RLOO, 12 steps), each component reported per step."""

import random

import numpy as np
import pytest

from tests.e2e.test_launch import REWARD, launch_distributed, run_kwargs, tiny  # noqa: F401


@pytest.fixture(scope="module")
def digit_rm(tmp_path_factory):
    from coati.models import build_tiny_reward_model, train_tiny_reward_model

    rng = random.Random(0)
    path = build_tiny_reward_model(tmp_path_factory.mktemp("digit_rm"))
    prompts = [f"q{i}" for i in range(32)]
    digits = ["".join(rng.choice("0123456789") for _ in range(rng.randint(2, 12))) for _ in prompts]
    letters = ["".join(rng.choice("abcdefghij .,") for _ in range(rng.randint(2, 12))) for _ in prompts]
    return str(train_tiny_reward_model(path, prompts, digits, letters, steps=60))


def test_a_reward_model_component_drives_the_reward_up(ray_cluster, tiny, digit_rm):  # noqa: F811
    grpo = {"lr": 3e-3, "reward_fn_type": REWARD, "train_microbatch_size": 8, "rm_path": digit_rm,
            "reward_components": {REWARD: 0.0, "rm": 1.0}, "rm_normalize": "none"}  # fmt: skip
    out = launch_distributed(**run_kwargs(tiny, core_algo="RLOO", max_steps=12, grpo_config=grpo))
    rm = [m["reward/component/rm"] for m in out["history"]]
    assert np.mean(rm[-3:]) > np.mean(rm[:3]) + 0.1, rm
    assert all(m["reward/mean"] == pytest.approx(m["reward/component/rm"], abs=1e-5) for m in out["history"])
    assert all(f"reward/component/{REWARD}" in m for m in out["history"])  # the rule function, weight 0, reported


def test_a_wrong_reward_model_is_refused_before_any_actor_starts(ray_cluster, tiny, tmp_path):  # noqa: F811
    import ray

    grpo = {"lr": 3e-3, "reward_fn_type": REWARD, "reward_components": {"rm": 1.0}}
    before = set(ray.util.list_named_actors())
    with pytest.raises(FileNotFoundError, match="is not a model folder"):
        launch_distributed(**run_kwargs(tiny, grpo_config={**grpo, "rm_path": str(tmp_path)}))
    with pytest.raises(ValueError, match=r"a reward model is a \.\.\.ForSequenceClassification with one"):
        launch_distributed(**run_kwargs(tiny, grpo_config={**grpo, "rm_path": tiny}))  # a causal LM
    with pytest.raises(ValueError, match="the rm component and rm_path go together"):
        launch_distributed(**run_kwargs(tiny, grpo_config={**grpo, "reward_components": {REWARD: 1.0},
                                                           "rm_path": tiny}))  # fmt: skip
    assert set(ray.util.list_named_actors()) == before


def test_a_judge_component_adds_its_weighted_grade(ray_cluster, tiny, tmp_path):  # noqa: F811
    """A tiny judge fitted to reply 'Score: 7' grades every completion 0.7: with weights 1 (the rule) and 0.5 (the
    judge), each step's reward is the rule's plus 0.35, and each component is reported."""
    from coati.models import build_tiny_model
    from tests.component.test_judge import TEMPLATE, fit_reply

    judge = fit_reply(str(build_tiny_model(tmp_path / "judge")), "Score: 7")
    grpo = {"lr": 3e-3, "reward_fn_type": REWARD, "train_microbatch_size": 8, "judge_path": judge,
            "judge_template": TEMPLATE, "judge_max_new_tokens": 12, "reward_components": {REWARD: 1.0, "judge": 0.5}}
    out = launch_distributed(**run_kwargs(tiny, max_steps=2, grpo_config=grpo))
    for m in out["history"]:
        assert m["reward/component/judge"] == pytest.approx(0.7, abs=1e-5) and m["reward/judge_unread"] == 0
        assert m["reward/mean"] == pytest.approx(m[f"reward/component/{REWARD}"] + 0.35, abs=1e-5)


def test_a_dead_reward_model_stops_the_run_naming_it(ray_cluster, tiny, digit_rm):  # noqa: F811
    """Killed after step 1: the next rollout fails naming it (a RunError, so run.max_restarts would restart the run
    with new servers), and no actor of the run is left."""
    import ray

    from coati.distributed.actor_group import RunError

    killed = {}

    def kill_the_reward_model(metrics):
        if metrics["step"] == 1:
            name = next(n for n in ray.util.list_named_actors() if n.endswith("-rm-0"))
            ray.kill(ray.get_actor(name))
            killed["name"] = name

    grpo = {"lr": 3e-3, "reward_fn_type": REWARD, "rm_path": digit_rm, "reward_components": {"rm": 1.0},
            "rm_timeout_s": 20}  # fmt: skip
    with pytest.raises(RunError, match=r"reward model server coati-\w+-rm-0 died") as err:
        launch_distributed(**run_kwargs(tiny, max_steps=3, grpo_config=grpo, on_step=kill_the_reward_model))
    assert killed["name"] in str(err.value)
    assert not [n for n in ray.util.list_named_actors() if n.startswith(killed["name"].rsplit("-", 2)[0])]


def test_with_restarts_a_dead_reward_model_is_replaced(ray_cluster, tiny, digit_rm, tmp_path):  # noqa: F811
    """--max-restarts 1: the run restarts from its last checkpoint with new reward-model servers and trains to the
    end."""
    import ray

    killed = []

    def kill_once(metrics):
        if metrics["step"] == 2 and not killed:
            name = next(n for n in ray.util.list_named_actors() if n.endswith("-rm-0"))
            ray.kill(ray.get_actor(name))
            killed.append(name)

    grpo = {"lr": 3e-3, "reward_fn_type": REWARD, "rm_path": digit_rm, "reward_components": {"rm": 1.0},
            "rm_timeout_s": 20}  # fmt: skip
    out = launch_distributed(**run_kwargs(tiny, max_steps=4, grpo_config=grpo, on_step=kill_once, max_restarts=1,
                                          save_dir=str(tmp_path), save_interval=1))  # fmt: skip
    assert killed and out["history"][-1]["step"] == 4
    assert all(np.isfinite(m["reward/component/rm"]) for m in out["history"])
