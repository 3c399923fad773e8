"""Datasets: JSONL schema errors with line numbers, reasoning-gym rows, cursor order and resumption."""

import json

import pytest

from coati.distributed.rollout.data import DataCursor, encode_prompt, load_rows, reward_fields
from coati.testing import char_tokenizer


def write(tmp_path, lines):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"prompt": "a", "gt_answer": "1"}', "{not json"], r"d.jsonl:2: not valid JSON"),
        (['{"prompt": "a"}', "", "[1, 2]"], r"d.jsonl:3: expected a JSON object, got list"),
        (['{"prompt": "   "}'], r"d.jsonl:1: 'prompt' must be a non-empty string"),
        (['{"question": "x"}'], r"d.jsonl:1: needs 'messages' or 'prompt'; has \['question'\]"),
        (['{"messages": []}'], r"d.jsonl:1: 'messages' must be a non-empty list"),
        (['{"messages": [{"role": "user", "content": ""}]}'], r"d.jsonl:1: every message is empty"),
    ],
)
def test_bad_jsonl_lines_are_reported_with_their_number(tmp_path, lines, message):
    with pytest.raises(ValueError, match=message):
        load_rows(str(write(tmp_path, lines)))


def test_missing_file_and_empty_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="has no rows"):
        load_rows(str(write(tmp_path, [""])))


def test_reasoning_gym_rows_are_seeded_and_scoreable():
    a = load_rows("reasoning_gym:chain_sum?min_terms=2&max_terms=2", size=5, seed=3)
    b = load_rows("reasoning_gym:chain_sum?min_terms=2&max_terms=2", size=5, seed=3)
    c = load_rows("reasoning_gym:chain_sum?min_terms=2&max_terms=2", size=5, seed=4)
    assert a == b and a != c and len(a) == 5
    assert all(set(r) == {"prompt", "gt_answer"} for r in a)
    with pytest.raises(ValueError, match="reasoning-gym task 'no_such_task'"):
        load_rows("reasoning_gym:no_such_task", size=2)


def test_encode_prompt_uses_chat_template_and_system_prompt():
    tok = char_tokenizer()
    ids = encode_prompt(tok, {"prompt": "hi"}, system_prompt="sys")
    assert tok.decode(ids) == "system: sys\nuser: hi\nassistant: "
    assert reward_fields({"prompt": "x", "gt_answer": "1", "test_cases": {}}) == {"gt_answer": "1", "test_cases": {}}


def test_cursor_shards_cover_every_row_once_per_episode_and_resume():
    shards = [DataCursor(10, s, 3, seed=1) for s in range(3)]
    seen = [i for c in shards for _, i in c.take(len(c.indices))]
    assert sorted(seen) == list(range(10))
    c = DataCursor(10, 0, 1, seed=1)
    first = c.take(7)
    state = c.state()
    rest = c.take(8)  # crosses into episode 1, reshuffled
    assert [e for e, _ in rest] == [0, 0, 0] + [1] * 5
    assert sorted(i for _, i in first + rest[:3]) == list(range(10))
    d = DataCursor(10, 0, 1, seed=1)
    d.restore(state)
    assert d.take(8) == rest


def test_rows_given_back_come_first_in_their_order_and_survive_a_resume():
    """A streaming engine emptied before an evaluation or a checkpoint hands its prompts back: they are drawn again
    before the order goes on, and a cursor restored from a state taken then draws exactly what the running one
    does (no prompt lost, none drawn twice)."""
    c = DataCursor(10, 0, 1, seed=2)
    taken = c.take(6)
    c.give_back([taken[4], taken[1]])
    state = c.state()
    nxt = c.take(5)
    assert nxt[:2] == [taken[4], taken[1]] and nxt[2:] == DataCursor(10, 0, 1, seed=2).take(9)[6:]
    d = DataCursor(10, 0, 1, seed=2)
    d.restore(state)
    assert d.take(5) == nxt
    c.give_back([taken[0]])
    assert c.take(1) == [taken[0]] and c.returned == []


