"""LoRA between consumers and producers. A consumer trains a peft adapter over frozen base weights and pushes only
the adapter; a producer merges it into a kept copy of its base weights, W = W0 + (alpha / r) B A, so generation runs
at the base model's speed and the base itself is never changed. Pure (names and tensors) but for ``peft_config``.

Names: peft calls a target's weights ``base_model.model.<module>.base_layer.weight`` and its adapter
``base_model.model.<module>.lora_A.weight`` ([r, in]) and ``.lora_B.weight`` ([out, r]); the wire and the producers
use the Hugging Face module path ``<module>`` (``model.layers.0.self_attn.q_proj``).
"""

from __future__ import annotations

import torch

PREFIX = "base_model.model."


def hf_name(peft_name: str) -> str:
    """A peft parameter name as the base model's (``...q_proj.base_layer.weight`` -> ``...q_proj.weight``)."""
    name = peft_name[len(PREFIX) :] if peft_name.startswith(PREFIX) else peft_name
    return name.replace(".base_layer.", ".")


def adapter_tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a peft model's named parameters, under wire names (``<module>.lora_A.weight``)."""
    return {
        hf_name(k).replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B."): v
        for k, v in named.items()
        if ".lora_A." in k or ".lora_B." in k
    }


def adapter_pairs(adapter: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{base weight name: (A, B)} of wire-named adapter tensors; every A needs its B."""
    pairs = {}
    for name, a in adapter.items():
        if name.endswith(".lora_A.weight"):
            module = name[: -len(".lora_A.weight")]
            b = adapter.get(f"{module}.lora_B.weight")
            assert b is not None, f"adapter has {name} but no {module}.lora_B.weight"
            pairs[f"{module}.weight"] = (a, b)
    assert 2 * len(pairs) == len(adapter), f"unpaired adapter tensors: {sorted(adapter)[:4]}"
    return pairs


def merge(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """W0 + scale * B A, computed in fp32 and returned in W0's dtype. Shapes: W0 [out, in], A [r, in], B [out, r]."""
    out = base.to(torch.float32, copy=True)  # a copy even in fp32: the base is kept
    return out.addmm_(b.to(torch.float32), a.to(torch.float32), alpha=scale).to(base.dtype)


def merged_state(named: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A peft model's named parameters as the base model's state with the adapter merged in (what a producer holds
    after a push)."""
    adapter = adapter_tensors(named)
    pairs = adapter_pairs(adapter)
    out = {}
    for name, tensor in named.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        key = hf_name(name)
        out[key] = merge(tensor, *pairs[key], scale) if key in pairs else tensor
    return out


def peft_config(rank: int, alpha: float, dropout: float, target_modules, base_path: str | None = None):
    """peft's LoraConfig of these LoRA settings (``base_path`` recorded as the adapter's base model)."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )


def write_adapter(adapter: dict, lora_config, tokenizer, folder: str) -> None:
    """Write a LoRA adapter (wire names) into ``folder`` as PEFT lays it out, ``adapter_config.json`` and
    ``adapter_model.safetensors``, plus the tokenizer when given: what ``PeftModel.from_pretrained(base, folder)``
    and vLLM's LoRA loader read."""
    import os

    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    lora_config.save_pretrained(folder)
    save_file(
        {PREFIX + k: v.contiguous() for k, v in adapter.items()}, os.path.join(folder, "adapter_model.safetensors")
    )
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
