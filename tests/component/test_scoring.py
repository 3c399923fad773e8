"""The producer's scoring unit without Ray: real reward worker pools and a real tokenizer score a hand-made draw, and
the record's typed reward fields (task rewards, status, error, no-signal verdict, the unscored rows' loss mask) say
what happened to each row."""

import numpy as np
import pytest
import torch

from coati.distributed.algo import ADVANTAGE_ESTIMATORS
from coati.distributed.algo.config import AlgorithmConfig
from coati.distributed.record import RewardStatus, batch_from_responses
from coati.distributed.reward.config import RewardConfig
from coati.distributed.rollout.scoring import Scorer
from coati.distributed.trainer.step import batch_advantages
from coati.testing import char_tokenizer

N = 4


def draw(tokenizer, groups: list[list[str]]):
    texts = [t for g in groups for t in g]
    batch = batch_from_responses(
        [[1, 2]] * len(groups), N, [tokenizer.encode(t) for t in texts], None, [True] * len(texts), pad_id=0
    )
    batch.extras["prompt_index"] = np.repeat(np.arange(len(groups)), N)
    return batch


def test_a_draw_s_reward_fields_say_what_happened_to_each_row():
    tokenizer = char_tokenizer()
    scorer = Scorer(RewardConfig(fn="tests.component.reward_fns:by_text", workers=1), N, tokenizer)
    try:
        rows = [{"prompt": "a", "gt_answer": "1"}, {"prompt": "b"}, {"prompt": "c"}]
        batch = draw(tokenizer, [["1", "0", "none", "1"], ["2", "2", "none", "2"], ["1", "boom", "0", "1"]])
        futures = scorer.submit(batch, rows, version=0)
        scorer.apply(batch, [f.result() for f in futures], rows)
    finally:
        scorer.close()
    status = batch.reward_status.tolist()
    assert status[:8] == [0, 0, RewardStatus.NO_SCORE, 0, 0, 0, RewardStatus.NO_SCORE, 0]
    # a call that raised is retried one completion per call: only "boom" fails
    assert status[8:] == [0, RewardStatus.ERROR, 0, 0] and "boom in the scorer" in batch.reward_error[9]
    assert batch.reward_error[8] == "" and batch.failed().tolist() == [False] * 9 + [True, False, False]
    # an unscored or failed row takes its group's scored mean; it trains nothing
    assert np.allclose(batch.task_rewards[:4], [1, 0, 2 / 3, 1]) and np.allclose(batch.rewards, batch.task_rewards)
    assert np.isclose(batch.task_rewards[9], 2 / 3) and not batch.loss_mask[9].any()
    assert not batch.loss_mask[2].any() and not batch.loss_mask[6].any() and batch.loss_mask[0].any()
    # the second group's scored rows agree: no signal, decided here once
    assert batch.no_signal.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    assert list(batch.extras["reference"][:5]) == ["1"] * 4 + [""]  # kept with the samples a run logs
    assert batch.validate() is batch


# Ten groups, four failures among their 40 completions (10%): three rewards that raise, one that runs past its limit.
FAILING = [
    ["1", "0", "boom", "1"],
    ["2", "2", "2", "boom"],  # its scored rows agree: no signal, which a failure scored 0 would have faked
    ["0", "3", "1", "2"],
    ["1", "slow", "0", "0"],
    ["5", "4", "3", "2"],
    ["1", "1", "0", "1"],
    ["boom", "0", "2", "4"],
    ["3", "3", "1", "0"],
    ["0", "0", "0", "1"],
    ["2", "1", "1", "1"],
]


@pytest.fixture(scope="module")
def failing_draw():
    tokenizer = char_tokenizer()
    scorer = Scorer(RewardConfig(fn="tests.component.reward_fns:by_text", workers=1, item_timeout_s=1.0), N, tokenizer)
    try:
        rows = [{"prompt": str(g)} for g in range(len(FAILING))]
        batch = draw(tokenizer, FAILING)
        scorer.apply(batch, scorer.gather(scorer.submit(batch, rows, version=0)), rows)  # 10%: all waited for
    finally:
        scorer.close()
    return batch


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "reinforce_ppb"])
def test_failed_completions_give_the_advantages_of_a_draw_without_them(failing_draw, name):
    """A reward error or timeout is not scored 0: the other completions' advantages are those the estimator computes
    on the draw with the failed completions removed, and a failed one trains nothing."""
    batch = failing_draw
    texts = [t for g in FAILING for t in g]
    failed = np.array([t in ("boom", "slow") for t in texts])
    assert batch.failed().tolist() == failed.tolist() and failed.mean() == 0.1
    assert (batch.reward_status == RewardStatus.TIMEOUT).sum() == 1
    assert batch.no_signal[4:8].all() and not batch.no_signal[:4].any()
    cfg = AlgorithmConfig(advantage_estimator=name)
    loss_mask = torch.tensor(batch.trained_mask(), dtype=torch.float32)
    assert not loss_mask[torch.from_numpy(failed)].any()
    advantages = batch_advantages(batch, loss_mask, cfg)
    kept = torch.from_numpy(~failed)
    rewards = torch.tensor([float(t) for t, f in zip(texts, failed, strict=True) if not f])
    groups = torch.from_numpy(batch.group_ids[~failed])
    alone = ADVANTAGE_ESTIMATORS.get(name)(rewards, groups, loss_mask[kept], cfg).advantages
    assert torch.allclose(advantages[kept], alone, atol=1e-6), (advantages[kept], alone)
    assert torch.all(advantages[~kept] == 0)


