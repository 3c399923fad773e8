"""What overlap buys and costs: the default job (DAPO on the default model and task) at max_staleness k = 0, 1, 2, one
after the other on this machine, each through ``rl_example.py`` exactly as ``make run`` runs it but for ``-nb k``;
``--modes drain in-flight`` runs each k >= 1 with in-flight weight updates (pushes loaded mid-round) too.

Prints, for each run: training steps per minute of loop time, the groups trained at each version lag (the lag
histogram), the largest lag, the mean lag per trained token, rows that span two versions, groups dropped for
staleness, and the held-out lenient/strict accuracy before and after. Writes ``benchmarks/results/staleness.json``.

    python benchmarks/bench_staleness.py [--ks 0 1 2] [--modes drain in-flight] [--max-steps 30]
        [--out runs/bench_staleness] [-- extra flags]
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


def run(k: int, in_flight: bool, args, extra: list[str]) -> dict:
    project = f"staleness-k{k}" + ("-in-flight" if in_flight else "")
    cmd = [
        sys.executable,
        str(ROOT / "rl_example.py"),
        "--algo",
        "DAPO",
        "-nb",
        str(k),
        "--max-steps",
        str(args.max_steps),
        "--save-dir",
        args.out,
        "-p",
        project,
        "--overwrite",
        "--no-progress",
        *extra,
    ]
    cmd.append("--in-flight-weight-updates" if in_flight else "--no-in-flight-weight-updates")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    return summarize(Path(run_of(str(Path(args.out) / project))), k, in_flight)  # the project's latest run


def summarize(folder: Path, k: int, in_flight: bool) -> dict:
    """One run's row of the table, from its run folder."""
    summary = json.loads((folder / "summary.json").read_text())
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["step"] > 0]  # step 0: the evaluation before training
    totals = summary["loop"]["totals"]  # the run's own account of its loop
    loop_s = totals["loop_s"]
    lags = {}
    for m in steps:
        for key, count in m.items():
            if key.startswith("rollout/lag") and key.endswith("_groups"):
                j = int(key[len("rollout/lag") : -len("_groups")])
                lags[j] = lags.get(j, 0) + count
    first, last = summary["evals"][0], summary["evals"][-1]
    return {
        "k": k,
        "mode": "in-flight" if in_flight else "drain",
        "steps": len(steps),
        "token_lag": sum(m["rollout/token_lag_mean"] for m in steps) / len(steps),
        "mixed_rows": sum(m["rollout/mixed_version_rows"] for m in steps),
        "steps_per_min": 60 * len(steps) / loop_s,
        "loop_s": loop_s,
        "lags": dict(sorted(lags.items())),
        "lag_max": max(m["rollout/policy_lag_max"] for m in steps),
        "stale_dropped": totals.get("groups_dropped_stale", 0),
        "drawn": totals["groups_drawn"],
        "lenient": (first["eval/lenient"], last["eval/lenient"]),
        "strict": (first["eval/strict"], last["eval/strict"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=["drain", "in-flight"],
        default=["drain"],
        help="how pushes meet a round in flight (in-flight: k >= 1 only)",
    )
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_staleness"))
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    runs = [(k, mode == "in-flight") for mode in args.modes for k in args.ks if mode == "drain" or k >= 1]
    results = [run(k, in_flight, args, extra) for k, in_flight in runs]
    print_table(results, args.max_steps)
    print(f"wrote {write_result('staleness', {'max_steps': args.max_steps, 'extra_flags': extra, 'runs': results})}")


def print_table(results: list[dict], max_steps: int) -> None:
    print(f"\n== default job (DAPO), {max_steps} steps, max_staleness k ==")
    print(
        f"{'k':>2} {'push':>9} {'steps/min':>9} {'vs first':>8} {'loop s':>7} {'groups by lag (0,1,2..)':>24} "
        f"{'lag max':>7} {'token lag':>9} {'mixed rows':>10} {'stale dropped':>13} {'drawn':>6} "
        f"{'lenient before->after':>22} {'strict':>12}"
    )
    base = results[0]["steps_per_min"]
    for r in results:
        lags = ",".join(str(r["lags"].get(j, 0)) for j in range(max(r["lags"], default=0) + 1))
        print(
            f"{r['k']:>2} {r['mode']:>9} {r['steps_per_min']:>9.2f} {r['steps_per_min'] / base:>7.2f}x "
            f"{r['loop_s']:>7.0f} {lags:>24} {r['lag_max']:>7} {r['token_lag']:>9.3f} {r['mixed_rows']:>10} "
            f"{r['stale_dropped']:>13} {r['drawn']:>6} "
            f"{r['lenient'][0]:>10.3f} -> {r['lenient'][1]:.3f} {r['strict'][0]:>5.3f} -> {r['strict'][1]:.3f}"
        )


if __name__ == "__main__":
    main()
