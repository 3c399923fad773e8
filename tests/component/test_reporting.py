"""The run reporter: metrics.jsonl, summary and plots, and the wandb run (offline, as without an API key)."""

import json
from pathlib import Path

from coati.distributed.reporting import Reporter


def test_reporter_writes_metrics_summary_plots_and_an_offline_wandb_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    reporter = Reporter(str(tmp_path), total_steps=2, use_wandb=True, config={"algo": "DAPO-test"}, progress=False)
    for step, reward in [(1, 0.125), (2, 0.375)]:
        reporter.on_step({"step": step, "reward/mean": reward, "loss/policy": 0.5, "samples": [{"response": "x"}]})
    summary = reporter.finish({"evals": [{"step": 0, "eval/lenient": 0.25}]})

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 0.125), (2, 0.375)]
    assert summary["steps"] == 2 and all(Path(p).exists() for p in summary["plots"])
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 2
    # The wandb run file holds the config and every logged value (records are uncompressed protobuf).
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    data = run.read_bytes()
    for needle in [b"DAPO-test", b"reward/mean", b"0.125", b"0.375"]:
        assert needle in data, needle
