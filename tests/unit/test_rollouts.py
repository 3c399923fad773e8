"""How large a rollout round is (``driver/rollouts.py``): a run that keeps every group it draws asks for what its
steps lack, even while it draws ahead (k >= 1), where whole rounds were once drawn and three quarters of them
dropped as stale; dynamic sampling, which drops groups without signal, still draws whole rounds."""

from types import SimpleNamespace

import pytest

from coati.distributed.config.tree import config_from_dict
from coati.distributed.driver.rollouts import Progress, Rollouts


def rounds(algo: str, staleness: int, producers: int = 2):
    config = config_from_dict(
        {
            "algo": algo,
            "producer": {"num_producers": producers, "inference_batch_size": 16},
            "run": {"max_staleness": staleness},
        }
    )
    actors = SimpleNamespace(producers=[object()] * producers)
    return Rollouts(config, actors, Progress(), in_flight=False)


@pytest.mark.parametrize("algo", ["PPO", "GRPO", "RLOO"])
@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_a_run_keeping_every_group_draws_what_its_steps_lack(algo, staleness):
    r = rounds(algo, staleness)
    assert r.draw_sizes(5) == [3, 2] and r.draw_sizes(40) == [16, 16]


def test_dynamic_sampling_draws_whole_rounds_while_drawing_ahead():
    assert rounds("DAPO", 1).draw_sizes(5) == [16, 16]
    assert rounds("DAPO", 0).draw_sizes(5) == [3, 2]
