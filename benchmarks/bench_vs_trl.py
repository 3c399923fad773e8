"""coati vs TRL's GRPOTrainer, same workload, same machine, one invocation.

Both train the same weights and tokenizer on the same prompts (reasoning-gym chain_sum), with the same reward
function (bench_reward.py, shared verbatim), 4 prompts x 4 completions per step, the same max new tokens, learning
rate, DAPO loss (clip 0.2/0.28, token-mean, no KL), and the same number of steps. coati runs synchronously
(max_staleness 0) and overlapped (1), with DAPO's dynamic sampling and overlong shaping off to match TRL. Throughput
is completions per second of training-loop wall time (model loading excluded on both sides). TRL runs in the same
environment as coati (TRL 1.16 accepts the transformers coati pins), in a subprocess of its own.

    pip install -r benchmarks/requirements.txt
    python benchmarks/bench_vs_trl.py [--sizes tiny smollm2] [--steps 12 6] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPTS, GENERATIONS = 4, 4


def trl_python() -> str:
    """This interpreter, once TRL imports in it."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise SystemExit("TRL is not installed: pip install -r benchmarks/requirements.txt")
    return sys.executable


def workload_rows(n: int, seed: int) -> list[dict]:
    from coati.distributed.data import load_rows

    return load_rows("reasoning_gym:chain_sum?min_terms=2&max_terms=3&min_digits=1&max_digits=2", size=n, seed=seed)


def run_trl(python: str, model: str, rows, steps: int, max_new_tokens: int, lr: float, threads: int,
            save_to: str | None = None) -> dict:  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        spec = {"model": model, "rows": rows, "steps": steps, "max_new_tokens": max_new_tokens, "lr": lr,
                "prompts": PROMPTS, "generations": GENERATIONS, "threads": threads, "seed": 0, "out_dir": d,
                "bench_dir": str(HERE), "save_to": save_to}  # fmt: skip
        Path(d, "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads), PYTHONPATH="")
        out = subprocess.run([python, str(HERE / "trl_side.py"), f"{d}/spec.json", f"{d}/out.json"], env=env,
                             capture_output=True, text=True)  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"TRL run failed:\n{out.stderr[-3000:]}")
        return json.loads(Path(d, "out.json").read_text())


def run_coati(model: str, rows, steps: int, max_new_tokens: int, lr: float, staleness: int) -> dict:
    from coati.distributed.launch import launch_distributed

    start = time.perf_counter()
    result = launch_distributed(
        num_producers=1, num_proc_per_producer=1, num_consumer_procs=1, num_episodes=1,
        inference_batch_size=PROMPTS, inference_microbatch_size=PROMPTS, train_batch_size=PROMPTS,
        train_minibatch_size=PROMPTS, train_dataset_config={"rows": rows}, inference_model_config={"path": model},
        train_model_config={"path": model}, generate_config={"max_new_tokens": max_new_tokens, "temperature": 1.0},
        grpo_config={"lr": lr, "reward_fn_type": "benchmarks.bench_reward:last_number_reward",
                     "train_microbatch_size": PROMPTS * GENERATIONS, "dynamic_sampling": False,
                     "overlong_buffer_ratio": 0.0},
        plugin_config={}, num_generations=GENERATIONS, core_algo="DAPO", max_steps=steps, max_staleness=staleness,
        inference_backend="transformers",  # as TRL generates (and the tiny model's head size is one vLLM's CPU build lacks)
    )  # fmt: skip
    total = time.perf_counter() - start
    h = result["history"]
    loop = sum(m["time/step"] for m in h)
    return {"wall": loop, "startup": total - loop, "rewards": [m["reward/mean"] for m in h], "history": h}


def breakdown(history: list[dict]) -> dict:
    keys = ["time/generate", "time/reward_wait", "time/rollout_wait", "time/train_step", "time/train", "time/weight_push"]
    mean = {k: sum(m.get(k, 0.0) for m in history) / len(history) for k in keys + ["time/step"]}
    accounted = mean["time/rollout_wait"] + mean["time/train"] + mean["time/weight_push"]
    mean["overhead"] = max(mean["time/step"] - accounted, 0.0) + max(mean["time/train"] - mean["time/train_step"], 0.0)
    return mean


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--steps", nargs="+", type=int, default=[12, 6], help="steps per size, in --sizes order")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE.parent))
    import ray

    from coati.models import build_tiny_model

    python = trl_python()
    ray.init(include_dashboard=False, num_cpus=4, log_to_driver=False)
    rows = workload_rows(256, seed=0)
    tmp = tempfile.mkdtemp()
    report = []
    for size, steps in zip(args.sizes, args.steps, strict=True):
        if size == "tiny":
            model = str(build_tiny_model(Path(tmp) / "tiny", arch="qwen2", hidden_size=256, num_layers=4, num_heads=4))
        else:
            from coati.default_model import default_model_path

            model = default_model_path()
        print(f"\n== {size}: {steps} steps x {PROMPTS * GENERATIONS} completions, {args.max_new_tokens} new tokens ==",
              flush=True)  # fmt: skip
        trl = run_trl(python, model, rows, steps, args.max_new_tokens, args.lr, threads=2)
        sync = run_coati(model, rows, steps, args.max_new_tokens, args.lr, staleness=0)
        overlap = run_coati(model, rows, steps, args.max_new_tokens, args.lr, staleness=1)
        n = steps * PROMPTS * GENERATIONS
        rates = {"TRL GRPOTrainer": n / trl["wall"], "coati sync": n / sync["wall"], "coati overlap": n / overlap["wall"]}
        print(f"{'run':<18}{'completions/s':>14}{'vs TRL':>8}   reward per step")
        for name, rate, rewards in zip(rates, rates.values(), (trl["rewards"], sync["rewards"], overlap["rewards"])):
            curve = " ".join(f"{r:.2f}" for r in rewards)
            print(f"{name:<18}{rate:>14.2f}{rate / rates['TRL GRPOTrainer']:>7.2f}x   {curve}")
        b = breakdown(sync["history"])
        print("coati sync, mean seconds per step: " + ", ".join(
            f"{k.split('/')[-1]} {b[k]:.3f}" for k in ("time/generate", "time/reward_wait", "time/train_step",
                                                       "time/weight_push", "time/step")))  # fmt: skip
        print(f"framework overhead (step time not in generation, reward, train or push): {b['overhead']:.3f} s "
              f"= {100 * b['overhead'] / b['time/step']:.1f}% of step time (target <= 5%)")
        report.append({"size": size, "rates": rates, "breakdown": b})
    ray.shutdown()
    return report


if __name__ == "__main__":
    main()
