"""Every recipe in examples/ runs a step on a tiny model (the same code path as with the default model)."""

import json
import runpy
import sys
from pathlib import Path

import pytest

from coati.testing import build_tiny_model

ELSEWHERE = {"custom_reward.py": "test_reliability.py runs it from another folder, in a process of its own"}
EXAMPLES = sorted(
    p.name
    for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.py")
    if p.name != "__init__.py" and p.name not in ELSEWHERE
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # positions for the -mpt 4096 the recipes' long prompts (HumanEval's, character-tokenized) need
    return str(build_tiny_model(tmp_path_factory.mktemp("examples_model"), max_positions=8192))


@pytest.mark.background
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_one_step(ray_cluster, tiny, tmp_path, monkeypatch, name):
    root = Path(__file__).resolve().parents[2]
    args = [
        "-m",
        tiny,
        "-b",
        "transformers",
        "--max-steps",
        "1",
        "-sd",
        str(tmp_path),
        "--no-progress",
        "-mnt",
        "8",
        "-mpt",
        "4096",
        "--eval-size",
        "2",
        "--train-size",
        "16",
    ]
    if name == "code_humaneval.py":
        args = ["--problems", "8"] + args
    if name == "vision_shapes.py":  # pictures need a vision-language model
        from coati.testing import build_tiny_vlm

        args[1] = str(build_tiny_vlm(tmp_path / "vlm"))
        args[args.index("-mpt") + 1] = "512"  # its positions: 1024
    if name == "reward_model.py":  # a tiny reward model of the policy's tokenizer
        from coati.testing import build_tiny_reward_model

        args = ["--rm-path", str(build_tiny_reward_model(tmp_path / "rm"))] + args
    monkeypatch.setattr(sys, "argv", [name] + args)
    monkeypatch.chdir(root)
    runpy.run_path(str(root / "examples" / name), run_name="__main__")
    metrics = list(tmp_path.glob("*/latest/metrics.jsonl"))  # <save_dir>/<project>/<run>
    assert len(metrics) == 1
    steps = [json.loads(line)["step"] for line in metrics[0].read_text().splitlines()]
    assert steps in ([1], [0, 1]), steps  # one training step, after the evaluation before training when there is one
    if name == "lora_dapo.py":  # the adapter, as a PEFT folder, is what the run leaves
        assert (metrics[0].parent / "final" / "adapter_config.json").exists()
