"""The command line as a user meets it, in a fresh process from the user's own folder: a mistake in the inputs ends in
one line and exit status 2 before Ray starts, and a reward module beside the user's data is found by the driver as
the actors find it."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], cwd: Path, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_vars}
    return subprocess.run(
        [sys.executable, str(ROOT / "rl_example.py"), *args, "-sd", str(cwd / "runs")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_input_mistakes_end_in_one_line_before_ray_starts(tmp_path):
    (tmp_path / "my_reward.py").write_text(
        "def fmt(completions, solution, **kw):\n    return [1.0] * len(completions)\n"
    )
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n{"prompt": "ho"}\n')
    (tmp_path / "answered.jsonl").write_text("".join(f'{{"prompt": "q{i}", "gt_answer": "1"}}\n' for i in range(8)))
    cases = {
        ("-d", "missing.jsonl"): "dataset file or folder missing.jsonl does not exist; check the path",
        # the module is found in the current folder (the driver did not look there): the data lacks its column
        ("-d", "data.jsonl", "-rt", "my_reward:fmt"): "reward function my_reward:fmt needs column(s) ['solution']",
        ("-d", "answered.jsonl", "-m", str(tmp_path / "no_model")): "is not a local folder",
    }
    cache = tmp_path / "cache"  # as on a first use: the default model not converted yet
    for args, message in cases.items():
        out = run(list(args), tmp_path, COATI_CACHE=str(cache))
        assert out.returncode == 2, (args, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, out.stderr[-2000:])
        assert "Ray" not in out.stdout + out.stderr, (args, out.stderr[-2000:])
    assert not (tmp_path / "runs").exists()  # nothing written
    assert not cache.exists()  # refused before converting the default model (its progress bars were 35 lines)


def test_a_backend_or_layout_that_cannot_run_the_model_is_refused_before_ray_starts(tmp_path):
    """vLLM's CPU attention refusing the model's head size, and tensor parallelism over an architecture the trainer's
    policies do not cover, are decided from config.json: one line naming the alternative, before Ray starts."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from coati.default_model import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())  # a complete folder: only the layout is wrong
    vocab = len(tokenizer)
    odd_heads = LlamaConfig(
        vocab_size=vocab, hidden_size=80, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )  # heads of size 40
    gpt2 = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2)
    for name, model in (("odd_heads", LlamaForCausalLM(odd_heads)), ("gpt2", GPT2LMHeadModel(gpt2))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    (tmp_path / "data.jsonl").write_text("".join(f'{{"prompt": "q{i}", "gt_answer": "1"}}\n' for i in range(8)))
    cases = {
        ("-m", str(tmp_path / "odd_heads"), "-b", "vllm"): "heads of size 40, which vLLM's CPU attention does not",
        ("-m", str(tmp_path / "gpt2"), "-tp", "2", "-t", "2"): "which coati's tensor parallelism does not cover",
    }
    for args, message in cases.items():
        out = run(["-d", "data.jsonl", *args], tmp_path)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, out.stderr[-2000:])
        assert "Ray" not in out.stdout + out.stderr, (args, out.stderr[-2000:])
    assert not (tmp_path / "runs").exists()


def test_a_teacher_the_student_cannot_distil_from_is_refused_before_ray_starts(tmp_path):
    """A teacher whose tokenizer is not the student's (one token more), a teacher folder with no model, and a
    privileged context naming a column the data lacks: one line each, before Ray starts."""
    from transformers import AutoTokenizer

    from coati.testing import build_tiny_model

    student = build_tiny_model(tmp_path / "student")
    other = build_tiny_model(tmp_path / "other", seed=1)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(other)
    (tmp_path / "data.jsonl").write_text("".join(f'{{"prompt": "q{i}", "gt_answer": "1"}}\n' for i in range(8)))
    opd = ["-d", "data.jsonl", "-m", str(student), "-b", "transformers", "--algo", "OPD", "--teacher-model"]
    cases = {
        (*opd, str(other)): f"teacher {other}'s tokenizer is not the student's ({student})",
        (*opd, str(tmp_path)): "is not a model folder (no config.json",
        (*opd, "self:2", "--teacher-privileged-context", " {solution}"): "shows {solution}, but training set row 0",
    }
    for args, message in cases.items():
        out = run(list(args), tmp_path)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, out.stderr[-2000:])
        assert "Ray" not in out.stdout + out.stderr, (args, out.stderr[-2000:])


def test_images_a_text_model_cannot_read_are_refused_before_ray_starts(tmp_path):
    """The built-in visual task, and a data file whose image is missing: one line each, before Ray starts."""
    from coati.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    (tmp_path / "data.jsonl").write_text('{"prompt": "how many?", "images": ["gone.png"], "gt_answer": "1"}\n' * 8)
    cases = {
        ("-d", "shapes:count"): f"the data holds 608 images, but model {model} (LlamaForCausalLM) is text-only",
        ("-d", "data.jsonl"): f"training set row 0 image 0: image file {tmp_path / 'gone.png'} does not exist",
    }
    for args, message in cases.items():
        out = run([*args, "-m", str(model), "-b", "transformers"], tmp_path)
        assert out.returncode == 2, (args, out.stderr[-2000:])
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, out.stderr[-2000:])
        assert "Ray" not in out.stdout + out.stderr, (args, out.stderr[-2000:])
