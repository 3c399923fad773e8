"""Routing replay's effect on the engine/trainer mismatch of a mixture-of-experts run: a tiny Qwen3-MoE (8 experts,
top-2) trained by GRPO on the transformers engine, with and without ``routing_replay``, at each precision pair, the
same seed and prompts. Per step it records the engine/trainer log-prob gap over the fresh rows
(``rollout/engine_trainer_gap_abs``) and, with replay, the share of tokens x MoE layers the trainer's own router
already sent where the engine did (``moe/routing_agreement``).

    python benchmarks/bench_routing_replay.py [--steps 8] [--precisions fp32 bf16]

Writes benchmarks/results/routing_replay.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRECISIONS = {"fp32": ("float32", "fp32"), "bf16": ("bfloat16", "bf16")}
"""name -> (the engine's weight dtype, the trainer's compute dtype)"""


def run_one(path: str, precision: str, replay: bool, steps: int) -> dict:
    from benchmarks.bench_architectures import run_kwargs
    from coati.distributed.launch import launch_distributed

    dtype, compute = PRECISIONS[precision]
    kw = run_kwargs(
        path,
        "transformers",
        steps,
        grpo_config={"lr": 1e-3, "compute_dtype": compute, "routing_replay": replay, "max_engine_trainer_gap": 0},
        train_dataset_config={"rows": [{"prompt": f"question {i}: how many?"} for i in range(4 * steps)]},
        inference_model_config={"path": path, "dtype": dtype},
        generate_config={"max_new_tokens": 24, "max_prompt_tokens": 48, "temperature": 1.0},
        num_consumer_procs=1,
        plugin_config={},
        project_name=f"replay-{precision}-{int(replay)}",
    )
    out = launch_distributed(**kw)
    history = out["history"]
    gaps = [m.get("rollout/engine_trainer_gap_abs") for m in history]
    row = {"precision": precision, "routing_replay": replay, "gaps": gaps, "mean_gap": sum(gaps) / len(gaps)}
    if replay:
        row["routing_agreement"] = [m.get("moe/routing_agreement") for m in history]
    return row


def main(argv=None) -> dict:
    import ray

    from benchmarks.results_file import write_result
    from coati.testing import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_model(Path(tmp) / "qwen3_moe", arch="qwen3_moe", hidden_size=128, num_heads=2))
        for precision in args.precisions:
            for replay in (False, True):
                row = run_one(path, precision, replay, args.steps)
                rows.append(row)
                agreement = row.get("routing_agreement")
                print(
                    f"{precision} replay={replay!s:5} mean gap {row['mean_gap']:.2e}"
                    + (f"  agreement {min(agreement):.4f}-{max(agreement):.4f}" if agreement else ""),
                    flush=True,
                )
    result = {"model": "tiny qwen3_moe: hidden 128, 2 layers, 8 experts, top-2", "steps": args.steps, "rows": rows}
    command = ["benchmarks/bench_routing_replay.py", *(argv if argv is not None else sys.argv[1:])]
    print(f"wrote {write_result('routing_replay', result, command)}")
    return result


if __name__ == "__main__":
    main()
