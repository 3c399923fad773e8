"""The default job's held-out gain against TRL's GRPOTrainer on the same workload, at equal training wall-clock, over
several seeds and a held-out set large enough to tell the two apart.

For each seed, coati runs the default job (``rl_example.py --algo DAPO --seed S``, its folder ``runs/bench-main-job-S``,
replaced at each invocation unless ``--reuse``) and TRL trains SmolLM2-135M-Instruct on that run's training prompts
(reasoning-gym chain_sum, 2-3 terms, 1-2 digits; the rows and chat template the seed draws), 4 prompts x 4 completions
per step, 48 new tokens, temperature 1.0, the default job's constant learning rate, DAPO's loss (clip 0.2/0.28,
token-mean, no KL), with the last-number reward (benchmarks/shared_reward.py: the default job's lenient check;
``--trl-overlong`` adds DAPO's soft overlong punishment as the job shapes its reward, with TRL's own
``get_soft_overlong_punishment`` over the same last tokens of the budget and the same factor, which lowered TRL's gain
here), with the same seed, for the coati run's training-loop seconds (evaluations excluded on both sides; TRL's model is
saved after its first step past that mark, saving excluded). Then the base model, each coati run's final model and each
saved TRL model are scored by one evaluation: greedy, 48 new tokens, the lenient check, on ``--eval-rows`` held-out rows
drawn as the default job draws its 96 (the same task, seed 10000), the same rows for every seed. Printed: each seed's
gains, then their means with standard errors over seeds, and the ratio of the mean gains.

With ``--at-steps 10 20`` both sides are also scored part-way, as gain against time: the coati run checkpoints at those
steps (``--save-interval``; its folder ``runs/bench-main-job-curve-S``), its time at step N is the loop seconds of its
first N steps, and TRL saves its model after its first step past each of those times. A checkpoint first waits for the
rollout round in flight, outside any step's time, so coati's later marks gain up to one round's generation per
checkpoint: the printed waits (the round's end and the checkpoint's writing) bound that gain.

Writes ``benchmarks/results/main_job_vs_trl.json``.

    python benchmarks/bench_main_job_vs_trl.py [--seeds 0 1 2] [--eval-rows 480] [--trl-bf16] [--reuse]
        [--at-steps 10 20] [--trl-overlong] [--coati-flags "--skip-no-signal-after 0"]

``--coati-flags=...`` (with ``=`` when the flags start with a dash) runs the job with those flags of ``rl_example.py``
added (its folders get a suffix naming them), to compare a setting against TRL in the same invocation; TRL's side
reads the job's lr and budget from them too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_file import write_result  # noqa: E402


def evaluate(model_dir: str, tokenizer_dir: str, rows: list[dict], max_new_tokens: int, microbatch: int = 32) -> dict:
    """Greedy strict and lenient accuracy, as a producer's ``evaluate`` computes it (fp32, both cores)."""
    import torch
    from transformers import AutoTokenizer

    from coati.distributed.inference.config import GenerationConfig
    from coati.distributed.inference.transformers_backend import TransformersBackend
    from coati.distributed.reward.math_reward import math_reward
    from coati.distributed.rollout.data import encode_prompt, reward_fields

    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    backend = TransformersBackend(
        model_dir, GenerationConfig(max_new_tokens=max_new_tokens), device="cpu", tokenizer=tokenizer
    )
    strict = lenient = 0
    for lo in range(0, len(rows), microbatch):
        chunk = rows[lo : lo + microbatch]
        batch = backend.generate([encode_prompt(tokenizer, r) for r in chunk], 1, greedy=True)
        texts = [
            tokenizer.decode(batch.response_ids[i, : batch.response_lengths[i]].tolist(), skip_special_tokens=True)
            for i in range(len(batch))
        ]
        fields = [reward_fields(r) for r in chunk]
        for r in math_reward(texts, [f["gt_answer"] for f in fields], format_gate=False):
            strict += bool(r.answer_ok)
            lenient += bool(r.info.get("lenient_ok", r.answer_ok))
    return {"strict": strict / len(rows), "lenient": lenient / len(rows)}


