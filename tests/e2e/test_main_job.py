"""The main job's path (rl_example.py) on a tiny model: the files a run leaves behind."""

import json

import pytest
from PIL import Image

import rl_example
from coati.models import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("job_model")))


def test_rl_example_leaves_metrics_plots_evals_and_a_reloadable_model(ray_cluster, tiny, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "gt_answer": str(2 * i)}) + "\n" for i in range(16)))
    summary = rl_example.main([
        "-m", tiny, "-b", "transformers", "-d", str(data), "-ed", str(data), "--eval-size", "6", "-mnt", "8", "--max-steps", "3",
        "-sd", str(tmp_path / "runs"), "-p", "job", "--no-progress", "-lr", "1e-3", "--report-to", "jsonl", "tensorboard",
    ])  # fmt: skip
    run = tmp_path / "runs" / "job"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3]  # step 0: the evaluation before training
    assert lines[0]["eval/count"] == 6 and "reward/mean" not in lines[0]
    for key in ("reward/mean", "loss/policy", "actor/entropy", "response/length_mean", "time/step"):
        assert all(key in m for m in lines[1:]), key
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "response", "reward", "step"} <= set(samples[0])
    evals = json.loads((run / "evals.json").read_text())
    assert [e["step"] for e in evals] == [0, 3] and all(e["eval/count"] == 6 for e in evals)
    assert not (run / "plots" / "kl.png").exists()  # DAPO's beta is 0: no KL is measured, none is drawn
    for name in ("reward", "accuracy", "entropy", "response_length", "learning_rate"):
        png = run / "plots" / f"{name}.png"
        with Image.open(png) as img:
            assert img.size[0] > 100 and img.size[1] > 100
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = summary["final_model"]
    model = AutoModelForCausalLM.from_pretrained(final)
    AutoTokenizer.from_pretrained(final)
    original = AutoModelForCausalLM.from_pretrained(tiny)
    changed = [k for k, v in model.state_dict().items() if not (v == original.state_dict()[k]).all()]
    assert changed, "the saved model equals the initial one: training did not reach the checkpoint"
