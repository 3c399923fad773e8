"""Small models and tokenizers built locally, for tests, examples and benchmarks (no hub access needed).

``build_tiny_model(path)`` writes a Hugging Face folder (config, weights, tokenizer with a chat template) holding a
randomly initialised Llama or Qwen2 of a few hundred thousand parameters and a character-level tokenizer.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ '<eos>' if m['role'] == 'assistant' else '' }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""role: content lines; an assistant turn ends with the end-of-sequence token the model stops at, as chat models'
templates do (a multi-turn episode's trained tokens are then the template's rendering)"""
SPECIAL = ["<pad>", "<eos>", "<bos>"]


def char_tokenizer(path: str | Path | None = None):
    """A character-level PreTrainedTokenizerFast over printable ASCII: pad 0, eos 1, bos 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    if path is not None:
        fast.save_pretrained(str(path))
    return fast


def build_tiny_model(
    path: str | Path,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    seed: int = 0,
    tie_word_embeddings: bool = False,
    vocab_multiple: int = 1,
) -> Path:
    """Write a random tiny causal LM and its tokenizer to ``path``; returns the path. ``vocab_multiple`` rounds the
    embedding rows up (tensor parallelism splits the vocabulary evenly)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    path = Path(path)
    tokenizer = char_tokenizer(path)
    configs = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    if arch not in configs:
        raise ValueError(f"arch must be one of {sorted(configs)}, got {arch!r}")
    config = configs[arch](
        vocab_size=-(-len(tokenizer) // vocab_multiple) * vocab_multiple,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(path))
    (path / "coati_tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}))
    return path
