"""The base model's evaluation before training is kept across runs: a second run with the same model, held-out rows
and settings takes it from the cache (the same accuracy and predictions, without evaluating), and a run on other
held-out rows or a rewritten model evaluates again."""

from coati.distributed.driver.launch import launch
from coati.distributed.driver.reporting import STARTUP
from tests.e2e.runs import tiny_config

FNS = "tests.component.reward_fns"


def rows(n):
    return [{"prompt": f"q{i}", "label": f"q{i}"} for i in range(n)]


def run(tiny, held_out, **run_fields):
    config = tiny_config(
        tiny,
        data={"train": rows(16), "eval": held_out},
        generation={"max_new_tokens": 6},
        consumer={"learning_rate": 1e-3, "train_microbatch_size": None},
        reward={"fn": f"{FNS}:digit_fraction"},
        run={"max_steps": 1, **run_fields},
    )
    STARTUP.clear()
    out = launch(config)
    return out, [message for message, _ in STARTUP]


def test_a_second_run_takes_the_base_model_s_evaluation_from_the_cache(ray_cluster, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("COATI_CACHE", str(tmp_path))
    first, phases = run(tiny, rows(3))
    assert "evaluating before training" in phases and "eval/cached" not in first["evals"][0]
    # the start-up account ends when the first step has trained, before the evaluation that follows it
    assert phases[-2:] == ["step 1: first rollouts and training", "first step trained"]
    assert len(list((tmp_path / "evals").glob("*.json"))) == 1

    second, phases = run(tiny, rows(3))
    assert "evaluating before training: the base model's evaluation from the cache" in phases
    assert "evaluating before training" not in phases
    before = {k: v for k, v in second["evals"][0].items() if k != "eval/cached"}
    assert second["evals"][0]["eval/cached"] == 1 and before == first["evals"][0]

    _, phases = run(tiny, rows(4))  # other held-out rows: another key
    assert "evaluating before training" in phases
    _, phases = run(tiny, rows(3), eval_cache=False)  # evaluates again, and keeps the fresh result
    assert "evaluating before training" in phases
    assert len(list((tmp_path / "evals").glob("*.json"))) == 2
