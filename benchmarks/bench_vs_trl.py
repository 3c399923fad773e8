"""coati vs TRL's GRPOTrainer, same workload, same machine, one invocation.

Both train the same weights and tokenizer on the same prompts (reasoning-gym chain_sum), with the same reward
function (shared_reward.py, shared verbatim), 4 prompts x 4 completions per step, the same max new tokens, learning
rate, DAPO loss (clip 0.2/0.28, token-mean, no KL), and the same number of steps. coati runs synchronously
(max_staleness 0) and overlapped (1), with DAPO's dynamic sampling and overlong shaping off to match TRL. Throughput
is completions per second of training-loop wall time (model loading excluded on both sides). TRL runs in the same
environment as coati (TRL 1.16 accepts the transformers coati pins), in a subprocess of its own, with both cores.

Each precision runs all three: ``fp32`` (TRL bf16=False; coati compute_dtype fp32, fp32 generation) and ``best``, each
side's fastest setting a user would pick on this CPU (TRL bf16=True; coati's defaults: bf16 autocast training over fp32
masters, and bf16 engine weights, which follow the trainer's compute dtype). Ratios compare coati with TRL at the same
precision.

The trainer's achieved GFLOP/s counts the matmul FLOPs a training step needs (6 x weights x tokens: each group's
prompt once, the output layer on response tokens only; attention scores left out, a few % at these lengths) over
the step's training time, against the matmul peak measured by a probe in the same run at the trainer's precision
and thread count: over every step, and over the steps after the first WARMUP_STEPS (a trainer's first steps also
fault in the memory its tensors grow into, and each larger batch after them some more: a one-off cost that a run
of a few steps weighs and a long run does not).

    pip install -r benchmarks/requirements.txt
Writes ``benchmarks/results/vs_trl.json``.

    python benchmarks/bench_vs_trl.py [--sizes tiny smollm2] [--steps 12 6] [--precisions fp32 best]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.results_file import write_result  # noqa: E402

PROMPTS, GENERATIONS = 4, 4
PRECISIONS = {
    # name: (TRL's bf16 flag, coati's consumer.compute_dtype; coati's engine weights follow it)
    "fp32": (False, "fp32"),
    "best": (True, "auto"),
}


def trl_python() -> str:
    """This interpreter, once TRL imports in it."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise SystemExit("TRL is not installed: pip install -r benchmarks/requirements.txt")
    return sys.executable


def workload_rows(n: int, seed: int) -> list[dict]:
    from coati.distributed.rollout.data import load_rows

    return load_rows("reasoning_gym:chain_sum?min_terms=2&max_terms=3&min_digits=1&max_digits=2", size=n, seed=seed)


