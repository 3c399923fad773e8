"""On-policy distillation against DAPO on the default job (the default model and task, ``make run``'s), at equal
wall clock, in one invocation: first the teacher, the default job's DAPO run for ``--teacher-time-s`` seconds of loop
(its ``final/``; or ``--teacher PATH``, e.g. ``make run``'s ``final/``), then from the same embedded base model an OPD
run distilling from that teacher and a DAPO run, ``--time-limit-s`` seconds of loop each, one after the other,
through ``rl_example.py`` exactly as ``make run`` runs it but for the algorithm, the teacher and the limit.

Prints and writes (``benchmarks/results/distill.json``) per run: the steps trained, completions trained per second of
loop, the held-out accuracy before and after (lenient and strict) and its gain; for OPD the teacher's KL per token
over the first and last five steps; and the teacher's own held-out accuracy.

    python benchmarks/bench_distill.py [--teacher-time-s 600] [--time-limit-s 300] [--teacher PATH] [-- flags]
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

from benchmarks.bench_ppo import _mean, summarize  # noqa: E402
from benchmarks.results_file import write_result  # noqa: E402
from coati.distributed.driver.run_folder import run_of  # noqa: E402


def run(project: str, algo: str, seconds: float, args, flags: list[str]) -> Path:
    """One default-job run of ``algo`` for ``seconds`` of loop; its run folder."""
    cmd = [sys.executable, str(ROOT / "rl_example.py"), "--algo", algo, "--time-limit-s", str(seconds)]
    cmd += ["--max-steps", "1000", "--save-dir", args.out, "-p", project, "--overwrite", "--no-progress"]
    subprocess.run([*cmd, *flags], check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return Path(run_of(str(Path(args.out) / project)))


def teacher_kl(folder: Path) -> dict:
    """The teacher's KL per token over the first and last five steps of a distilling run, and every step's."""
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    kl = [m.get("teacher/kl") for m in lines if m["step"] > 0]
    match = [m.get("teacher/top1_match") for m in lines if m["step"] > 0]
    return {"kl_first5": _mean(kl[:5]), "kl_last5": _mean(kl[-5:]), "kl": kl, "top1_match": match}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher-time-s", type=float, default=600.0)
    parser.add_argument("--time-limit-s", type=float, default=300.0)
    parser.add_argument("--teacher", help="a trained teacher folder (default: train one here first)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_distill"))
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    teacher_row = None
    teacher = args.teacher
    if teacher is None:
        folder = run("distill-bench-teacher", "DAPO", args.teacher_time_s, args, extra)
        teacher, teacher_row = str(folder / "final"), summarize(folder, "DAPO (teacher)")
    opd = run("distill-bench-opd", "OPD", args.time_limit_s, args, ["--teacher-model", teacher, *extra])
    dapo = run("distill-bench-dapo", "DAPO", args.time_limit_s, args, extra)
    results = [{**summarize(opd, "OPD"), "teacher": teacher_kl(opd)}, summarize(dapo, "DAPO")]
    print(f"\n== default job, {args.time_limit_s:.0f} s of training loop each ==")
    if teacher_row:
        print(f"teacher: DAPO for {args.teacher_time_s:.0f} s, lenient {teacher_row['lenient'][1]:.3f}")
    for r in results:
        kl = r.get("teacher") or {}
        print(
            f"{r['algo']:>5} {r['steps']:>4} steps {r['completions_per_s']:.3f} completions/s, lenient "
            f"{r['lenient'][0]:.3f} -> {r['lenient'][1]:.3f} (gain {r['lenient_gain']:+.3f})"
            + (f", teacher KL {kl['kl_first5']:.3f} -> {kl['kl_last5']:.3f}" if kl else "")
        )
    result = {
        "time_limit_s": args.time_limit_s,
        "teacher_time_s": None if args.teacher else args.teacher_time_s,
        "teacher": teacher_row or {"path": teacher},
        "extra_flags": extra,
        "runs": results,
    }
    print(f"wrote {write_result('distill', result)}")


if __name__ == "__main__":
    main()
