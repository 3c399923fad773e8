"""The default job's accuracy against TRL's GRPOTrainer on the same workload, judged by one evaluation.

TRL trains SmolLM2-135M-Instruct on the default job's training prompts (reasoning-gym chain_sum, 2-3 terms, 1-2
digits, the same rows and chat template), 4 prompts x 4 completions per step, 48 new tokens, temperature 1.0, the
default job's learning rate, DAPO's loss (clip 0.2/0.28, token-mean, no KL), for the default job's number of steps,
with the last-number reward (benchmarks/bench_reward.py: the default job's lenient check). Then the base model and
TRL's trained model are scored by coati's own held-out evaluation (the default job's 96 rows, greedy, 48 new tokens,
strict and lenient checks of the math reward), the one that produced the default job's before/after numbers.
coati's run is the default job itself (`make run`); its numbers are in runs/coati/evals.json.

    python benchmarks/bench_main_job_vs_trl.py [--steps 30]
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="training steps (the default job's)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE.parent))
    from bench_vs_trl import run_trl, trl_python
    from coati.default_model import default_model_path
    from coati.distributed.cli import parse_config
    from coati.distributed.data import load_rows
    from coati.distributed.preflight import dataset_kwargs

    job = parse_config([])  # the default job's config tree
    model = default_model_path()
    train_spec, held_out_spec = job.data.datasets(job.run.seed)
    train, held_out = load_rows(**dataset_kwargs(train_spec)), load_rows(**dataset_kwargs(held_out_spec))
    max_new_tokens, lr = job.generation.max_new_tokens, job.consumer.learning_rate
    print(f"workload: {job.data.train}, {len(train)} training rows, {len(held_out)} held-out rows, {args.steps} steps, "
          f"{max_new_tokens} new tokens, lr {lr}", flush=True)  # fmt: skip
    python = trl_python()
    with tempfile.TemporaryDirectory() as d:
        trained = str(Path(d) / "trl-model")
        start = time.perf_counter()
        trl = run_trl(python, model, train, args.steps, max_new_tokens, lr, threads=2,
                      save_to=trained)  # fmt: skip
        print(f"TRL: {args.steps} steps in {trl['wall']:.0f} s of training ({time.perf_counter() - start:.0f} s with "
              f"start-up); sampled reward first 5 steps {sum(trl['rewards'][:5]) / 5:.3f}, last 5 "
              f"{sum(trl['rewards'][-5:]) / 5:.3f}", flush=True)  # fmt: skip
        before = evaluate(model, model, held_out, max_new_tokens)
        after = evaluate(trained, model, held_out, max_new_tokens)
    print(f"held-out greedy accuracy ({len(held_out)} rows), coati's evaluation:")
    print(f"  base model:    lenient {before['lenient']:.3f}  strict {before['strict']:.3f}")
    print(f"  TRL, trained:  lenient {after['lenient']:.3f}  strict {after['strict']:.3f}")


if __name__ == "__main__":
    main()