def matmul_peak(dtype: str, threads: int, seconds: float = 1.5) -> float:
    """Best GFLOP/s of torch matmuls shaped like a small model's training (tokens x hidden @ hidden x 4 hidden) and
    square, at ``dtype`` on ``threads`` threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    best = 0.0
    try:
        for m, k, n in ((2048, 576, 1536), (1024, 1024, 1024)):
            a, b = torch.randn(m, k, dtype=dt), torch.randn(k, n, dtype=dt)
            a @ b  # warm-up
            reps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 2:
                a @ b
                reps += 1
            best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start) / 1e9)
    finally:
        torch.set_num_threads(before)
    return best


def matmul_weights(model: str) -> tuple[int, int]:
    """(weights in the decoder's matmuls, weights of the output layer) of a model folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model))
    head = net.get_output_embeddings()
    body = sum(m.weight.numel() for m in net.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return body, head.weight.numel()


WARMUP_STEPS = 2
"""steps left out of the trainer's steady-state rate (printed beside its rate over every step)"""


def trainer_gflops(history: list[dict], weights: tuple[int, int]) -> float:
    """Matmul GFLOP/s the trainer achieved over the run's steps (see the module docstring)."""
    body, head = weights
    flops = sum(
        6 * (body * m["rollout/trained_tokens_unique"] + head * m["rollout/trained_response_tokens"]) for m in history
    )
    return flops / sum(m["time/train_step"] for m in history) / 1e9


def run_trl(
    python: str,
    model: str,
    rows,
    steps: int,
    max_new_tokens: int,
    lr: float,
    threads: int,
    bf16: bool,
    max_seconds: float | None = None,
    save_at: list[float] | None = None,
    save_dir: str | None = None,
    seed: int = 0,
    overlong: tuple[int, float] | None = None,
) -> dict:
    """TRL's run (``trl_side.py``, in a subprocess): its wall time, per-step rewards and, with ``save_at``, the models
    saved under ``save_dir`` at those seconds of training; with ``overlong`` (buffer tokens, factor), DAPO's soft
    overlong punishment added to its reward."""
    with tempfile.TemporaryDirectory() as d:
        spec = {
            "model": model,
            "rows": rows,
            "steps": steps,
            "max_new_tokens": max_new_tokens,
            "lr": lr,
            "prompts": PROMPTS,
            "generations": GENERATIONS,
            "threads": threads,
            "seed": seed,
            "out_dir": d,
            "bench_dir": str(HERE),
            "bf16": bf16,
            "max_seconds": max_seconds,
            "save_at": save_at,
            "save_dir": save_dir,
            "overlong": overlong,
        }
        Path(d, "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads), PYTHONPATH="")
        out = subprocess.run(
            [python, str(HERE / "trl_side.py"), f"{d}/spec.json", f"{d}/out.json"],
            env=env,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"TRL run failed:\n{out.stderr[-3000:]}")
        return json.loads(Path(d, "out.json").read_text())


def coati_kwargs(
    model: str, rows, steps: int, max_new_tokens: int, lr: float, staleness: int, compute_dtype: str
) -> dict:
    """coati's side of the comparison, as ``launch_distributed`` arguments: DAPO with dynamic sampling (and with it
    the skipping of signal-less prompts) and overlong shaping off, as TRL's GRPOTrainer has neither."""
    return dict(
        num_producers=1,
        num_proc_per_producer=1,
        num_consumer_procs=1,
        num_episodes=1,
        inference_batch_size=PROMPTS,
        inference_microbatch_size=PROMPTS,
        train_batch_size=PROMPTS,
        train_minibatch_size=PROMPTS,
        train_dataset_config={"rows": rows},
        inference_model_config={"path": model},
        train_model_config={"path": model},
        generate_config={"max_new_tokens": max_new_tokens, "temperature": 1.0},
        grpo_config={
            "lr": lr,
            "reward_fn_type": "benchmarks.shared_reward:last_number_reward",
            "train_microbatch_size": PROMPTS * GENERATIONS,
            "dynamic_sampling": False,
            "skip_no_signal_after": 0,
            "overlong_buffer_ratio": 0.0,
            "compute_dtype": compute_dtype,
        },
        plugin_config={},
        num_generations=GENERATIONS,
        core_algo="DAPO",
        max_steps=steps,
        max_staleness=staleness,
        # as TRL generates (and the tiny model's head size is one vLLM's CPU build lacks)
        inference_backend="transformers",
    )


def run_coati(model: str, rows, steps: int, max_new_tokens: int, lr: float, staleness: int, compute_dtype: str) -> dict:
    from coati.distributed.launch import launch_distributed

    start = time.perf_counter()
    result = launch_distributed(**coati_kwargs(model, rows, steps, max_new_tokens, lr, staleness, compute_dtype))
    total = time.perf_counter() - start
    h = result["history"]
    loop = sum(m["time/step"] for m in h)
    return {"wall": loop, "startup": total - loop, "rewards": [m["reward/mean"] for m in h], "history": h}


def breakdown(history: list[dict]) -> dict:
    keys = [
        "time/generate",
        "time/reward_wait",
        "time/rollout_wait",
        "time/train_step",
        "time/train",
        "time/weight_push",
    ]
    mean = {k: sum(m.get(k, 0.0) for m in history) / len(history) for k in keys + ["time/step"]}
    accounted = mean["time/rollout_wait"] + mean["time/train"] + mean["time/weight_push"]
    mean["overhead"] = max(mean["time/step"] - accounted, 0.0) + max(mean["time/train"] - mean["time/train_step"], 0.0)
    return mean


def measure(size: str, model: str, steps: int, args, python: str, rows) -> dict:
    """Every run of one model size, at each precision: TRL, coati synchronous, coati overlapped."""
    runs = {}
    for precision in args.precisions:
        trl_bf16, compute = PRECISIONS[precision]
        print(f"   {precision}: TRL", flush=True)
        try:
            runs[precision, "TRL GRPOTrainer"] = run_trl(
                python, model, rows, steps, args.max_new_tokens, args.lr, 2, trl_bf16
            )
        except RuntimeError as e:  # TRL's best setting is then the one that runs
            if ("fp32", "TRL GRPOTrainer") not in runs:
                raise
            print(
                f"   TRL with bf16={trl_bf16} failed ({str(e).strip().splitlines()[-1][:200]}); its fp32 run stands in"
            )
            runs[precision, "TRL GRPOTrainer"] = runs["fp32", "TRL GRPOTrainer"]
        for name, k in (("coati sync", 0), ("coati overlap", 1)):
            print(f"   {precision}: {name}", flush=True)
            runs[precision, name] = run_coati(model, rows, steps, args.max_new_tokens, args.lr, k, compute)
    return runs


def print_size(runs: dict, steps: int, weights, peaks: dict) -> dict:
    n = steps * PROMPTS * GENERATIONS
    rates = {key: n / r["wall"] for key, r in runs.items()}
    print(f"{'precision':<10}{'run':<18}{'completions/s':>14}{'vs TRL':>8}   reward per step")
    for (precision, name), rate in rates.items():
        curve = " ".join(f"{r:.2f}" for r in runs[precision, name]["rewards"])
        print(f"{precision:<10}{name:<18}{rate:>14.2f}{rate / rates[precision, 'TRL GRPOTrainer']:>7.2f}x   {curve}")
    if ("fp32", "TRL GRPOTrainer") in rates and ("best", "coati overlap") in rates:
        print(
            f"coati overlap at its best vs TRL in fp32: "
            f"{rates['best', 'coati overlap'] / rates['fp32', 'TRL GRPOTrainer']:.2f}x"
        )
    trainer = {}
    for (precision, name), r in runs.items():
        if not name.startswith("coati"):
            continue
        h, b = r["history"], breakdown(r["history"])
        threads = int(statistics.median(m["actor/threads"] for m in h))
        dtype = "bf16" if PRECISIONS[precision][1] != "fp32" else "fp32"
        achieved, peak = trainer_gflops(h, weights), peaks[dtype, min(threads, 2)]
        steady = trainer_gflops(h[WARMUP_STEPS:], weights) if len(h) > WARMUP_STEPS else None
        trainer[precision, name] = {"gflops": achieved, "steady_gflops": steady, "peak": peak, "threads": threads, **b}
        print(
            f"{precision} {name}, mean s per step: "
            + ", ".join(
                f"{k.split('/')[-1]} {b[k]:.2f}"
                for k in ("time/generate", "time/reward_wait", "time/train_step", "time/weight_push", "time/step")
            )
            # Synchronous steps are the sum of their parts; the rest is the framework's own time.
            + (
                f", overhead {b['overhead']:.2f} ({100 * b['overhead'] / b['time/step']:.1f}%)"
                if "sync" in name
                else ""
            )
            + f"; trainer {achieved:.0f} GFLOP/s = {100 * achieved / peak:.0f}% of the {dtype} peak on {threads} "
            f"thread(s) ({peak:.0f})"
            + (f", after its first {WARMUP_STEPS} steps {steady:.0f} = {100 * steady / peak:.0f}%" if steady else "")
        )
    return {
        "rates": {f"{p}/{n}": v for (p, n), v in rates.items()},
        "trainer": {f"{p}/{n}": v for (p, n), v in trainer.items()},
        "reward_per_step": {f"{p}/{n}": r["rewards"] for (p, n), r in runs.items()},
        "steps": steps,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--steps", nargs="+", type=int, default=[12, 6], help="steps per size, in --sizes order")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE.parent))
    import ray

    from coati.testing import build_tiny_model

    python = trl_python()
    peaks = {(d, t): matmul_peak(d, t) for d in ("fp32", "bf16") for t in (1, 2)}
    print("matmul peak, GFLOP/s: " + ", ".join(f"{d} {t} thread(s) {v:.0f}" for (d, t), v in peaks.items()))
    ray.init(include_dashboard=False, num_cpus=4, log_to_driver=False)
    rows = workload_rows(256, seed=0)
    tmp = tempfile.mkdtemp()
    report = {"peaks": {f"{d}/{t}": v for (d, t), v in peaks.items()}}
    for size, steps in zip(args.sizes, args.steps, strict=True):
        if size == "tiny":
            model = str(build_tiny_model(Path(tmp) / "tiny", arch="qwen2", hidden_size=256, num_layers=4, num_heads=4))
        else:
            from coati.default_model import default_model_path

            model = default_model_path()
        print(
            f"\n== {size}: {steps} steps x {PROMPTS * GENERATIONS} completions, {args.max_new_tokens} new tokens ==",
            flush=True,
        )
        runs = measure(size, model, steps, args, python, rows)
        report[size] = print_size(runs, steps, matmul_weights(model), peaks)
    ray.shutdown()
    print(f"wrote {write_result('vs_trl', report)}")
    return report


if __name__ == "__main__":
    main()