def test_rows_without_signal_are_skipped_rechecked_counted_and_resumed():
    c = DataCursor(20, 0, 1, seed=3, skip_after=2, recheck=0.25)
    episode0 = [i for _, i in c.take(20)]
    solved = set(episode0[:10])
    for _ in range(2):  # two groups without signal for half the rows, signal for the rest
        for row in episode0:
            c.record(row, row in solved)
    state = c.state()
    taken = [i for _ in range(40) for _, i in c.take(5)]  # ten more episodes' worth of draws
    assert c.skipped > 0
    counts = {row: taken.count(row) for row in episode0}
    live, dead = [counts[r] for r in episode0 if r not in solved], [counts[r] for r in solved]
    assert min(live) > max(dead), (live, dead)  # rows with signal come round more often
    assert min(dead) >= 1, dead  # none starved: the recheck draws them now and then
    d = DataCursor(20, 0, 1, seed=3, skip_after=2, recheck=0.25)
    d.restore(state)
    assert [i for _ in range(40) for _, i in d.take(5)] == taken and d.skipped == c.skipped
    c.record(next(iter(solved)), False)  # a group with signal resets the row's count
    assert c.no_signal[next(iter(solved))] == 0


def test_a_take_ends_even_when_every_row_would_be_skipped():
    c = DataCursor(4, 0, 1, seed=0, skip_after=1, recheck=1e-9)
    for row in range(4):
        c.record(row, True)
    assert len(c.take(6)) == 6 and c.skipped == 4


# ---- datasets through the datasets library ------------------------------------------------------------------------

VERL_ROWS = [
    {
        "data_source": "t",
        "prompt": [{"role": "user", "content": f"q{i}"}],
        "reward_model": {"style": "rule", "ground_truth": i},
    }
    for i in range(6)
]


def test_a_verl_parquet_file_maps_its_prompt_and_nested_answer(tmp_path):
    import datasets

    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(VERL_ROWS).to_parquet(str(path))
    rows = load_rows(str(path), answer_column="reward_model.ground_truth")
    assert [r["messages"] for r in rows] == [r["prompt"] for r in VERL_ROWS]
    assert [r["gt_answer"] for r in rows] == [str(i) for i in range(6)]  # numbers become the text the verifier reads
    assert "prompt" not in rows[0] and rows[0]["data_source"] == "t"  # other columns reach the reward by name
    assert len(load_rows(str(path), size=4, exclude=(1,))) == 3  # the first 4, less the dropped one
    with pytest.raises(ValueError, match=r"row 0: no column 'reward_model.truth' \(has \['ground_truth', 'style'\]\)"):
        load_rows(str(path), answer_column="reward_model.truth")


def test_json_csv_and_arrow_files_and_a_string_prompt_column(tmp_path):
    import datasets

    data = datasets.Dataset.from_list([{"question": f"what is {i}+{i}?", "answer": 2 * i} for i in range(5)])
    data.to_json(str(tmp_path / "d.json"))
    data.to_csv(str(tmp_path / "d.csv"))
    data.save_to_disk(str(tmp_path / "saved"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    for source in (tmp_path / "d.json", tmp_path / "d.csv", arrow, tmp_path / "saved"):
        rows = load_rows(str(source), prompt_column="question", answer_column="answer")
        assert [(r["prompt"], r["gt_answer"]) for r in rows] == [(f"what is {i}+{i}?", str(2 * i)) for i in range(5)]
        assert "question" not in rows[0], source
    with pytest.raises(ValueError, match=r"needs 'messages' or 'prompt'; has \['answer', 'question'\] \(prompt_column"):
        load_rows(str(tmp_path / "d.json"))


def test_folder_splits_are_chosen_by_name_and_a_missing_one_is_named(tmp_path):
    import datasets

    folder = tmp_path / "gsm"
    folder.mkdir()
    for split, n in (("train", 5), ("test", 3)):
        datasets.Dataset.from_list([{"prompt": f"{split} {i}"} for i in range(n)]).to_parquet(
            str(folder / f"{split}.parquet")
        )
    assert [r["prompt"] for r in load_rows(str(folder))] == [f"train {i}" for i in range(5)]
    assert [r["prompt"] for r in load_rows(str(folder), split="test")] == [f"test {i}" for i in range(3)]
    with pytest.raises(ValueError, match="no split 'validation'"):
        load_rows(str(folder), split="validation")
    saved = tmp_path / "saved_dict"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list([{"prompt": "a"}]), "dev": datasets.Dataset.from_list([{"prompt": "b"}])}
    ).save_to_disk(str(saved))
    assert load_rows(str(saved), split="dev") == [{"prompt": "b"}]
    with pytest.raises(ValueError, match=r"no split 'test'; its splits: \['dev', 'train'\]"):
        load_rows(str(saved), split="test")