def test_a_draw_past_its_error_fraction_is_not_waited_for():
    """A reward function that hangs on every completion: once more of the draw has failed than
    ``max_error_fraction`` allows (the driver stops the run on it whatever the rest scores), the rest is failed as not
    scored at once, rather than one item limit per completion, one worker at a time; the run's error names the
    timeout seen, not a row left unscored."""
    from coati.distributed.guards import NOT_SCORED, RewardFailure, check_reward_failures

    tokenizer = char_tokenizer()
    cfg = RewardConfig(fn="tests.component.reward_fns:by_text", workers=1, item_timeout_s=1.0, max_error_fraction=0.25)
    scorer = Scorer(cfg, N, tokenizer)
    try:
        rows = [{"prompt": "a"}, {"prompt": "b"}]
        batch = draw(tokenizer, [["slow"] * N, ["slow"] * N])
        scorer.apply(batch, scorer.gather(scorer.submit(batch, rows, version=0)), rows)
    finally:
        scorer.close()
    status = batch.reward_status.tolist()
    assert status[:3] == [RewardStatus.TIMEOUT] * 3, status  # 3 of 8 > 25%: the draw has failed
    assert status[3:] == [RewardStatus.ERROR] * 5 and all(e.startswith(NOT_SCORED) for e in batch.reward_error[3:])
    assert batch.failed().all() and not batch.loss_mask.any()
    with pytest.raises(RewardFailure, match=r"failed on 8 of 8 completions .* dataset row 0: .*time"):
        check_reward_failures(
            batch.failed(),
            batch.reward_status == RewardStatus.TIMEOUT,
            batch.reward_error,
            batch.extras["prompt_index"],
            cfg.scored_by,
            cfg.max_error_fraction,
            False,
            "rollout",
        )


def test_with_a_reward_model_each_completion_is_decoded_once(ray_cluster, tmp_path):
    """The reward model scores the texts the reward function was given, decoded once by ``submit`` (they were
    decoded again for the reward model before)."""
    import ray

    from coati.distributed.reward.config import RewardModelConfig
    from coati.distributed.reward.model_actors import RewardModelServer
    from coati.testing import build_tiny_reward_model

    rm = str(build_tiny_reward_model(tmp_path / "rm"))
    server = ray.remote(num_cpus=0.5)(RewardModelServer).remote(rm)
    fn = "tests.component.reward_fns:by_text"
    cfg = RewardConfig(fn=fn, workers=1, components={fn: 1.0, "rm": 0.5}, rm=RewardModelConfig(path=rm))
    tokenizer = char_tokenizer()
    decoded = []
    decode = tokenizer.decode
    tokenizer.decode = lambda ids, **kw: decoded.append(1) or decode(ids, **kw)
    scorer = Scorer(cfg, N, tokenizer, {"rm": [("rm-0", server)]})
    try:
        rows = [{"prompt": "a", "gt_answer": "1"}, {"prompt": "b", "gt_answer": "2"}]
        once, again = (draw(tokenizer, [["1", "0", "2", "1"], ["2", "2", "0", "1"]]) for _ in range(2))
        futures = scorer.submit(once, rows, version=0)
        scorer.apply(once, [f.result() for f in futures], rows, [f.completion_text for f in futures])
        assert len(decoded) == len(once)  # by submit alone
        futures = scorer.submit(again, rows, version=0)
        scorer.apply(again, [f.result() for f in futures], rows)  # no texts given: decoded here as before
        assert len(decoded) == 3 * len(once)
    finally:
        scorer.close()
        ray.kill(server)
    assert np.array_equal(once.task_rewards, again.task_rewards) and "component/rm" in once.extras
