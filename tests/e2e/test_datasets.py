"""Datasets end to end: a verl-style parquet folder (messages in 'prompt', the answer nested in 'reward_model'),
split by file name, with an overlong prompt, trained and evaluated by a real run."""

import json

import pytest

from coati.distributed.driver.launch import launch
from tests.e2e.runs import tiny_config


def parquet_folder(tmp_path, n_train=12, n_test=5, long_row=3):
    import datasets

    folder = tmp_path / "verl"
    folder.mkdir()
    for split, n in (("train", n_train), ("test", n_test)):
        rows = [
            {"prompt": [{"role": "user", "content": f"{split} q{i}"}], "reward_model": {"ground_truth": 1 + i % 2}}
            for i in range(n)
        ]
        if split == "train":
            rows[long_row]["prompt"][0]["content"] = "x" * 200
        datasets.Dataset.from_list(rows).to_parquet(str(folder / f"{split}.parquet"))
    return folder


def config(tiny, folder, tmp_path, **data):
    return tiny_config(
        tiny,
        tmp_path / "run",
        run={"max_steps": 2, "progress": False},
        producer={"inference_batch_size": 2, "inference_microbatch_size": 2},
        consumer={
            "train_batch_size": 2,
            "train_minibatch_size": 2,
            "train_microbatch_size": None,
            "learning_rate": 1e-3,
            "lr_schedule": "cosine",
            "min_lr_ratio": 0.1,
        },
        reward={"fn": "tests.component.reward_fns:gt_as_reward"},
        generation={"max_new_tokens": 4, "max_prompt_tokens": 64},
        data={
            "train": str(folder),
            "eval": str(folder),
            "eval_size": None,
            "answer_column": "reward_model.ground_truth",
            **data,
        },
    )


def test_parquet_folder_trains_with_mapped_columns_and_overlong_prompts_dropped(ray_cluster, tiny, tmp_path):
    folder = parquet_folder(tmp_path)
    with pytest.raises(
        ValueError, match=r"train row 3's prompt has \d+ tokens > max_prompt_tokens=64.*--filter-overlong"
    ):
        launch(config(tiny, folder, tmp_path))
    out = launch(config(tiny, folder, tmp_path, filter_overlong_prompts=True))
    assert [m["step"] for m in out["history"]] == [1, 2]
    for m in out["history"]:  # rewards are the nested answers (1 or 2): the column reached the reward function
        assert 1.0 <= m["reward/mean"] <= 2.0
    # The cosine schedule over the run's two steps: the full rate, then half way down to the floor.
    assert [m["actor/lr"] for m in out["history"]] == pytest.approx([1e-3, 1e-3 * (0.1 + 0.9 * 0.5)])
    assert [e["eval/count"] for e in out["evals"]] == [5, 5]  # the test split, whole
    meta = json.loads(next((tmp_path / "run" / "checkpoints").glob("*/meta.json")).read_text())
    assert meta["dataset"] == {
        "source": str(folder),
        "answer_column": "reward_model.ground_truth",
        "rows": 11,
        "overlong_dropped": 1,
    }
