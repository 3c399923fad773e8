"""Push attestation: after every weight push, each producer's engine says what it now computes with, and the driver
compares that with what the consumers sent. A push that did nothing, a bucket that never landed, a tied head left
behind, any tensor the engine holds unlike the sent one, stops the run naming the tensor and the producer.

A tensor's fingerprint is the CRC-32 of a sample of its values as they travel (the wire dtype): a vector whole, a
matrix one column, chosen by the tensor's name and the push's version (so successive pushes sample every column in
turn). An engine reads its columns back exactly, whatever its layout: a fused or repacked linear layer (vLLM's CPU
kernels) is applied to a one-hot input, a product by 1 and 0 that rounds nothing. The sender adds, for each weight
the model ties to another (its LM head to its embedding, as the model's own transformers class ties them), the
fingerprint the tied weight must then have. A weight the model stores transposed (GPT-2's Conv1D layers, [in, out])
is fingerprinted as its transpose, the [out, in] layout every engine's linear layer computes with, so an engine reads
it back like any other. A LoRA push is attested by the adapter the engine applied: its tensors' fingerprints, with a
target whose served weight is not its base plus the adapter's product named as wrong. Pure functions on tensors; no
Ray.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch

from coati.distributed.model.lora import adapter_pairs


def column(name: str, version: int, width: int) -> int:
    """The column of ``name``'s matrix sampled at push ``version``."""
    return zlib.crc32(f"{name}@{version}".encode()) % width


def sample(name: str, tensor: torch.Tensor, version: int) -> torch.Tensor:
    """The values of ``tensor`` a fingerprint covers: a vector (or scalar) whole, a matrix's sampled column."""
    t = tensor.detach()
    if t.ndim >= 2:
        t = t.reshape(t.shape[0], -1)
        t = t[:, column(name, version, t.shape[1])]
    return t.reshape(-1)


def crc(values: torch.Tensor) -> int:
    """CRC-32 of the values' bytes (bf16 and other dtypes numpy lacks, through their bits)."""
    v = values.detach().to("cpu").contiguous()
    if v.dtype in (torch.bfloat16, torch.float16):
        v = v.view(torch.int16)
    return zlib.crc32(v.numpy().tobytes())


def fingerprint(name: str, tensor: torch.Tensor, version: int) -> list:
    """[CRC of ``tensor``'s sample at push ``version``, its shape]."""
    return [crc(sample(name, tensor, version)), list(tensor.shape)]


def fingerprints(
    state: Mapping[str, torch.Tensor],
    version: int,
    tied: Mapping[str, str] | None = None,
    transposed: frozenset[str] = frozenset(),
) -> dict:
    """{name: fingerprint} of a push's tensors, plus the tied weights' (``tied``: {tied weight: the weight it is
    tied to}) that the push does not carry; the ``transposed`` weights (``transposed_weights``) as their transpose."""

    def one(name: str, t: torch.Tensor) -> list:
        return fingerprint(name, t.T if name in transposed and t.ndim == 2 else t, version)

    out = {name: one(name, t) for name, t in state.items() if isinstance(t, torch.Tensor)}
    for target, source in (tied or {}).items():
        if target not in out and source in state:
            out[target] = one(target, state[source])
    return out


def transposed_weights(config) -> frozenset[str]:
    """The weights the model's own transformers class stores transposed, [in, out] (GPT-2's Conv1D layers), found
    by building the model on the meta device (no memory, no values)."""
    from transformers.pytorch_utils import Conv1D

    from coati.distributed.model.checkpoint_format import meta_model

    model = meta_model(config)
    return frozenset(f"{name}.weight" for name, module in model.named_modules() if isinstance(module, Conv1D))


def tied_weights(config) -> dict[str, str]:
    """{tied weight: the weight it is tied to} as the model's own transformers class ties them, when its config ties
    the embeddings (Llama's lm_head to model.embed_tokens, GPT-2's to transformer.wte); {} otherwise."""
    from coati.distributed.model.architectures import model_classes

    classes = model_classes(config)
    tied = getattr(config, "tie_word_embeddings", None)
    if tied is None:  # a multimodal config says it of its language model
        tied = getattr(config.get_text_config(), "tie_word_embeddings", False)
    if not tied or type(config) not in classes:
        return {}
    keys = getattr(classes[type(config)], "_tied_weights_keys", None)
    return dict(keys) if isinstance(keys, dict) else {}


def merged_column(
    name: str, base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float, version: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the sampled column of ``base`` + ``scale`` * B A in ``dtype``, as ``lora.merge`` computes the whole weight,
    and the bound its rounding stays within: fp32 sums of r + 2 terms, then rounding to the base's and to ``dtype``)."""
    j = column(name, version, base.shape[1])
    w0, col = base[:, j].float(), a[:, j].float()
    exact = w0 + scale * (b.float() @ col)
    magnitude = w0.abs() + abs(scale) * (b.float().abs() @ col.abs())
    eps = max(torch.finfo(base.dtype).eps, torch.finfo(dtype).eps)
    bound = torch.finfo(torch.float32).eps * (a.shape[0] + 2) * magnitude + 2 * eps * exact.abs()
    return exact.to(base.dtype).to(dtype), bound


def adapter_fingerprints(
    adapter: Mapping[str, torch.Tensor],
    version: int,
    scale: float,
    served: Mapping[str, torch.Tensor] | None = None,
    bases: Mapping[str, torch.Tensor] | None = None,
) -> dict:
    """The fingerprints of the LoRA adapter an engine applied (wire names, as ``fingerprints`` of the pushed one),
    with both tensors of a pair marked wrong ([None, shape]) where the engine's ``served`` sampled column of the
    target ({target: values at ``column(target, version, width)``}) is not its ``bases`` value plus ``scale`` * B A
    within rounding; without ``served`` (an engine that serves the adapter apart from the weights) the adapter alone."""

    out = fingerprints(adapter, version)
    for target, (a, b) in adapter_pairs(dict(adapter)).items() if served is not None else ():
        got = served.get(target)
        ok = got is not None and target in bases
        if ok:
            expected, bound = merged_column(target, bases[target], a, b, scale, version, got.dtype)
            ok = got.shape == expected.shape and bool(((got.float() - expected.float()).abs() <= bound).all())
        if not ok:
            module = target.removesuffix(".weight")
            for part in ("lora_A", "lora_B"):
                out[f"{module}.{part}.weight"][0] = None
    return out


def compare(sent: Mapping[str, list], held: Mapping[str, list]) -> tuple[list[str], int]:
    """(the names the engine holds unlike they were sent, the number compared). A name the engine does not report
    in the sent shape (a layout it cannot read back) is not compared."""
    compared = [name for name, (_, shape) in sent.items() if name in held and list(held[name][1]) == list(shape)]
    return sorted(name for name in compared if held[name][0] != sent[name][0]), len(compared)
