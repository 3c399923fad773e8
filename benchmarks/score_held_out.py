"""Scores a coati run folder on the default job's held-out task with as many rows as bench_main_job_vs_trl.py uses:
each checkpoint the run kept (``--save-interval``, ``--keep-checkpoints``) and its final model, greedy, the lenient
check, printed with the loop seconds of the steps before it and the gain over the base model. For runs of the default
job with other settings (a flag changed, more steps), so that they compare with that benchmark's gains.

    python rl_example.py --algo DAPO --seed 0 --max-steps 60 --save-interval 10 --keep-checkpoints 6 -p long-0
    python benchmarks/score_held_out.py runs/long-0 [--eval-rows 480]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from bench_main_job_vs_trl import ROOT, checkpoint_model, evaluate, held_out_rows, loop_seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder with a final model (runs/NAME)")
    parser.add_argument("--eval-rows", type=int, default=480, help="held-out rows the models are scored on")
    args = parser.parse_args()
    if not (args.run / "final").is_dir():
        parser.error(f"{args.run} has no final model ({args.run / 'final'}); score a run that finished")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    from coati.default_model import default_model_path
    from coati.distributed.config.cli import parse_config

    job = parse_config([])
    held_out = held_out_rows(job, args.eval_rows)
    max_new_tokens, base = job.generation.max_new_tokens, default_model_path()
    before = evaluate(base, base, held_out, max_new_tokens)["lenient"]
    print(f"held-out greedy accuracy, lenient, {len(held_out)} rows; before training {before:.3f}")
    print(f"  {'step':>5}{'loop s':>8}{'after':>7}{'gain':>8}")
    seconds, steps = loop_seconds(args.run)
    kept = sorted(int(p.name.removeprefix("step-")) for p in (args.run / "checkpoints").glob("step-*"))
    with tempfile.TemporaryDirectory() as d:
        for n in [n for n in kept if n < steps]:
            after = evaluate(
                checkpoint_model(args.run, n, f"{d}/step-{n}"), str(args.run / "final"), held_out, max_new_tokens
            )["lenient"]
            print(f"  {n:>5}{loop_seconds(args.run, n)[0]:>8.0f}{after:>7.3f}{after - before:>+8.3f}", flush=True)
    after = evaluate(str(args.run / "final"), str(args.run / "final"), held_out, max_new_tokens)["lenient"]
    print(f"  {steps:>5}{seconds:>8.0f}{after:>7.3f}{after - before:>+8.3f}")


if __name__ == "__main__":
    main()
