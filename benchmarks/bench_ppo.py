"""PPO with a learned critic against DAPO on the default job (the default model and task, ``make run``'s), at
equal wall clock: each run trains for ``--time-limit-s`` seconds of its loop (``run.time_limit_s``), one after the
other in this invocation, through ``rl_example.py`` exactly as ``make run`` runs it but for ``--algo`` and the limit.

Prints and writes (``benchmarks/results/ppo.json``) per run: the steps trained, completions trained per second of
loop, the held-out accuracy before and after (lenient and strict) and its gain, and for PPO the critic's explained
variance and value loss over the first and last five steps.

    python benchmarks/bench_ppo.py [--time-limit-s 360] [--algos PPO DAPO] [--out runs/bench_ppo] [-- extra flags]

An entry of ``--algos`` may carry flags of its own run after a colon, ``PPO:--critic-learning-rate=1e-4``
(comma-separated); the flags after ``--`` go to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results_file import write_result  # noqa: E402
from coati.distributed.driver.run_folder import run_of  # noqa: E402


def run(i: int, entry: str, args, extra: list[str]) -> dict:
    algo, _, own = entry.partition(":")
    flags = [f for f in own.split(",") if f]
    project = f"ppo-bench-{i}-{algo.lower()}"
    cmd = [sys.executable, str(ROOT / "rl_example.py"), "--algo", algo, "--time-limit-s", str(args.time_limit_s)]
    cmd += ["--max-steps", "1000", "--save-dir", args.out, "-p", project, "--overwrite", "--no-progress"]
    subprocess.run([*cmd, *flags, *extra], check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return {**summarize(Path(run_of(str(Path(args.out) / project))), algo), "flags": flags}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return sum(values) / len(values) if values else None


def summarize(folder: Path, algo: str) -> dict:
    """One run's row, from its run folder."""
    summary = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["step"] > 0]
    loop_s = summary["loop"]["totals"]["loop_s"]
    import yaml

    config = yaml.safe_load((folder / "config.yaml").read_text())
    c = config["consumer"]
    per_step = c["train_batch_size"] * c["num_consumer_procs"] * config["producer"]["num_generations"]
    completions = per_step * len(steps)  # every step trains its whole batch (data parallelism only here)
    first, last = summary["evals"][0], summary["evals"][-1]
    row = {
        "algo": algo,
        "steps": len(steps),
        "loop_s": loop_s,
        "completions_trained": completions,
        "completions_per_s": completions / loop_s if loop_s else None,
        "lenient": (first["eval/lenient"], last["eval/lenient"]),
        "strict": (first["eval/strict"], last["eval/strict"]),
        "lenient_gain": last["eval/lenient"] - first["eval/lenient"],
    }
    if any("critic/explained_variance" in m for m in steps):
        ev = [m.get("critic/explained_variance") for m in steps]
        loss = [m.get("critic/value_loss") for m in steps]
        row["critic"] = {
            "explained_variance_first5": _mean(ev[:5]),
            "explained_variance_last5": _mean(ev[-5:]),
            "value_loss_first5": _mean(loss[:5]),
            "value_loss_last5": _mean(loss[-5:]),
            "explained_variance": ev,
            "value_loss": loss,
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit-s", type=float, default=360.0)
    parser.add_argument("--algos", nargs="+", default=["PPO", "DAPO"])
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_ppo"))
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    results = [run(i, entry, args, extra) for i, entry in enumerate(args.algos)]
    print(f"\n== default job, {args.time_limit_s:.0f} s of training loop each ==")
    for r in results:
        critic = r.get("critic") or {}
        ev = critic.get("explained_variance_last5")
        print(
            f"{r['algo']:>6} {' '.join(r['flags']):>28} {r['steps']:>4} steps "
            f"{r['completions_per_s']:.3f} completions/s, lenient "
            f"{r['lenient'][0]:.3f} -> {r['lenient'][1]:.3f} (gain {r['lenient_gain']:+.3f})"
            + (f", critic explained variance last 5 steps {ev:.3f}" if ev is not None else "")
        )
    result = {"time_limit_s": args.time_limit_s, "extra_flags": extra, "runs": results}
    print(f"wrote {write_result('ppo', result)}")


if __name__ == "__main__":
    main()
