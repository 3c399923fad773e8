"""Generated tokens/s of the transformers backend on this machine, for a tiny model and a 135M-parameter Llama
(SmolLM2-135M's shape, random weights: speed does not depend on the values). Sampling, KV cache, 1 thread per
process as in a producer actor.

    python benchmarks/bench_rollout.py [--prompts 8] [--n 4] [--new-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from coati.distributed.config import GenerationConfig
from coati.distributed.inference.transformers_backend import TransformersBackend
from coati.models import build_tiny_model, char_tokenizer


def smollm2_shaped(vocab: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=2048, tie_word_embeddings=True, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


def measure(backend, prompts, n, reps=2):
    backend.generate(prompts[:1], n=1)  # warm-up
    best = None
    for _ in range(reps):
        start = time.perf_counter()
        batch = backend.generate(prompts, n=n)
        secs = time.perf_counter() - start
        tokens = int(batch.response_lengths.sum())
        best = max(best or 0, tokens / secs)
    return best, tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = GenerationConfig(max_new_tokens=args.new_tokens, temperature=1.0)
    tok = char_tokenizer()
    prompts = [tok(f"Question {i}: what is {i} + {i}?")["input_ids"] for i in range(args.prompts)]
    print(f"{args.prompts} prompts x {args.n} samples x up to {args.new_tokens} new tokens, {args.threads} thread(s)")
    with tempfile.TemporaryDirectory() as d:
        for label, kwargs in (("tiny (~0.1M)", {}), ("small (~3M)", {"hidden_size": 256, "num_layers": 4})):
            path = build_tiny_model(f"{d}/{label[:4]}", **kwargs)
            backend = TransformersBackend(path, gen)
            params = sum(p.numel() for p in backend.model.parameters())
            rate, tokens = measure(backend, prompts, args.n)
            print(f"{label:<22}{params / 1e6:>8.2f}M params {rate:>9.0f} tokens/s ({tokens} tokens)")
        model = smollm2_shaped(49152)  # SmolLM2's vocabulary; prompts use the char tokenizer's ids (all < 49152)
        backend = TransformersBackend(d, gen, model=model, tokenizer=tok)
        params = sum(p.numel() for p in backend.model.parameters())
        rate, tokens = measure(backend, prompts, args.n, reps=1)
        print(f"{'SmolLM2-135M-shaped':<22}{params / 1e6:>8.2f}M params {rate:>9.0f} tokens/s ({tokens} tokens)")


if __name__ == "__main__":
    main()
