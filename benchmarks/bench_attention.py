"""Attention on this CPU, side by side: transformers' SDPA attention (torch's fused CPU kernel) against coati's
(``coati/distributed/model/attention.py``: bf16 matmuls into an additive mask). First as the trainer runs it: forward
and
backward of one layer under bf16 autocast on packed micro-batches as the trainer builds them (4 groups, each a prompt
of 50-53 tokens then its 4 samples' responses one after the other, under the tree mask: a response token sees the
prompt and its own response), rows of 142 tokens (the default job late in a run) to 1,200 (past ``MAX_SCORES``,
where coati's falls back to SDPA), SmolLM2-135M's heads (9 query heads of 64, 3 key/value heads): each one's
milliseconds, the ratio, the largest difference between their outputs and the path coati's took. Then as the
transformers backend generates: one decode step's attention (one query per row against a cache of 60-100 keys, left
padding masked, bf16, no gradient).

Writes ``benchmarks/results/attention.json``.

    python benchmarks/bench_attention.py [--threads 1] [--widths 142 300 600 1200]
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result


def packed_mask(groups: int, width: int, seed: int = 0):
    """A boolean [groups, 1, width, width] tree mask: prompt, then responses of random lengths, padding at the end."""
    import torch

    g = torch.Generator().manual_seed(seed)
    seg = torch.full((groups, width), -2)
    for i in range(groups):
        prompt = 50 + i
        seg[i, :prompt] = -1
        at, j = prompt, 0
        while at < width - 5 * (i + 1):
            r = min(int(torch.randint(4, max(5, width // 6), (), generator=g)), width - at)
            seg[i, at : at + r], at, j = j % 4, at + r, j + 1
    ar = torch.arange(width)
    q, k = seg[:, :, None], seg[:, None, :]
    mask = (ar[:, None] >= ar[None, :]) & ((k == -1) | (q == k)) & (k != -2)
    return (mask | torch.eye(width, dtype=torch.bool))[:, None]


def timed(fn, q, k, v, mask, repeats: int) -> tuple[float, object]:
    import torch

    def once():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = fn(types.SimpleNamespace(num_key_value_groups=3, is_causal=True), q, k, v, mask)
        out.float().sum().backward()
        return out

    for _ in range(2):
        out = once()
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    return (time.perf_counter() - start) / repeats, out.detach().float()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--widths", type=int, nargs="+", default=[142, 300, 600, 1200])
    args = parser.parse_args()
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from coati.distributed.model import attention

    torch.set_num_threads(args.threads)
    groups, heads, kv_heads, dim = 4, 9, 3, 64
    print(
        f"one layer's attention, forward + backward, bf16 autocast, {groups} packed groups, {heads} heads "
        f"({kv_heads} key/value) of {dim}, {args.threads} thread(s)"
    )
    print(f"{'row tokens':>10} {'SDPA ms':>9} {'coati ms':>9} {'speed-up':>9} {'max |diff|':>11}  coati's path")
    training = []
    for width in args.widths:
        g = torch.Generator().manual_seed(width)
        # Queries and keys in fp32, values in bf16: what the rotary embedding leaves under autocast.
        q = torch.randn(groups, heads, width, dim, generator=g).requires_grad_()
        k = torch.randn(groups, kv_heads, width, dim, generator=g).requires_grad_()
        v = torch.randn(groups, kv_heads, width, dim, generator=g).bfloat16().requires_grad_()
        mask = packed_mask(groups, width)
        repeats = max(2, int(4e5 // width**2))
        sdpa, want = timed(sdpa_attention_forward, q, k, v, mask, repeats)
        ours, got = timed(attention.attention, q, k, v, mask, repeats)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            path = "bf16 matmuls" if attention.takes_bf16_path(q, k, mask, 0.0, False) else "SDPA (too many scores)"
        diff = float((got - want).abs().max())
        print(f"{width:>10} {1e3 * sdpa:>9.2f} {1e3 * ours:>9.2f} {sdpa / ours:>8.2f}x {diff:>11.4f}  {path}")
        training.append(
            {
                "row_tokens": width,
                "sdpa_ms": 1e3 * sdpa,
                "coati_ms": 1e3 * ours,
                "speedup": sdpa / ours,
                "max_abs_diff": diff,
                "path": path,
            }
        )
    result = {
        "threads": args.threads,
        "shape": {"groups": groups, "heads": heads, "kv_heads": kv_heads, "head_dim": dim},
        "training_forward_backward": training,
        "decode_step": decode_steps(heads, kv_heads, dim),
    }
    print(f"wrote {write_result('attention', result)}")


def decode_steps(heads: int, kv_heads: int, dim: int) -> list[dict]:
    """One decode step's attention as the transformers backend runs it with bf16 weights: one query per row against
    the row's cache, left padding masked, no gradient."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from coati.distributed.model import attention

    print("one layer's attention in a decode step, bf16, no gradient, microseconds per call")
    print(f"{'rows':>10} {'keys':>9} {'SDPA us':>9} {'coati us':>9} {'speed-up':>9}")
    out = []
    layer = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    for rows, keys in ((16, 60), (16, 100), (32, 100)):
        g = torch.Generator().manual_seed(rows * keys)
        q = torch.randn(rows, heads, 1, dim, generator=g).bfloat16()
        k, v = (torch.randn(rows, kv_heads, keys, dim, generator=g).bfloat16() for _ in range(2))
        mask = torch.ones(rows, 1, 1, keys, dtype=torch.bool)
        mask[:, :, :, :5] = False
        micros = []
        with torch.no_grad():
            for fn in (sdpa_attention_forward, attention.attention):
                for _ in range(5):
                    fn(layer, q, k, v, mask)
                start = time.perf_counter()
                for _ in range(200):
                    fn(layer, q, k, v, mask)
                micros.append((time.perf_counter() - start) / 200 * 1e6)
        print(f"{rows:>10} {keys:>9} {micros[0]:>9.0f} {micros[1]:>9.0f} {micros[0] / micros[1]:>8.2f}x")
        out.append(
            {"rows": rows, "keys": keys, "sdpa_us": micros[0], "coati_us": micros[1], "speedup": micros[0] / micros[1]}
        )
    return out


if __name__ == "__main__":
    main()
