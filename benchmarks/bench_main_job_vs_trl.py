"""The default job's accuracy against TRL's GRPOTrainer on the same workload, judged by one evaluation, at equal
training wall-clock.

TRL trains SmolLM2-135M-Instruct on the default job's training prompts (reasoning-gym chain_sum, 2-3 terms, 1-2
digits, the same rows and chat template), 4 prompts x 4 completions per step, 48 new tokens, temperature 1.0, the
default job's constant learning rate, DAPO's loss (clip 0.2/0.28, token-mean, no KL), with the last-number reward
(benchmarks/bench_reward.py: the default job's lenient check). coati's run is the default job itself, read from its
folder: each of its held-out evaluations after training began is a mark, at the training-loop seconds that led to it
(evaluations excluded); TRL's model is saved after its first step past each mark (saving excluded) and stops at the
last. Then the base model and every saved TRL model are scored by coati's own held-out evaluation (the default job's
96 rows, greedy, 48 new tokens), the one that produced coati's numbers, and the gains are printed side by side: the
held-out gain of each side against training time. ``make run`` evaluates before and after training only (one mark);
``-ei N`` adds a mark every N steps.

    make run && python benchmarks/bench_main_job_vs_trl.py [--run runs/coati] [--trl-bf16]
    python rl_example.py --algo DAPO -ei 10 -p coati-ei10 && \
        python benchmarks/bench_main_job_vs_trl.py --run runs/coati-ei10 --trl-bf16
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


def coati_run(folder: str) -> list[dict]:
    """The default job's held-out evaluations from its run folder, each with the training steps before it and their
    loop seconds (evaluations excluded); the first is the evaluation before training."""
    import json

    lines = [json.loads(line) for line in open(Path(folder, "metrics.jsonl"))]
    seconds = {0: 0.0}
    for m in (m for m in lines if m["step"] > 0):  # step 0: the evaluation before training
        seconds[m["step"]] = seconds[m["step"] - 1] + m["time/step"]
    evals = json.loads(Path(folder, "evals.json").read_text())
    return [{"steps": e["step"], "seconds": seconds[e["step"]], "lenient": e["eval/lenient"]} for e in evals]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="runs/coati", help="the default job's run folder (make run)")
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
    if len(coati) < 2 or coati[0]["steps"] != 0:
        raise SystemExit(f"{args.run} has no evaluation before and after training steps (evals.json: {coati})")
    marks = [e["seconds"] for e in coati[1:]]
    job = parse_config([])  # the default job's config tree
    model = default_model_path()
    train_spec, held_out_spec = job.data.datasets(job.run.seed)
    train, held_out = load_rows(**dataset_kwargs(train_spec)), load_rows(**dataset_kwargs(held_out_spec))
    max_new_tokens, lr = job.generation.max_new_tokens, job.consumer.learning_rate
    print(f"workload: {job.data.train}, {len(train)} training rows, {len(held_out)} held-out rows, {max_new_tokens} new "
          f"tokens, lr {lr}; TRL saved at {', '.join(f'{m:.0f}' for m in marks)} s of training", flush=True)  # fmt: skip
    python = trl_python()
    with tempfile.TemporaryDirectory() as d:
        trl = run_trl(python, model, train, 10**4, max_new_tokens, lr, threads=2, bf16=args.trl_bf16,
                      max_seconds=marks[-1], save_at=marks, save_dir=d)  # fmt: skip
        before = evaluate(model, model, held_out, max_new_tokens)["lenient"]
        trl_after = [evaluate(save["path"], model, held_out, max_new_tokens)["lenient"] for save in trl["saves"]]
    print(f"held-out greedy accuracy, lenient ({len(held_out)} rows, coati's evaluation), against training wall-clock "
          f"(TRL{' bf16' if args.trl_bf16 else ' fp32'}); before training: coati {coati[0]['lenient']:.3f}, TRL "
          f"{before:.3f}")  # fmt: skip
    print(f"  {'coati s':>8}{'steps':>6}{'after':>7}{'gain':>7}   {'TRL s':>6}{'steps':>6}{'after':>7}{'gain':>7}"
          f"   {'gain ratio':>10}")  # fmt: skip
    for c, save, after in zip(coati[1:], trl["saves"], trl_after, strict=True):
        gains = c["lenient"] - coati[0]["lenient"], after - before
        ratio = f"{gains[0] / gains[1]:.2f}x" if gains[1] > 0 else "n/a"
        print(f"  {c['seconds']:>8.0f}{c['steps']:>6}{c['lenient']:>7.3f}{gains[0]:>+7.3f}   {save['seconds']:>6.0f}"
              f"{save['steps']:>6}{after:>7.3f}{gains[1]:>+7.3f}   {ratio:>10}")  # fmt: skip
    print("target: coati's gain >= 2x TRL's at equal training time")


if __name__ == "__main__":
    main()
