"""What overlap buys and costs: the default job (DAPO on the default model and task) at max_staleness k = 0, 1, 2, one
after the other on this machine, each through ``rl_example.py`` exactly as ``make run`` runs it but for ``-nb k``.

Prints, for each k: training steps per minute of loop time, the groups trained at each version lag (the lag
histogram), the largest lag, groups dropped for staleness, and the held-out lenient/strict accuracy before and after.

    python benchmarks/bench_staleness.py [--ks 0 1 2] [--max-steps 30] [--out runs/bench_staleness] [-- extra flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(k: int, args, extra: list[str]) -> dict:
    project = f"staleness-k{k}"
    cmd = [sys.executable, str(ROOT / "rl_example.py"), "--algo", "DAPO", "-nb", str(k), "--max-steps",
           str(args.max_steps), "--save-dir", args.out, "-p", project, "--overwrite", "--no-progress", *extra]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    folder = Path(args.out) / project
    summary = json.loads((folder / "summary.json").read_text())
    steps = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    loop_s = sum(m["time/step"] for m in steps)
    lags = {}
    for m in steps:
        for key, count in m.items():
            if key.startswith("rollout/lag") and key.endswith("_groups"):
                j = int(key[len("rollout/lag") : -len("_groups")])
                lags[j] = lags.get(j, 0) + count
    first, last = summary["evals"][0], summary["evals"][-1]
    return {"k": k, "steps": len(steps), "steps_per_min": 60 * len(steps) / loop_s, "loop_s": loop_s,
            "lags": dict(sorted(lags.items())), "lag_max": max(m["rollout/policy_lag_max"] for m in steps),
            "stale_dropped": sum(m.get("rollout/stale_dropped_groups", 0) for m in steps),
            "drawn": sum(m["rollout/drawn_groups"] for m in steps),
            "lenient": (first["eval/lenient"], last["eval/lenient"]), "strict": (first["eval/strict"], last["eval/strict"])}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_staleness"))
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    results = [run(k, args, extra) for k in args.ks]
    print(f"\n== default job (DAPO), {args.max_steps} steps, max_staleness k ==")
    print(f"{'k':>2} {'steps/min':>9} {'vs k=0':>7} {'loop s':>7} {'groups by lag (0,1,2..)':>24} {'lag max':>7} "
          f"{'stale dropped':>13} {'drawn':>6} {'lenient before->after':>22} {'strict':>12}")  # fmt: skip
    base = next((r["steps_per_min"] for r in results if r["k"] == 0), results[0]["steps_per_min"])
    for r in results:
        lags = ",".join(str(r["lags"].get(j, 0)) for j in range(max(r["lags"], default=0) + 1))
        print(f"{r['k']:>2} {r['steps_per_min']:>9.2f} {r['steps_per_min'] / base:>6.2f}x {r['loop_s']:>7.0f} "
              f"{lags:>24} {r['lag_max']:>7} {r['stale_dropped']:>13} {r['drawn']:>6} "
              f"{r['lenient'][0]:>10.3f} -> {r['lenient'][1]:.3f} {r['strict'][0]:>5.3f} -> {r['strict'][1]:.3f}")


if __name__ == "__main__":
    main()
