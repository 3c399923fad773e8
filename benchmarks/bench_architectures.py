"""The architecture matrix end to end: every family of ``coati.testing.ARCHITECTURES`` (a tiny random model of each,
head size 64, fp32 on both sides) x {transformers, vllm} x {DP, TP=2}, three synchronous GRPO steps at a large
learning rate. Each combination either trains with the engine/trainer log-prob gap at float tolerance after every
update, or is refused before any actor starts (the one-line reason is recorded). The suite checks each combination
where it breaks (tests/component/test_architectures.py); this runs them whole.

    python benchmarks/bench_architectures.py [--archs qwen3 gpt2] [--backends vllm] [--layouts tp2]

Writes benchmarks/results/architectures.json (the table docs/architectures quotes) and prints the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {
    "dp": {"num_consumer_procs": 1, "plugin_config": {}},
    "tp2": {"num_consumer_procs": 2, "plugin_config": {"tp_size": 2}},
}
TOLERANCE = 1e-3
"""fp32 engine and trainer holding the same weights agree to ~1e-5 in mean |log-prob gap|; a stale or diverged
weight shows as 1e-2 and more"""


def digit_fraction(completions, **fields):
    """Fraction of a response's characters that are digits: a signal a random tiny model moves on."""
    from coati.distributed.reward.base import RewardResult

    return [RewardResult(sum(ch.isdigit() for ch in c) / max(len(c), 1), True, False) for c in completions]


def run_kwargs(path: str, backend: str, steps: int, **over) -> dict:
    """``launch_distributed``'s arguments for ``steps`` synchronous GRPO steps of the tiny model at ``path`` on
    ``backend``, fp32 on both sides (``grpo_config``'s keys in ``over`` are merged into it)."""
    grpo = {
        "lr": 3e-3,
        "reward_fn_type": "benchmarks.bench_architectures:digit_fraction",
        "train_microbatch_size": 8,
        "compute_dtype": "fp32",  # "auto" computes in bf16 on a CPU with AVX512-BF16
        **over.pop("grpo_config", {}),
    }
    kw = dict(
        num_producers=1,
        num_proc_per_producer=1,
        num_episodes=1,
        inference_batch_size=4,
        inference_microbatch_size=4,
        train_batch_size=4,
        train_minibatch_size=4,
        train_dataset_config={"rows": [{"prompt": f"q{i}"} for i in range(64)]},
        inference_model_config={"path": path, "dtype": "float32"},
        train_model_config={"path": path},
        generate_config={"max_new_tokens": 12, "max_prompt_tokens": 32, "temperature": 1.0},
        grpo_config=grpo,
        num_generations=4,
        core_algo="GRPO",
        max_steps=steps,
        inference_backend=backend,
        max_staleness=0,
    )
    return {**kw, **over}


def run_one(path: str, backend: str, layout: str, steps: int) -> dict:
    from coati.distributed.driver.actor_group import RunError
    from coati.distributed.guards import EngineMismatch
    from coati.distributed.launch import launch_distributed

    kw = run_kwargs(path, backend, steps, **LAYOUTS[layout])
    start = time.perf_counter()
    try:
        out = launch_distributed(**kw)
    except (ValueError, KeyError, FileNotFoundError) as e:
        return {"verdict": "refused", "reason": str(e.args[0] if e.args else e), "seconds": time.perf_counter() - start}
    except RunError as e:
        return {"verdict": "failed", "reason": str(e).splitlines()[0], "seconds": time.perf_counter() - start}
    except EngineMismatch as e:  # the run's own guard stopped it
        return {"verdict": "drifts", "reason": str(e), "seconds": time.perf_counter() - start}
    gaps = [m.get("rollout/engine_trainer_gap_abs") for m in out["history"]]
    ok = all(g is not None and g < TOLERANCE for g in gaps)
    return {"verdict": "trains" if ok else "drifts", "gaps": gaps, "seconds": time.perf_counter() - start}


def main(argv=None) -> dict:
    import ray

    from benchmarks.results_file import write_result
    from coati.testing import ARCHITECTURES, build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", default=list(ARCHITECTURES), choices=ARCHITECTURES)
    parser.add_argument("--backends", nargs="+", default=["transformers", "vllm"], choices=["transformers", "vllm"])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # as the suite: eager vLLM sampler, the same tokens
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TORCHDYNAMO_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs:
            path = str(build_tiny_model(Path(tmp) / arch, arch=arch, hidden_size=128, num_heads=2, vocab_multiple=8))
            for backend in args.backends:
                for layout in args.layouts:
                    row = {
                        "arch": arch,
                        "backend": backend,
                        "layout": layout,
                        **run_one(path, backend, layout, args.steps),
                    }
                    rows.append(row)
                    detail = row.get("reason") or " ".join(f"{g:.1e}" for g in row["gaps"])
                    print(
                        f"{arch:8} {backend:12} {layout:4} {row['verdict']:8} {row['seconds']:5.0f}s  {detail[:140]}",
                        flush=True,
                    )
    result = {"tolerance": TOLERANCE, "steps": args.steps, "rows": rows}
    command = ["benchmarks/bench_architectures.py", *(argv if argv is not None else sys.argv[1:])]
    print(f"wrote {write_result('architectures', result, command)}")
    return result


if __name__ == "__main__":
    main()
