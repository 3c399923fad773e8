"""How a transformers producer should apply a LoRA push: merged into its weights (what coati does: W = W0 + s B A from a
kept copy of W0) or served through peft's LoRA layers (x W0 + s (x A) B at every step). Side by side in one process, one
thread, on the default model (SmolLM2-135M-Instruct) with a random adapter on all seven linear layers of every block,
prompts of the default task: the time to apply a push and the generation speed afterwards (same prompts, samples and
token budget; best of ``--reps`` timed calls after a warm-up), in each weight dtype. Writes
``benchmarks/results/lora_apply.json``.

    python benchmarks/bench_lora_apply.py [--rank 16] [--prompts 8] [--n 4] [--new-tokens 64]
        [--dtypes bfloat16,float32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result
from coati.distributed.config.tree import DEFAULT_TASK

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def random_adapter(model, rank: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Wire-named A [r, in] and B [out, r] for every target linear layer (B non-zero, so the adapter matters)."""
    gen = torch.Generator().manual_seed(0)
    adapter = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
            out_f, in_f = module.weight.shape
            adapter[f"{name}.lora_A.weight"] = (torch.randn(rank, in_f, generator=gen) / in_f**0.5).to(dtype)
            adapter[f"{name}.lora_B.weight"] = (torch.randn(out_f, rank, generator=gen) * 1e-3).to(dtype)
    return adapter


def best_rate(backend, prompts, n: int, reps: int) -> float:
    backend.generate(prompts[:2], n=2)  # warm-up
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        batch = backend.generate(prompts, n=n)
        best = max(best, int(batch.response_lengths.sum()) / (time.perf_counter() - start))
    return best


def timed(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(dtype_name: str, args) -> dict:
    from peft import get_peft_model

    from coati.default_model import default_model_path
    from coati.distributed.inference import backend_class
    from coati.distributed.inference.config import GenerationConfig
    from coati.distributed.model.lora import adapter_tensors, peft_config
    from coati.distributed.rollout.data import encode_prompt, load_rows

    dtype = getattr(torch, dtype_name)
    gen = GenerationConfig(max_new_tokens=args.new_tokens, temperature=1.0, max_prompt_tokens=256)
    backend = backend_class("transformers")(default_model_path(), gen, dtype=dtype_name, seed=0)
    prompts = [encode_prompt(backend.tokenizer, r) for r in load_rows(args.task, size=args.prompts, seed=1)]
    adapter = random_adapter(backend.model, args.rank, dtype)
    scale = 2.0
    merge_s = timed(lambda: backend.load_adapter(adapter, scale))
    merged = best_rate(backend, prompts, args.n, args.reps)
    # peft's layers over the same base weights (the merge undone: the kept base copies written back).
    with torch.no_grad():
        for name, base in backend._lora_base.items():
            backend._state[name].data.copy_(base)
    model = get_peft_model(backend.model, peft_config(args.rank, scale * args.rank, 0.0, TARGETS)).to(dtype)
    params = adapter_tensors(dict(model.named_parameters()))
    assert set(params) == set(adapter), "peft's adapter names differ from the wire's"

    def load_peft():
        with torch.no_grad():
            for name, tensor in adapter.items():
                params[name].copy_(tensor)

    peft_s = timed(load_peft)
    peft = best_rate(backend, prompts, args.n, args.reps)
    return {"dtype": dtype_name, "merge_s": merge_s, "peft_s": peft_s, "merged_tok_s": merged, "peft_tok_s": peft}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--task", default=DEFAULT_TASK)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"rank {args.rank} on {', '.join(TARGETS)}; {args.prompts} prompts x {args.n} samples x {args.new_tokens} "
        "tokens; 1 thread"
    )
    print(
        "| weights | apply a push: merge | apply a push: peft | generate merged tok/s | generate peft tok/s | "
        "peft / merged |\n|---|---|---|---|---|---|"
    )
    rows = []
    for dtype in args.dtypes.split(","):
        r = measure(dtype, args)
        print(
            f"| {r['dtype']} | {r['merge_s']:.3f} s | {r['peft_s']:.3f} s | {r['merged_tok_s']:.1f} | "
            f"{r['peft_tok_s']:.1f} | {r['peft_tok_s'] / r['merged_tok_s']:.2f}x |",
            flush=True,
        )
        rows.append({**r, "peft_over_merged": r["peft_tok_s"] / r["merged_tok_s"]})
    settings = {k: getattr(args, k) for k in ("rank", "prompts", "n", "new_tokens", "reps", "task")}
    print(f"wrote {write_result('lora_apply', {'settings': settings, 'dtypes': rows})}")


if __name__ == "__main__":
    main()
