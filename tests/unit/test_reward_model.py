"""The reward-model scorer on a tiny sequence-classification model built from a config: one float per pair, the same
batched as alone (padding changes nothing), the chat template's rendering, and a classifier with several outputs
refused."""

import pytest

from coati.distributed.reward.reward_model import RewardModel
from coati.testing import build_tiny_reward_model


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return str(build_tiny_reward_model(tmp_path_factory.mktemp("rm")))


def test_scores_are_per_pair_and_independent_of_the_batch(rm_path):
    rm = RewardModel(rm_path, batch_size=3)
    prompts = ["2+2?", [{"role": "user", "content": "3+3?"}], "a much longer question, padded in its batch?", "1+1?"]
    completions = ["4", "six", "no", "a long answer that is much longer than the others"]
    batched = rm.score(prompts, completions)
    alone = [RewardModel(rm_path, batch_size=1).score([p], [c])[0] for p, c in zip(prompts, completions, strict=True)]
    assert len(batched) == 4 and len(set(batched)) == 4
    assert batched == pytest.approx(alone, abs=1e-5)
    assert rm.render("2+2?", "4") == "user: 2+2?\nassistant: 4<eos>\n"


def test_a_pair_over_the_limit_keeps_its_end_and_is_flagged(rm_path):
    import torch

    rm = RewardModel(rm_path, max_tokens=40)
    long = "a long answer " * 10
    scores = rm.score(["2+2?", "2+2?"], ["4", long])
    assert rm.truncated == [False, True]
    ids = rm.tokenizer(rm.render("2+2?", long), add_special_tokens=False, return_tensors="pt")["input_ids"][:, -40:]
    with torch.no_grad():
        assert scores[1] == pytest.approx(float(rm.model(input_ids=ids).logits[0, 0]), abs=1e-5)
    assert RewardModel(rm_path, max_tokens=10**6).max_tokens == rm.model.config.max_position_embeddings


def test_a_classifier_with_several_outputs_is_refused(rm_path, tmp_path):
    import json
    import shutil

    shutil.copytree(rm_path, tmp_path / "two")
    config = json.loads((tmp_path / "two" / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    (tmp_path / "two" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has 2 outputs; a reward model has one"):
        RewardModel(str(tmp_path / "two"))


def test_a_reward_model_trained_on_preferences_prefers_the_chosen_answer(tmp_path):
    from coati.testing import train_tiny_reward_model

    path = build_tiny_reward_model(tmp_path / "rm")
    prompts = [f"{a}+{b}=" for a in range(4) for b in range(4)]
    chosen = ["7"] * len(prompts)  # the answer this model learns to like, whatever the question
    rejected = [str(i % 10) if i % 10 != 7 else "3" for i in range(len(prompts))]
    train_tiny_reward_model(path, prompts, chosen, rejected, steps=40)
    rm = RewardModel(str(path))
    sevens, others = rm.score(prompts, chosen), rm.score(prompts, rejected)
    assert all(s > o for s, o in zip(sevens, others, strict=True))
    assert rm.score(["9+9="], ["7"])[0] > rm.score(["9+9="], ["5"])[0]  # a question it has not seen