def step_metrics(folder: Path) -> list[dict]:
    """The run's training steps' metrics (step 0, the evaluation before training, left out)."""
    return [m for m in map(json.loads, open(folder / "metrics.jsonl")) if m["step"] > 0]


def loop_seconds(folder: Path, upto: int | None = None) -> tuple[float, int]:
    """The run's training-loop seconds (evaluations excluded) and its training steps, from its metrics; with
    ``upto``, of its first ``upto`` steps."""
    steps = [m for m in step_metrics(folder) if m["step"] <= (upto or m["step"])]
    return sum(m["time/step"] for m in steps), len(steps)


def checkpoint_waits(folder: Path) -> list[float]:
    """Seconds between consecutive steps' metrics that no step's time covers (checkpoints, evaluations)."""
    steps = step_metrics(folder)
    return [b["time/elapsed"] - a["time/elapsed"] - b["time/step"] for a, b in zip(steps, steps[1:], strict=False)]


def checkpoint_model(folder: Path, step: int, into: str) -> str:
    """A loadable model folder for the run's checkpoint at ``step``: its weights beside the final model's config and
    tokenizer (a checkpoint holds the weights only)."""
    weights, final = folder / "checkpoints" / f"step-{step}" / "model", folder / "final"
    os.makedirs(into)
    for f in final.iterdir():
        if f.suffix not in (".safetensors", ".bin") and not f.name.endswith(".index.json"):
            os.symlink(f.resolve(), Path(into, f.name))
    for f in weights.iterdir():
        os.symlink(f.resolve(), Path(into, f.name))
    return into


def coati_project(seed: int, at_steps: list[int], flags: list[str]) -> str:
    """The run folder's name (under ``runs/``) of the default job with this seed and ``flags``."""
    suffix = "".join("-" + re.sub(r"[^A-Za-z0-9.]+", "", f) for f in flags)
    return (f"bench-main-job-curve-{seed}" if at_steps else f"bench-main-job-{seed}") + suffix


