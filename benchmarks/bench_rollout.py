"""Rollout speed of the transformers and vLLM backends side by side, on the default model (SmolLM2-135M-Instruct,
converted from the GGUF) and the default task's prompts: same prompts, same samples per prompt, same token budget,
same sampling settings, 1 thread, each backend in a fresh process of its own (as in a producer actor). Reports
generated tokens/s (the best of ``--reps`` timed calls after a warm-up call) and the ratio vLLM / transformers. vLLM
runs once per KV-cache block size in ``--vllm-block-sizes`` (the first is coati's default on CPU; the samples of a
prompt share its full blocks through the prefix cache), the same seed each time, so each draws the same tokens. The
transformers backend runs once per attention in ``--transformers-attentions``: coati's CPU attention (its default on a
CPU; bf16 matmuls instead of torch's fused kernel in bf16) and transformers' SDPA. At the first block size vLLM's
engine also switches between the samplers in ``--vllm-samplers`` (coati's inverse-CDF draw, its default on a CPU, and
vLLM's own Gumbel-max kernel) call by call, in alternating order, ``--reps`` calls each in the one engine, and
reports each sampler's tokens over its seconds summed over those calls (they draw other tokens, so their counts
differ; and a few percent between two processes is within this machine's noise, hence one engine). With
``--vllm-compile on,off`` vLLM also runs at the first block size with torch.compile disabled in its process (vLLM's
CPU sampler compiles two helpers at its first step; the test suite runs with them eager): the first call's seconds
show the compile, the timed calls what it buys.

Writes ``benchmarks/results/rollout.json``.

    python benchmarks/bench_rollout.py [--prompts 8] [--n 4] [--new-tokens 64] [--dtypes float32,bfloat16]
        [--vllm-block-sizes 32,128] [--vllm-samplers inverse_cdf,vllm] [--transformers-attentions coati_sdpa,sdpa]
        [--vllm-compile on,off]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result


def run_backend(name: str, dtype: str, options: dict, args: dict, queue) -> None:
    """In a spawned process: load the backend, warm up, time ``reps`` calls; put (load s, warm-up s, best tokens/s,
    tokens). With ``samplers`` (vLLM), then put {sampler: (tokens/s, tokens)} over ``reps`` calls each, interleaved."""
    import torch

    torch.set_num_threads(1)
    if not options.pop("compile", True):
        import torch._dynamo

        torch._dynamo.config.disable = True
    from coati.default_model import default_model_path
    from coati.distributed.inference import backend_class
    from coati.distributed.inference.config import GenerationConfig
    from coati.distributed.rollout.data import encode_prompt, load_rows

    path = default_model_path()
    gen = GenerationConfig(max_new_tokens=args["new_tokens"], temperature=1.0, max_prompt_tokens=256)
    start = time.perf_counter()
    attn = options.pop("attention", None)
    samplers = options.pop("samplers", None)
    backend = backend_class(name)(path, gen, dtype=dtype, seed=0, **options)
    if attn:  # the transformers backend switches to coati's CPU attention itself; "sdpa" switches it back
        backend.model.set_attn_implementation(attn)
    load_s = time.perf_counter() - start
    if args["task"] == "random":  # 50 random token ids each: no row stops before the token budget
        ids = torch.randint(100, 20_000, (args["prompts"], 50), generator=torch.Generator().manual_seed(1))
        prompts = ids.tolist()
    else:
        prompts = [encode_prompt(backend.tokenizer, r) for r in load_rows(args["task"], size=args["prompts"], seed=1)]
    start = time.perf_counter()
    backend.generate(prompts[:2], n=2)  # warm-up
    warm_s = time.perf_counter() - start
    torch.manual_seed(0)  # the transformers backend samples from torch's RNG: each of its runs draws alike
    best, tokens = 0.0, 0
    for _ in range(args["reps"]):
        t0 = time.perf_counter()
        batch = backend.generate(prompts, n=args["n"])
        secs = time.perf_counter() - t0
        if int(batch.response_lengths.sum()) / secs > best:
            best, tokens = int(batch.response_lengths.sum()) / secs, int(batch.response_lengths.sum())
    queue.put((load_s, warm_s, best, tokens))
    if samplers:
        totals = {s: [0.0, 0] for s in samplers}
        for rep in range(args["reps"]):
            for sampler in samplers if rep % 2 == 0 else samplers[::-1]:
                backend.llm.collective_rpc("use_sampler", args=(sampler,))
                t0 = time.perf_counter()
                batch = backend.generate(prompts, n=args["n"])
                totals[sampler][0] += time.perf_counter() - t0
                totals[sampler][1] += int(batch.response_lengths.sum())
        queue.put({s: (n / secs, n) for s, (secs, n) in totals.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument(
        "--task",
        default="reasoning_gym:chain_sum",
        help="prompts' task; 'random': random token ids, every row running to the token budget",
    )
    parser.add_argument("--vllm-block-sizes", default="32,128", help="KV-cache block sizes vLLM runs with")
    parser.add_argument(
        "--vllm-samplers",
        default="inverse_cdf,vllm",
        help="samplers vLLM runs with at the first block size (the first also at the others)",
    )
    parser.add_argument(
        "--transformers-attentions",
        default="coati_sdpa,sdpa",
        help="attentions the transformers backend runs with (coati's CPU attention, the backend's "
        "default on CPU; transformers' SDPA)",
    )
    parser.add_argument(
        "--vllm-compile", default="on", help="on,off: vLLM at the first block size also without torch.compile"
    )
    args = parser.parse_args()
    if args.vllm_compile not in ("on", "on,off"):
        parser.error(f"--vllm-compile takes on or on,off, got {args.vllm_compile!r}")
    eager = args.vllm_compile == "on,off"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["OMP_NUM_THREADS"] = "1"
    settings = {
        "prompts": args.prompts,
        "n": args.n,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "task": args.task,
    }
    print(
        f"SmolLM2-135M-Instruct, {args.task}: {args.prompts} prompts x {args.n} samples x up to {args.new_tokens} "
        f"new tokens, temperature 1.0, 1 thread, best of {args.reps}"
    )
    ctx = mp.get_context("spawn")
    blocks = [int(b) for b in args.vllm_block_sizes.split(",")]
    attentions = args.transformers_attentions.split(",")
    samplers = args.vllm_samplers.split(",")
    runs = (
        [("transformers", {"attention": a}) for a in attentions]
        + [
            ("vllm", {"block_size": b, "sampler": samplers[0], **({"samplers": samplers} if i == 0 else {})})
            for i, b in enumerate(blocks)
        ]
        + [("vllm", {"block_size": blocks[0], "sampler": samplers[0], "compile": False})] * eager
    )
    result = {"settings": settings, "dtypes": {}}
    for dtype in args.dtypes.split(","):
        rates, loads = {}, {}
        for name, options in runs:
            queue = ctx.Queue()
            proc = ctx.Process(target=run_backend, args=(name, dtype, options, settings, queue))
            proc.start()
            proc.join()
            if proc.exitcode != 0:
                raise SystemExit(f"the {name} run failed (exit code {proc.exitcode}); its error is above")
            load_s, warm_s, rate, tokens = queue.get()
            label = f"vllm {options['block_size']}" if name == "vllm" else f"{name} {options['attention']}"
            label += " eager" if options.get("compile") is False else ""
            rates[label], loads[label] = rate, {"load_s": load_s, "first_call_s": warm_s, "tokens": tokens}
            print(
                f"{label:<25}{dtype:<10} load {load_s:6.1f} s  first call {warm_s:5.1f} s  {rate:8.1f} tokens/s  "
                f"({tokens} tokens)",
                flush=True,
            )
            if "samplers" in options:
                for sampler, (rate, tokens) in queue.get().items():
                    rates[f"sampler {sampler}"] = rate
                    print(
                        f"{label + ' ' + sampler:<25}{dtype:<10} {args.reps} calls interleaved {rate:8.1f} "
                        f"tokens/s  ({tokens} tokens)",
                        flush=True,
                    )
        first, hf = f"vllm {blocks[0]}", f"transformers {attentions[0]}"
        print(
            f"{'':<25}{dtype:<10} vLLM (block {blocks[0]}) / transformers ({attentions[0]}): "
            f"{rates[first] / rates[hf]:.2f}x"
            + "".join(f"; {attentions[0]} / {a}: {rates[hf] / rates[f'transformers {a}']:.2f}x" for a in attentions[1:])
            + "".join(f"; block {blocks[0]} / block {b}: {rates[first] / rates[f'vllm {b}']:.2f}x" for b in blocks[1:])
            + "".join(
                f"; {samplers[0]} / {s}: {rates[f'sampler {samplers[0]}'] / rates[f'sampler {s}']:.2f}x"
                for s in samplers[1:]
            )
            + (
                f"; compiled / eager: {rates[first] / rates[first + ' eager']:.2f}x"
                if first + " eager" in rates
                else ""
            ),
            flush=True,
        )
        result["dtypes"][dtype] = {"tokens_per_s": rates, "runs": loads}
    print(f"wrote {write_result('rollout', result)}")


if __name__ == "__main__":
    main()
