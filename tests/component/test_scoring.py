"""The producer's scoring unit without Ray: real reward worker pools and a real tokenizer score a hand-made draw, and
the record's typed reward fields (task rewards, status, error, no-signal verdict, the unscored rows' loss mask) say
what happened to each row."""

import numpy as np

from coati.distributed.record import RewardStatus, batch_from_responses
from coati.distributed.reward.config import RewardConfig
from coati.distributed.rollout.scoring import Scorer
from coati.models import char_tokenizer

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
    # an unscored row takes its group's scored mean; it trains nothing
    assert np.allclose(batch.task_rewards[:4], [1, 0, 2 / 3, 1]) and np.allclose(batch.rewards, batch.task_rewards)
    assert not batch.loss_mask[2].any() and not batch.loss_mask[6].any() and batch.loss_mask[0].any()
    # the second group's scored rows agree: no signal, decided here once
    assert batch.no_signal.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    assert list(batch.extras["reference"][:5]) == ["1"] * 4 + [""]  # kept with the samples a run logs
    assert batch.validate() is batch