def test_missing_paths_and_offline_hub_ids_say_which(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="hub is offline"):
        load_rows("openai/gsm8k")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows("data/train.parquet")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown format"):
        load_rows(str(tmp_path / "d.txt"))


def test_raw_prompts_skip_the_chat_template():
    from coati.distributed.rollout.data import PromptFormat

    tok = char_tokenizer()
    assert tok.decode(PromptFormat(raw=True).encode(tok, {"prompt": "2+2="})) == "2+2="
    assert tok.decode(PromptFormat().encode(tok, {"prompt": "2+2="})) == "user: 2+2=\nassistant: "
    with pytest.raises(ValueError, match="raw_prompt needs a 'prompt' string"):
        PromptFormat(raw=True).encode(tok, {"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(ValueError, match="system_prompt has nowhere to go"):
        PromptFormat("sys", raw=True)


@pytest.mark.parametrize(
    "messages, match",
    [
        ([{"role": "usr", "content": "hi"}], r"role\(s\) \['usr'\] are not chat roles"),
        ([{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}], r"\['bot'\]"),
        ([{"content": "hi"}], r"\['None'\] are not chat roles"),
        ([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "end with an assistant turn"),
    ],
)
def test_chat_rows_with_unknown_roles_or_ending_in_an_assistant_turn_are_refused(tmp_path, messages, match):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"messages": messages, "gt_answer": "4"}) + "\n")
    with pytest.raises(ValueError, match=match):
        load_rows(str(path))
    ok = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "q2"},
    ]
    path.write_text(json.dumps({"messages": ok, "gt_answer": "4"}) + "\n")
    assert load_rows(str(path))[0]["messages"] == ok


def test_a_tokenizer_without_a_chat_template_is_refused_naming_raw_prompt():
    from coati.distributed.rollout.data import PromptFormat

    tok = char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"has no chat template.*--raw-prompt"):
        encode_prompt(tok, {"prompt": "hi"})
    assert tok.decode(PromptFormat(raw=True).encode(tok, {"prompt": "hi"})) == "hi"


def test_a_held_out_set_of_the_training_task_shares_no_prompt_with_the_training_set():
    """The default job's held-out prompts come from the training task's generator with another seed; 11 of its 96
    were training prompts. They are drawn apart from the training set now, still 96 of them."""
    from coati.distributed.config.tree import Config

    train, held_out = Config().data.datasets(0)
    train_rows, held_rows = train.load(), held_out.load()
    assert len(held_rows) == 96 and len(train_rows) == 512
    assert not {r["prompt"] for r in train_rows} & {r["prompt"] for r in held_rows}


def test_a_dataset_spec_describes_the_options_set_away_from_their_defaults():
    from coati.distributed.rollout.data import DatasetSpec

    assert DatasetSpec("d.jsonl").description() == {"source": "d.jsonl"}
    spec = DatasetSpec([{"prompt": "q"}] * 3, size=2, split="dev", answer_column="a.b")
    assert spec.description() == {"source": "3 rows given", "split": "dev", "answer_column": "a.b", "size": 2}
