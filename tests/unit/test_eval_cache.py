"""The evaluation cache's key and entries: a model is its files' content, a reward its source; an entry reads back as
written, and nothing is read under another key or format."""

import os

from coati.distributed.driver import eval_cache


def test_a_model_is_fingerprinted_by_its_content(tmp_path, monkeypatch):
    monkeypatch.setenv("COATI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(eval_cache, "_MEMO", None)
    (tmp_path / "model.safetensors").write_bytes(b"0" * 8)
    before = eval_cache.model_fingerprint(str(tmp_path))
    assert eval_cache.model_fingerprint(str(tmp_path)) == before
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))  # touched, same bytes: the same model
    assert eval_cache.model_fingerprint(str(tmp_path)) == before
    (tmp_path / "model.safetensors").write_bytes(b"1" * 8)
    assert eval_cache.model_fingerprint(str(tmp_path)) != before
    assert eval_cache.model_fingerprint("org/a-hub-id") is None  # not a local folder: no cache


def test_entries_read_back_under_their_key_only(tmp_path, monkeypatch):
    monkeypatch.setenv("COATI_CACHE", str(tmp_path))
    key = eval_cache.evaluation_key({"held_out": "abc"})
    assert key != eval_cache.evaluation_key({"held_out": "abd"})
    assert eval_cache.read(key) is None
    evaluation = {"eval/lenient": 0.25, "eval_samples": [{"index": 0, "response": "4"}]}
    assert eval_cache.write(key, evaluation) == tmp_path / "evals" / f"{key}.json"
    assert eval_cache.read(key) == evaluation
    other = eval_cache.evaluation_key({"held_out": "abd"})
    (tmp_path / "evals" / f"{other}.json").write_text((tmp_path / "evals" / f"{key}.json").read_text())
    assert eval_cache.read(other) is None  # an entry records its key
    (tmp_path / "evals" / f"{key}.json").write_text("{not json")
    assert eval_cache.read(key) is None


def test_weights_replaced_keeping_size_and_time_are_another_model(tmp_path, monkeypatch):
    """The fingerprint is the files' content: a weight file overwritten with bytes of the same length and its
    modification time set back is a different model (the cache took it for the old one before)."""
    monkeypatch.setenv("COATI_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(eval_cache, "_MEMO", None)
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"a" * 1000)
    before = eval_cache.model_fingerprint(str(model))
    stat = weights.stat()
    weights.write_bytes(b"b" * 1000)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert eval_cache.model_fingerprint(str(model)) != before


def test_an_edited_reward_module_is_another_evaluation(tmp_path, monkeypatch):
    import importlib
    import sys

    from coati.distributed.reward.config import RewardConfig

    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "cache_key_reward.py"
    module.write_text("def fn(completions, **kw):\n    return [1.0] * len(completions)\n")
    first = eval_cache.reward_digest(RewardConfig(fn="cache_key_reward:fn"))
    module.write_text("def fn(completions, **kw):\n    return [0.0] * len(completions)\n")
    sys.modules.pop("cache_key_reward", None)
    importlib.invalidate_caches()
    try:
        assert eval_cache.reward_digest(RewardConfig(fn="cache_key_reward:fn")) != first
    finally:
        sys.modules.pop("cache_key_reward", None)
    assert eval_cache.reward_digest(RewardConfig()) == eval_cache.reward_digest(RewardConfig())
