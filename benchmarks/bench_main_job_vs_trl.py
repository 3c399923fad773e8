"""The default job's accuracy against TRL's GRPOTrainer on the same workload, judged by one evaluation.

At equal training wall-clock: TRL trains SmolLM2-135M-Instruct on the default job's training prompts (reasoning-gym
chain_sum, 2-3 terms, 1-2 digits, the same rows and chat template), 4 prompts x 4 completions per step, 48 new tokens,
temperature 1.0, the default job's constant learning rate, DAPO's loss (clip 0.2/0.28, token-mean, no KL), with the
last-number reward (benchmarks/bench_reward.py: the default job's lenient check), for as many steps as fit in the
coati run's training-loop time (evaluations excluded on both sides). Then the base model and TRL's trained model are
scored by coati's own held-out evaluation (the default job's 96 rows, greedy, 48 new tokens), the one that produced
the default job's before/after numbers. coati's run is the default job itself (`make run`), read from its folder.

    make run && python benchmarks/bench_main_job_vs_trl.py [--run runs/coati] [--seconds S] [--trl-bf16]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def evaluate(model_dir: str, tokenizer_dir: str, rows: list[dict], max_new_tokens: int, microbatch: int = 4) -> dict:
    """Greedy strict and lenient accuracy, as a producer's ``evaluate`` computes it."""
    import torch
    from transformers import AutoTokenizer

    from coati.distributed.config import GenerationConfig
    from coati.distributed.data import encode_prompt, reward_fields
    from coati.distributed.inference.transformers_backend import TransformersBackend
    from coati.distributed.reward.math_reward import math_reward

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    backend = TransformersBackend(model_dir, GenerationConfig(max_new_tokens=max_new_tokens), device="cpu",
                                  tokenizer=tokenizer)  # fmt: skip
    strict = lenient = 0
    for lo in range(0, len(rows), microbatch):
        chunk = rows[lo : lo + microbatch]
        batch = backend.generate([encode_prompt(tokenizer, r) for r in chunk], 1, greedy=True)
        texts = [tokenizer.decode(batch.response_ids[i, : batch.response_lengths[i]].tolist(), skip_special_tokens=True)
                 for i in range(len(batch))]  # fmt: skip
        fields = [reward_fields(r) for r in chunk]
        for r in math_reward(texts, [f["gt_answer"] for f in fields], format_gate=False):
            strict += bool(r.answer_ok)
            lenient += bool(r.info.get("lenient_ok", r.answer_ok))
    return {"strict": strict / len(rows), "lenient": lenient / len(rows)}


def coati_run(folder: str) -> dict:
    """The default job's run folder: its loop time (training steps, evaluations excluded), steps and held-out
    accuracy before and after."""
    import json

    lines = [json.loads(line) for line in open(Path(folder, "metrics.jsonl"))]
    steps = [m for m in lines if m["step"] > 0]  # step 0: the evaluation before training
    evals = json.loads(Path(folder, "evals.json").read_text())
    return {"seconds": sum(m["time/step"] for m in steps), "steps": len(steps),
            "before": evals[0]["eval/lenient"], "after": evals[-1]["eval/lenient"]}  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="runs/coati", help="the default job's run folder (make run)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="TRL's training wall-clock budget (default: the coati run's loop time)")
    parser.add_argument("--trl-bf16", action="store_true", help="TRL with bf16=True (CPU autocast)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE.parent))
    from bench_vs_trl import run_trl, trl_python
    from coati.default_model import default_model_path
    from coati.distributed.cli import parse_config
    from coati.distributed.data import load_rows
    from coati.distributed.preflight import dataset_kwargs

    coati = coati_run(args.run)
    budget = args.seconds or coati["seconds"]
    job = parse_config([])  # the default job's config tree
    model = default_model_path()
    train_spec, held_out_spec = job.data.datasets(job.run.seed)
    train, held_out = load_rows(**dataset_kwargs(train_spec)), load_rows(**dataset_kwargs(held_out_spec))
    max_new_tokens, lr = job.generation.max_new_tokens, job.consumer.learning_rate
    print(f"workload: {job.data.train}, {len(train)} training rows, {len(held_out)} held-out rows, {max_new_tokens} new "
          f"tokens, lr {lr}; TRL's budget {budget:.0f} s of training", flush=True)  # fmt: skip
    python = trl_python()
    with tempfile.TemporaryDirectory() as d:
        trained = str(Path(d) / "trl-model")
        trl = run_trl(python, model, train, 10**4, max_new_tokens, lr, threads=2, bf16=args.trl_bf16,
                      save_to=trained, max_seconds=budget)  # fmt: skip
        before = evaluate(model, model, held_out, max_new_tokens)
        after = evaluate(trained, model, held_out, max_new_tokens)
    gains = {"coati": coati["after"] - coati["before"], "TRL": after["lenient"] - before["lenient"]}
    print(f"held-out greedy accuracy, lenient ({len(held_out)} rows, coati's evaluation), equal training wall-clock:")
    print(f"  {'':<16}{'steps':>6}{'seconds':>9}{'before':>8}{'after':>7}{'gain':>7}")
    print(f"  {'coati (make run)':<16}{coati['steps']:>6}{coati['seconds']:>9.0f}{coati['before']:>8.3f}"
          f"{coati['after']:>7.3f}{gains['coati']:>+7.3f}")  # fmt: skip
    print(f"  {'TRL GRPOTrainer':<16}{trl['steps']:>6}{trl['wall']:>9.0f}{before['lenient']:>8.3f}"
          f"{after['lenient']:>7.3f}{gains['TRL']:>+7.3f}")  # fmt: skip
    if gains["TRL"] > 0:
        print(f"  coati's gain / TRL's: {gains['coati'] / gains['TRL']:.2f}x (target >= 2x)")


if __name__ == "__main__":
    main()
