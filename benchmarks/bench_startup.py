"""Time to the first training step, coati against TRL, side by side in one run on the default job's workload.

coati: the default job (``rl_example.py --algo DAPO``, one step), its start-up account from the run's
``summary.json`` (each phase's time from the command, and the first step's end), twice: evaluating the base model
before training (``--no-eval-cache``, a first run), then as a later run does, taking that evaluation from the cache
when an earlier run of this code left it there (the file says whether it did), and that later run again on the
transformers engine (``-b transformers``: the same run without vLLM's import and engine start), and as GRPO drawing one
round of the 4 prompts it trains (TRL's first step's workload: DAPO's first step draws rounds until four groups carry
signal). Each run's account holds its actors' own marks (imports, engine build, ready). TRL: GRPOTrainer on the same
model, rows, 4 prompts x 4 completions, new tokens and learning rate, one step, in a subprocess of its own
(``trl_side.py``), from the command to the end of its first optimizer step. The default model is converted before
either runs, so neither pays the conversion. Writes ``benchmarks/results/startup.json``.

    python benchmarks/bench_startup.py [--repeats 1]
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
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from benchmarks.results_file import write_result  # noqa: E402

GRPO_AS_TRL = ["--algo", "GRPO", "-ibs", "4", "-imbs", "4"]
"""TRL's first step's workload: GRPO (no dynamic sampling) drawing one round of 4 prompts x 4 completions, the
groups it trains"""


def coati_first_step(out_dir: str, flags: list[str]) -> dict:
    """One step of the default job from a fresh process: its start-up phases and first step (from its summary),
    whether its evaluation before training came from the cache, and the command's whole time."""
    cmd = [sys.executable, str(ROOT / "rl_example.py"), "--algo", "DAPO", "--max-steps", "1", "--no-progress"]
    cmd += ["--save-dir", out_dir, "-p", "startup", "--overwrite", *flags]
    begun = time.time()
    subprocess.run(cmd, check=True, cwd=out_dir, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.time() - begun
    from coati.distributed.driver.run_folder import run_of

    summary = json.loads((Path(run_of(str(Path(out_dir) / "startup"))) / "summary.json").read_text())
    return {
        "first_step_s": summary["startup"]["first_step_s"],
        "phases": summary["startup"]["phases"],
        "actors": summary["startup"]["actors"],
        "eval_cached": bool(summary["evals"][0].get("eval/cached")),
        "wall_s": wall,
    }


def trl_first_step(job, bf16: bool) -> dict:
    """One GRPOTrainer step on the default job's workload, from the command to the end of its first optimizer step."""
    from bench_vs_trl import run_trl, trl_python

    from coati.default_model import default_model_path

    rows = job.data.datasets(job.run.seed)[0].load()
    begun = time.time()
    out = run_trl(
        trl_python(),
        default_model_path(),
        rows,
        1,
        job.generation.max_new_tokens,
        job.consumer.learning_rate,
        threads=len(os.sched_getaffinity(0)),
        bf16=bf16,
        seed=job.run.seed,
    )
    return {"first_step_s": out["first_step_at"] - begun, "wall_s": time.time() - begun, "bf16": bf16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side, alternating")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from coati.default_model import default_model_path
    from coati.distributed.config.cli import parse_config
    from coati.distributed.model.precision import native_bf16

    default_model_path()  # converted once, before either side is timed
    job = parse_config(["--algo", "DAPO"])
    bf16 = native_bf16(torch.device("cpu"))  # as coati's auto precision decides
    runs = []
    for i in range(args.repeats):
        coati = {}
        cases = (
            ("evaluating", ["--no-eval-cache"]),
            ("later_run", []),
            ("later_run_transformers", ["-b", "transformers"]),
            ("later_run_grpo_4_prompts", GRPO_AS_TRL),
        )
        for name, flags in cases:
            with tempfile.TemporaryDirectory() as d:
                coati[name] = coati_first_step(d, flags)
        trl = trl_first_step(job, bf16)
        runs.append({"coati": coati, "trl": trl})
        print(f"run {i}: time to the first step, TRL {trl['first_step_s']:.1f} s ({'bf16' if bf16 else 'fp32'})")
        for name, c in coati.items():
            print(
                f"  coati ({name}; evaluation before training {'from the cache' if c['eval_cached'] else 'run'}) "
                f"{c['first_step_s']:.1f} s, {c['first_step_s'] / trl['first_step_s']:.2f}x TRL's"
            )
            for p in c["phases"]:
                print(f"    {p['at_s']:7.1f} s  {p['phase']}")
            for a in c["actors"]:
                print(
                    f"    {a['actor']}: process {a['process_at_s']:.1f} s, imports {a['imports_s']:.1f} s, engine "
                    f"{a['engine_s']:.1f} s, ready {a['ready_at_s']:.1f} s"
                )
        sys.stdout.flush()
    print(f"wrote {write_result('startup', {'runs': runs})}")


if __name__ == "__main__":
    main()
