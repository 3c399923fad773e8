"""The evaluation cache's key and entries: a model folder written again is another model; an entry reads back as
written, and nothing is read under another key or format."""

import os

from coati.distributed.driver import eval_cache


def test_a_model_folder_written_again_has_another_fingerprint(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"0" * 8)
    before = eval_cache.model_fingerprint(str(tmp_path))
    assert eval_cache.model_fingerprint(str(tmp_path)) == before
    os.utime(tmp_path / "model.safetensors", ns=(1, 1))
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