def coati_args(seed: int, at_steps: list[int], max_steps: int, flags: list[str]) -> list[str]:
    """``rl_example.py``'s arguments for the default job with this seed and ``flags``, checkpointing at ``at_steps``
    of its ``max_steps`` with every checkpoint kept. The run replaces its folder: the benchmark's own, left by an
    earlier invocation (``--reuse`` keeps it instead, without running)."""
    args = ["--algo", "DAPO", "--seed", str(seed), "-p", coati_project(seed, at_steps, flags), "--overwrite", *flags]
    if at_steps:
        interval = math.gcd(*at_steps)
        args += ["--save-interval", str(interval), "--keep-checkpoints", str(-(-max_steps // interval))]
    return args


def coati_run(seed: int, reuse: bool, at_steps: list[int], max_steps: int, flags: list[str]) -> Path:
    """The default job with this seed and ``flags`` (see ``coati_args``), run in a process of its own; its folder."""
    from coati.distributed.driver.run_folder import run_of

    project = ROOT / "runs" / coati_project(seed, at_steps, flags)
    if reuse and (Path(run_of(str(project))) / "final").is_dir():
        return Path(run_of(str(project)))
    cmd = [sys.executable, "rl_example.py", *coati_args(seed, at_steps, max_steps, flags)]
    print(f"  seed {seed}: {' '.join(cmd[1:])}", flush=True)
    out = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"coati run for seed {seed} failed:\n{out.stderr[-3000:]}")
    return Path(run_of(str(project)))  # the project's latest run: this one


def held_out_rows(job, size: int) -> list[dict]:
    """``size`` rows of the default job's held-out task, drawn as it draws its own."""
    import dataclasses

    _, spec = job.data.datasets(job.run.seed)
    return dataclasses.replace(spec, size=size).load()


def ratio(coati: float, trl: float) -> str:
    """coati's gain over TRL's, or n/a where TRL's is not above zero (no ratio to a loss or to nothing)."""
    return f"{coati / trl:.2f}x" if trl > 0 else "n/a"


def mean_se(xs: list[float]) -> str:
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return f"{statistics.mean(xs):+.3f} (SE {se:.3f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one coati and one TRL run each")
    parser.add_argument("--eval-rows", type=int, default=480, help="held-out rows every model is scored on")
    parser.add_argument("--trl-bf16", action="store_true", help="TRL with bf16=True (CPU autocast)")
    parser.add_argument(
        "--trl-overlong",
        action="store_true",
        help="TRL's reward plus the job's soft overlong punishment (its shaped reward exactly)",
    )
    parser.add_argument("--reuse", action="store_true", help="keep a seed's coati run folder that has a final model")
    parser.add_argument(
        "--at-steps",
        type=int,
        nargs="+",
        default=[],
        help="also score both sides at coati's loop time of these steps (gain against time)",
    )
    parser.add_argument(
        "--coati-flags",
        default="",
        help="rl_example.py flags added to the job, e.g. '--skip-no-signal-after 0' (checked before anything runs)",
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    from bench_vs_trl import run_trl, trl_python

    from coati.default_model import default_model_path
    from coati.distributed.config.cli import parse_config

    flags = shlex.split(args.coati_flags)
    try:
        job = parse_config(["--algo", "DAPO", *flags])  # the default job's config tree, with the flags
        algorithm = job.algo_config  # the preset with the job's overrides
    except SystemExit:  # the job's parser has printed why
        parser.error(f"--coati-flags {args.coati_flags!r}: refused by rl_example.py's parser (the error above)")
    except ValueError as e:
        parser.error(f"--coati-flags {args.coati_flags!r}: {e}")
    model, python = default_model_path(), trl_python()
    max_new_tokens, lr = job.generation.max_new_tokens, job.consumer.learning_rate
    buffer = algorithm.overlong_buffer_len(max_new_tokens)
    if args.trl_overlong and not buffer:
        parser.error(f"--trl-overlong: the {job.algo} job shapes no length (overlong_buffer_ratio 0)")
    overlong = (buffer, algorithm.overlong_penalty_factor) if args.trl_overlong else None
    held_out = held_out_rows(job, args.eval_rows)
    shaping = f"soft overlong punishment over the last {overlong[0]} tokens, x{overlong[1]}" if overlong else "none"
    print(
        f"workload: {job.data.train}, {max_new_tokens} new tokens, lr {lr}; {len(held_out)} held-out rows; TRL "
        f"{'bf16' if args.trl_bf16 else 'fp32'}, length shaping {shaping}; seeds {args.seeds}"
        f"{'; coati flags ' + args.coati_flags if flags else ''}",
        flush=True,
    )
    bad = [n for n in args.at_steps if not 0 < n < job.run.max_steps]
    if bad:
        parser.error(f"--at-steps {bad}: each must lie between 1 and the job's {job.run.max_steps - 1}th step")
    before = evaluate(model, model, held_out, max_new_tokens)["lenient"]
    rows, marks = [], []
    for seed in args.seeds:
        folder = coati_run(seed, args.reuse, sorted(args.at_steps), job.run.max_steps, flags)
        seconds, steps = loop_seconds(folder)
        times = [loop_seconds(folder, n)[0] for n in sorted(args.at_steps)]
        train_spec, _ = job.data.datasets(seed)
        train = train_spec.load()
        with tempfile.TemporaryDirectory() as d:
            print(f"  seed {seed}: TRL for {seconds:.0f} s of training", flush=True)
            trl = run_trl(
                python,
                model,
                train,
                10**4,
                max_new_tokens,
                lr,
                threads=2,
                bf16=args.trl_bf16,
                max_seconds=seconds,
                save_at=[*times, seconds],
                save_dir=d,
                seed=seed,
                overlong=overlong,
            )
            *part, save = trl["saves"]
            trl_at = [evaluate(p["path"], model, held_out, max_new_tokens)["lenient"] for p in part]
            trl_after = evaluate(save["path"], model, held_out, max_new_tokens)["lenient"]
            coati_at = [
                evaluate(checkpoint_model(folder, n, f"{d}/coati-{n}"), model, held_out, max_new_tokens)["lenient"]
                for n in sorted(args.at_steps)
            ]
        coati_after = evaluate(str(folder / "final"), str(folder / "final"), held_out, max_new_tokens)["lenient"]
        rows.append(
            {"seed": seed, "coati": (seconds, steps, coati_after), "trl": (save["seconds"], save["steps"], trl_after)}
        )
        waits = checkpoint_waits(folder)
        marks.append(
            [
                {"step": n, "coati": (t, n, c, waits[n - 1]), "trl": (p["seconds"], p["steps"], a)}
                for n, t, c, p, a in zip(sorted(args.at_steps), times, coati_at, part, trl_at, strict=True)
            ]
        )
    after = statistics.mean(r[side][2] for r in rows for side in ("coati", "trl"))
    se_item = math.sqrt(after * (1 - after) / len(held_out))
    print(
        f"held-out greedy accuracy, lenient, {len(held_out)} rows (an "
        f"accuracy near {after:.2f} has a standard error of {se_item:.3f}); "
        f"before training {before:.3f}"
    )
    print(
        f"  {'seed':>4}  {'coati s':>8}{'steps':>6}{'after':>7}{'gain':>7}   {'TRL s':>6}{'steps':>6}{'after':>7}"
        f"{'gain':>7}   {'gain ratio':>10}"
    )
    gains = {"coati": [], "trl": []}
    for r in rows:
        line = f"  {r['seed']:>4}"
        for side in ("coati", "trl"):
            seconds, steps, after = r[side]
            gains[side].append(after - before)
            line += f"  {seconds:>8.0f}{steps:>6}{after:>7.3f}{after - before:>+7.3f} "
        print(f"{line}  {ratio(gains['coati'][-1], gains['trl'][-1]):>10}")
    ratio_of_means = ratio(statistics.mean(gains["coati"]), statistics.mean(gains["trl"]))
    print(
        f"mean gain over {len(rows)} seeds: coati {mean_se(gains['coati'])}, TRL {mean_se(gains['trl'])}; "
        f"ratio of mean gains {ratio_of_means} (target: >= 2x at equal training time)"
    )
    if args.at_steps:
        print_curve(marks, rows, gains, before)
    result = {
        "held_out_rows": len(held_out),
        "before": before,
        "seeds": rows,
        "marks": marks,
        "mean_gain": {side: statistics.mean(g) for side, g in gains.items()},
        "ratio_of_mean_gains": ratio_of_means,
        "coati_flags": flags,
        "trl": {"bf16": args.trl_bf16, "overlong": overlong},
    }
    print(f"wrote {write_result('main_job_vs_trl', result)}")


def print_curve(marks: list[list[dict]], rows: list[dict], gains: dict, before: float) -> None:
    """Both sides' mean gain at each mark (coati's loop time at that step; TRL's first step past it), then at the
    end."""
    print("gain against time (means over seeds; coati's checkpoint wait: seconds outside any step after that step)")
    print(
        f"  {'coati step':>10}{'coati s':>9}{'wait s':>8}{'gain':>8}   {'TRL s':>7}{'steps':>7}{'gain':>8}   "
        f"{'gain ratio':>10}"
    )
    for i in range(len(marks[0])):
        at = [seed[i] for seed in marks]
        c, t = [m["coati"][2] - before for m in at], [m["trl"][2] - before for m in at]
        mean = statistics.mean
        print(
            f"  {at[0]['step']:>10}{mean([m['coati'][0] for m in at]):>9.0f}{mean([m['coati'][3] for m in at]):>8.1f}"
            f"{mean(c):>+8.3f}   {mean([m['trl'][0] for m in at]):>7.0f}{mean([m['trl'][1] for m in at]):>7.1f}"
            f"{mean(t):>+8.3f}   {ratio(mean(c), mean(t)):>10}"
        )
    seconds = statistics.mean(r["coati"][0] for r in rows)
    trl_s, trl_steps = (statistics.mean(r["trl"][i] for r in rows) for i in (0, 1))
    print(
        f"  {rows[0]['coati'][1]:>10}{seconds:>9.0f}{'':>8}{statistics.mean(gains['coati']):>+8.3f}   {trl_s:>7.0f}"
        f"{trl_steps:>7.1f}{statistics.mean(gains['trl']):>+8.3f}   "
        f"{ratio(statistics.mean(gains['coati']), statistics.mean(gains['trl'])):>10}"
    )


if __name__ == "__main__":
    main()
