"""The cluster path as far as one box allows: a whole job (rl_example.py, the main job's path) on a simulated 3-node
cluster leaves its outputs where the README says, holding what they should, the run folder's visibility from other nodes
is probed, and a submitted job's relative run folder is refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from coati.distributed.driver.run_folder import submitted_job_folder_error, visible_from
from coati.testing import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.background
def test_a_job_on_three_nodes_leaves_its_outputs_where_documented(tmp_path):
    tiny = build_tiny_model(tmp_path / "model")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "gt_answer": str(2 * i)}) + "\n" for i in range(8)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/e2e/multinode_job.py"), str(tiny), str(data), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert len({result["driver"], result["producer"], result["consumer"]}) == 3  # three nodes, one role each
    assert result["steps"] == 2
    files = set(result["files"])
    # The driver's files: logs, evaluations, summary, plots, the final model, and each checkpoint's driver part.
    for name in (
        "metrics.jsonl",
        "samples.jsonl",
        "evals.json",
        "summary.json",
        "plots/reward.png",
        "final/config.json",
        "final/model.safetensors",
        "checkpoints/latest",
    ):
        assert name in files, name
    assert any(f.startswith("tensorboard/events.out.tfevents") for f in files)
    for step in (1, 2):  # the consumer's shards (written on its node) beside the driver's part (written on its own)
        for name in (
            "meta.json",
            "driver.json",
            "rng-consumer-0.pt",
            "model/pytorch_model.bin.index.json",
            "optimizer/pytorch_optim.bin.index.json",
        ):
            assert f"checkpoints/step-{step}/{name}" in files, (step, name)
    # What the files hold (this job is also the main job's path, rl_example.py, end to end).
    run = tmp_path / "runs" / "job" / "latest"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]  # step 0: the evaluation before training
    assert lines[0]["eval/count"] == 4 and "reward/mean" not in lines[0]
    for key in ("reward/mean", "loss/policy", "actor/entropy", "response/length_mean", "time/step", "actor/lr"):
        assert all(key in m for m in lines[1:]), key
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "response", "reward", "step"} <= set(samples[0])
    # summary.json's account of the loop adds up the steps' metrics, and the job printed it.
    loop = json.loads((run / "summary.json").read_text())["loop"]
    assert loop["steps"] == 2 and loop["totals"]["loop_s"] == pytest.approx(sum(m["time/step"] for m in lines[1:]))
    assert loop["totals"]["groups_drawn"] == sum(m["rollout/drawn_groups"] for m in lines[1:]) >= 4
    assert f"training loop {loop['totals']['loop_s']:.0f} s over 2 steps" in out.stdout
    # The start-up account: each actor's process, imports, setup, engine and readiness on the run's time line, before
    # its first step; the job printed each actor's imports and engine.
    startup = json.loads((run / "summary.json").read_text())["startup"]
    assert [a["actor"] for a in startup["actors"]] == ["producer-0", "consumer-0"]
    for a in startup["actors"]:
        marks = [a[f"{m}_at_s"] for m in ("process", "imported", "setup", "engine", "ready")]
        assert 0 < marks[0] and marks == sorted(marks) and marks[-1] < startup["first_step_s"], a
        assert a["imports_s"] > 1 and a["engine_s"] > 0 and a["setup_s"] >= a["engine_s"], a  # torch alone is > 1 s
        assert f"start-up of {a['actor']}: imports {a['imports_s']:.1f} s, engine {a['engine_s']:.1f} s" in out.stdout
    # The wall account: start-up to the loop's first step, the steps, the rest; they add up to the command's time.
    wall = json.loads((run / "summary.json").read_text())["wall"]
    assert wall["steps_s"] == pytest.approx(loop["totals"]["loop_s"], abs=0.01) and 0 < wall["startup_s"]
    assert wall["startup_s"] < startup["first_step_s"] and wall["other_s"] > 0  # the evaluations are outside
    assert wall["startup_s"] + wall["steps_s"] + wall["other_s"] == pytest.approx(wall["command_s"], abs=0.05)
    assert f"wall time {wall['command_s']:.0f} s: start-up {wall['startup_s']:.0f} s, steps" in out.stdout
    evals = json.loads((run / "evals.json").read_text())
    assert [e["step"] for e in evals] == [0, 2] and all(e["eval/count"] == 4 for e in evals)
    assert "plots/kl.png" not in files  # DAPO's beta is 0: no KL is measured, none is drawn
    for name in ("reward", "entropy", "response_length", "learning_rate"):
        with Image.open(run / "plots" / f"{name}.png") as img:
            assert img.size[0] > 100 and img.size[1] > 100
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(result["final_model"])
    AutoTokenizer.from_pretrained(result["final_model"])
    original = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    assert any(not torch.equal(v, original[k]) for k, v in model.state_dict().items()), "final/ is the initial model"


def test_the_run_folder_probe_sees_what_a_node_sees(ray_cluster, tmp_path):
    import ray

    node = ray.get_runtime_context().get_node_id()
    (tmp_path / "marker").write_text("")
    assert visible_from([node], str(tmp_path / "marker")) == {node: True}
    assert visible_from([node], str(tmp_path / "absent")) == {node: False}


def test_a_submitted_jobs_relative_run_folder_is_refused(monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert submitted_job_folder_error("runs/coati") is None  # a plain run: relative to where it was started
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what `ray job submit` sets for its entrypoint
    assert "pass an absolute --save-dir" in submitted_job_folder_error("runs/coati")
    assert submitted_job_folder_error("/shared/runs/coati") is None
    with pytest.raises(ValueError, match="Ray's temporary working directory"):
        from coati.distributed.config.tree import Config
        from coati.distributed.driver.job import run_job

        run_job(Config())
