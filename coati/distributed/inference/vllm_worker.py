"""vLLM worker extension (``worker_extension_cls``; vLLM mixes it into each worker and calls it through
``LLM.collective_rpc``): joins the consumer's weight group, receives each push into buffers of its own and then
reloads it with the worker's ``reload_weights`` (the model's own ``load_weights`` plus the platform's weight
processing, so tensor-parallel sharding, q/k/v and gate/up fusion and CPU weight packing stay vLLM's job), and reads
the weights back for tests."""

from __future__ import annotations

import torch

from coati.distributed.inference.sampling import inverse_cdf_forward
from coati.distributed.model import lora
from coati.distributed.model.checkpoint_format import meta_model, to_checkpoint
from coati.distributed.transport import TorchGroup, ray_broadcast_tensor_dict
from coati.distributed.transport.attest import adapter_fingerprints, column, crc, tied_weights


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self.model_runner``, ``self.rank``, ``self.device`` and
    ``self.reload_weights`` come from the worker."""

    def join_weight_group(
        self, address: str, world_size: int, rank_offset: int, group_name: str, backend: str, timeout_s: float
    ) -> None:
        rank = rank_offset + getattr(self, "rank", 0)
        if not hasattr(self, "_coati_groups"):
            self._coati_groups = {}
            self._coati_kept: dict[str, dict[str, torch.Tensor]] = {}
            """per group, the last push's tensors as received (CPU only): the next push lands in them"""
        self._coati_groups[group_name] = TorchGroup(
            world_size, rank, group_name, backend=backend, timeout_s=timeout_s, address=address
        )

    def weight_dtypes(self) -> list[str]:
        """The dtypes of this worker's floating model parameters, by name (``float32``, ``bfloat16``)."""
        return sorted(
            {str(p.dtype).removeprefix("torch.") for p in self.model_runner.model.parameters() if p.is_floating_point()}
        )

    def receive_push(self, group_name: str) -> dict:
        """Receive one push whole into buffers of this worker's own, leaving the engine's weights untouched (the
        engine may keep stepping meanwhile); ``load_push`` applies it. Returns the version the consumer attached and
        how the push travelled ("transfers", "nbytes", "direct_bytes", "in_place_bytes").

        On the CPU the buffers are kept from one push to the next: each push after the first lands in the previous
        one's tensors (laid out as on the wire, so the consumer's flat runs arrive in place), with no allocation and
        no copy, since fresh memory for a 135M-parameter push cost ~0.25 s of page faults and copying on a core
        that generation shares. vLLM's reload copies out of them (it never keeps them), and the next receive
        starts only after that reload. On a GPU they are freed after the reload (they would hold a second copy of
        the weights in the memory the engine's cache was sized against)."""
        group = self._coati_groups[group_name]
        got = ray_broadcast_tensor_dict(None, 0, group.device, group=group, into=self._coati_kept.get(group_name))
        received = [(name, value) for name, value in got.items() if isinstance(value, torch.Tensor)]
        if group.device.type == "cpu":
            self._coati_kept[group_name] = dict(received)
        self._coati_push = (received, group.device)
        return {
            "version": got.version,
            "transfers": got.transfers,
            "nbytes": got.nbytes,
            "direct_bytes": got.direct_bytes,
            "in_place_bytes": got.in_place_bytes,
        }

    def load_push(self) -> int:
        """Reload the push ``receive_push`` kept into the engine's weights (called between two engine steps); returns
        the threads it ran with. It is loaded whole (``reload_weights`` takes an iterator and processes a layer once
        all of its tensors are in), so the engine never runs on a half-loaded model."""
        (received, device), self._coati_push = self._coati_push, None
        # The push carries the trainer's layout; vLLM's loaders read the checkpoint's (a MoE's experts one by one).
        if not hasattr(self, "_coati_meta"):
            self._coati_meta = meta_model(self.model_config.hf_config)
        received = list(to_checkpoint(self._coati_meta, dict(received)).items())
        # The consumer sends a tied weight once. vLLM's reload re-processes a layer only when one of its tensors
        # arrives, so without this the CPU build kept the LM head packed from the old weights (rollout log-probs 0.9
        # away from the trainer's after one push on a tiny tied model; GPT-2's head never followed its wte).
        names = dict(received)
        for target, source in self._tied_targets().items():
            if target not in names and source in names:
                received.append((target, names[source]))
        self.reload_weights(weights_iterator=iter(received), is_checkpoint_format=True)
        repack_experts(self.model_runner.model, [name for name, _ in received])
        if device.type == "cuda":
            torch.cuda.synchronize()
        return torch.get_num_threads()

    def _tied_targets(self) -> dict[str, str]:
        """{tied weight: the weight it is tied to} under the Hugging Face names, as the model's own transformers
        class ties them (``_tied_weights_keys``: Llama's lm_head to model.embed_tokens, GPT-2's to transformer.wte),
        for the tied weights this engine holds in a module of their own (Gemma's logits read the embedding itself:
        it has no lm_head to load)."""
        if not hasattr(self, "_coati_tied"):
            modules = dict(self.model_runner.model.named_modules())
            self._coati_tied = {
                target: source
                for target, source in tied_weights(self.model_config.hf_config).items()
                if target.rpartition(".")[0] in modules
            }
        return self._coati_tied

    def receive_adapter(self, group_name: str) -> tuple[int, dict[str, torch.Tensor]]:
        """Receive one LoRA push; returns (its version, the adapter's tensors on the CPU) for the producer, which
        hands them to vLLM as a PEFT folder."""
        group = self._coati_groups[group_name]
        got = ray_broadcast_tensor_dict(None, 0, group.device, group=group)
        return got.version, {k: v.to("cpu").clone() for k, v in got.items() if isinstance(v, torch.Tensor)}

    def receive_adapter_merged(self, group_name: str, model_path: str, scale: float) -> tuple[int, int]:
        """Receive one LoRA push and reload every weight of the layers it targets as base + scale * B A (fused
        modules such as qkv_proj reload only with all their parts, so whole layers are sent to the reload); the
        base values come from the checkpoint at ``model_path``, read once. Returns (version, adapter bytes)."""

        version, adapter = self.receive_adapter(group_name)
        if not hasattr(self, "_coati_base"):
            import glob
            import os

            from safetensors.torch import load_file

            self._coati_base = {}
            for f in sorted(glob.glob(os.path.join(model_path, "*.safetensors"))):
                self._coati_base.update(load_file(f))
        pairs = lora.adapter_pairs(adapter)
        layers = {name.rsplit(".", 2)[0] for name in pairs}  # model.layers.<i>.<block>
        weights = [
            (name, lora.merge(base, *pairs[name], scale) if name in pairs else base)
            for name, base in self._coati_base.items()
            if name.rsplit(".", 2)[0] in layers
        ]
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        repack_experts(self.model_runner.model, [name for name, _ in weights])
        self._coati_adapter = (adapter, scale)
        return version, sum(t.numel() * t.element_size() for t in adapter.values())

    def use_sampler(self, name: str) -> str:
        """Draw plain-temperature rows with ``name``'s sampler: "inverse_cdf" (``sampling.inverse_cdf_forward``) or
        "vllm" (the engine's own); returns the sampler's class."""

        sampler = self.model_runner.sampler.topk_topp_sampler
        if not hasattr(sampler, "_coati_own"):
            sampler._coati_own = sampler.forward
        own = sampler._coati_own
        sampler.forward = inverse_cdf_forward(sampler, own) if name == "inverse_cdf" else own
        return type(sampler).__name__

    def fingerprints(self, version: int) -> dict[str, list]:
        """{Hugging Face name: [CRC of its sample, shape]} of the weights this worker computes with (``attest``); after
        a merged LoRA push, the applied adapter's, each target's served column checked against its checkpoint value
        plus the adapter (``attest.adapter_fingerprints``)."""

        adapter = getattr(self, "_coati_adapter", None)
        if adapter is not None:
            tensors, scale = adapter
            served = {name: values for name, (values, _) in self.columns(version).items()}
            return adapter_fingerprints(tensors, version, scale, served, self._coati_base)
        return {name: [crc(values), shape] for name, (values, shape) in self.columns(version).items()}

    def columns(self, version: int) -> dict[str, tuple[torch.Tensor, list]]:
        """{Hugging Face name: (its sample at push ``version``, the shape it has in the checkpoint's layout)} of the
        weights this worker computes with: each matrix's sampled column read back exactly, a CPU linear layer's (its
        LM head's included) through its own kernel on a one-hot input (what it computes with, packed apart from the
        weight), a fused one's split by its output sizes, the vocabulary padding dropped. A weight the checkpoint
        stores transposed (GPT-2's Conv1D layers) is held [out, in] here, as ``attest`` fingerprints it."""

        model = self.model_runner.model
        vocab = self.model_config.hf_config.get_text_config().vocab_size
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        out: dict[str, tuple[torch.Tensor, list]] = {}
        for module_name, module in model.named_modules():
            experts = expert_weights(module_name, module)
            for name, matrix in (experts or {}).items():
                out[name] = (matrix[:, column(name, version, matrix.shape[1])], list(matrix.shape))
            for param_name, param in module.named_parameters(recurse=False):
                if param.ndim == 0 or (experts is not None and param_name in EXPERT_PARAMS):
                    continue
                prefix, _, leaf = module_name.rpartition(".")
                names = (
                    [f"{prefix}.{part}.{param_name}" for part in packed[leaf]]
                    if leaf in packed
                    else [f"{module_name}.{param_name}"]
                )
                sizes = (
                    list(getattr(module, "output_partition_sizes", None) or module.output_sizes)
                    if len(names) > 1
                    else None
                )
                value = param.detach()
                # A CPU linear layer computes with its own packed copy (kept beside the weight for an LM head):
                # read through its kernel what it computes with. An embedding's lookup reads the weight itself.
                through_kernel = (
                    param_name == "weight"
                    and (value.ndim == 2 or value.numel() == 0)
                    and hasattr(module, "cpu_linear")
                    and leaf not in ("embed_tokens", "wte")
                )
                whole = list(value.shape) if value.ndim > 2 else None  # a convolution's kernel: sampled flattened
                if whole is not None:
                    value = value.reshape(value.shape[0], -1)
                if value.numel() == 0 and through_kernel:
                    width = getattr(module, "input_size_per_partition", None) or module.input_size
                else:
                    width = value.shape[-1] if value.ndim >= 2 else None
                for i, name in enumerate(names):
                    if width is None:  # a vector: whole
                        values = value.split(sizes)[i] if sizes else value
                        shape = list(values.shape)
                    else:
                        j = column(name, version, width)
                        if through_kernel:
                            one_hot = torch.zeros(1, width, dtype=value.dtype)
                            one_hot[0, j] = 1
                            values = module.cpu_linear(one_hot, value, None)[0]
                        else:
                            values = value[:, j]
                        values = values.split(sizes)[i] if sizes else values
                        if leaf in ("embed_tokens", "lm_head", "wte"):
                            values = values[:vocab]
                        shape = whole or [values.shape[0], width]
                    out[name] = (values, shape)
        return out

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """This worker's weights as the engine computes with them, under the Hugging Face names, on the CPU.

        Fused modules (``qkv_proj``, ``gate_up_proj``) are split back by their output sizes; the vocabulary padding
        vLLM adds is dropped. vLLM's CPU build repacks linear weights for its GEMM kernels and frees the originals,
        so those are read back through the layer's own kernel: ``cpu_linear(I, ...)`` = W^T, exact in fp32
        (every product is by 1 or 0)."""
        model = self.model_runner.model
        vocab = self.model_config.hf_config.get_text_config().vocab_size
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        out: dict[str, torch.Tensor] = {}
        for module_name, module in model.named_modules():
            experts = expert_weights(module_name, module)
            out.update({name: matrix.to("cpu").clone() for name, matrix in (experts or {}).items()})
            for param_name, param in module.named_parameters(recurse=False):
                if param.ndim == 0 or (experts is not None and param_name in EXPERT_PARAMS):  # scales; experts
                    continue
                value = param.detach()
                if param_name == "weight" and value.numel() == 0 and hasattr(module, "cpu_linear"):
                    k = getattr(module, "input_size_per_partition", None) or module.input_size
                    value = module.cpu_linear(torch.eye(k, dtype=value.dtype), value, None).t()
                value = value.to("cpu").clone()
                prefix, _, leaf = module_name.rpartition(".")
                if leaf in packed:
                    sizes = list(getattr(module, "output_partition_sizes", None) or module.output_sizes)
                    for part, piece in zip(packed[leaf], value.split(sizes), strict=True):
                        out[f"{prefix}.{part}.{param_name}"] = piece.contiguous()
                    continue
                if leaf in ("embed_tokens", "lm_head"):
                    value = value[:vocab]
                out[f"{module_name}.{param_name}"] = value
        return out


EXPERT_PARAMS = ("w13_weight", "w2_weight")
"""a fused-MoE layer's expert weights: [E, 2I, H] (gate then up) and [E, H, I]"""


def expert_weights(module_name: str, module: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """A fused mixture-of-experts layer's experts as its kernel computes with them, one [out, in] matrix per expert
    under the checkpoint's names (``<block>.experts.<e>.<gate|up|down>.weight``, the names the layer loads from,
    Mixtral's ``w1``/``w3``/``w2``); None for any other module. The CPU kernel's repacking is undone
    (``unpacked_experts``) and the intermediate padding it adds dropped."""
    if not is_fused_experts(module):
        return None
    w13, w2 = (unpacked_experts(module, p) for p in EXPERT_PARAMS)
    if w13.shape[0] != module.global_num_experts:
        raise ValueError(
            f"{module_name} holds {w13.shape[0]} of {module.global_num_experts} experts: an engine with expert "
            "parallelism cannot be read back here"
        )
    size, padded = module.intermediate_size_per_partition, w13.shape[1] // 2
    block = expert_block(module_name)
    out = {}
    for e in range(w13.shape[0]):
        parts = {
            module.ckpt_gate_proj_name: w13[e, :size],
            module.ckpt_up_proj_name: w13[e, padded : padded + size],
            module.ckpt_down_proj_name: w2[e, :, :size],
        }
        out.update({f"{block}.experts.{e}.{part}.weight": m for part, m in parts.items()})
    return out


def is_fused_experts(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a fused mixture-of-experts layer (its experts in ``EXPERT_PARAMS``, loaded from the
    checkpoint names it records)."""
    return all(hasattr(module, p) for p in EXPERT_PARAMS) and hasattr(module, "ckpt_gate_proj_name")


def expert_block(module_name: str) -> str:
    """The MoE block an expert layer belongs to, under which the checkpoint names its experts
    (``model.layers.0.mlp`` of ``model.layers.0.mlp.experts.routed_experts``)."""
    return module_name.rsplit(".experts", 1)[0]


def cpu_packing(module: torch.nn.Module) -> str | None:
    """The ISA whose layout vLLM's CPU MoE kernel repacks ``module``'s expert weights into (``vec``, ``amx``,
    ...); None where they stay as loaded (a GPU, another kernel)."""
    weight = getattr(module, EXPERT_PARAMS[0], None)
    quant = getattr(module, "quant_method", None)
    experts = getattr(getattr(quant, "moe_kernel", None), "fused_experts", None)
    isa = getattr(experts, "isa", None)
    if weight is None or weight.device.type != "cpu" or not isinstance(isa, str):
        return None
    return None if getattr(experts, "_use_zentorch", False) else isa


def repack_experts(model: torch.nn.Module, loaded: list[str]) -> int:
    """Repack the experts of every CPU MoE layer a reload of the ``loaded`` names reached into its kernel's layout;
    returns the layers repacked.

    vLLM 0.32 packs a layer's experts for its CPU grouped GEMM only on the first load: a reload's weight processing
    skips the kernel's own step once the kernel exists, and leaves the new weights as loaded, which the kernel then
    reads as packed (measured: every expert held otherwise than sent, log-probs 0.15 away after one reload of the
    unchanged checkpoint). Packed here in place, as the first load packed them."""
    from vllm import _custom_ops as ops

    repacked = 0
    for module_name, module in model.named_modules():
        isa = cpu_packing(module) if is_fused_experts(module) else None
        block = expert_block(module_name) + ".experts."
        if isa is None or not any(name.startswith(block) for name in loaded):
            continue
        for param in EXPERT_PARAMS:
            weight = getattr(module, param).data
            weight.copy_(ops.cpu_prepack_moe_weight(weight.contiguous(), isa))
        repacked += 1
    return repacked


def unpacked_experts(module: torch.nn.Module, param: str) -> torch.Tensor:
    """``module.<param>`` in its loaded layout. vLLM's CPU kernel repacks the expert weights for its grouped GEMM
    after loading (``cpu_prepack_moe_weight``, a permutation of the values within the same shape); the permutation
    is found by packing the positions themselves, written in digits a few at a time that the dtype holds exactly,
    and the values are put back where they came from (exact: nothing is computed on them)."""
    weight = getattr(module, param).detach()
    isa = cpu_packing(module)
    if isa is None:
        return weight
    from vllm import _custom_ops as ops

    base = 4096 if weight.dtype == torch.float32 else 256  # integers the dtype (fp32; bf16, fp16) holds exactly
    index = torch.arange(weight.numel(), dtype=torch.int64)
    positions = torch.zeros_like(index)
    scale = 1
    while scale < weight.numel():
        digit = ((index // scale) % base).to(weight.dtype).reshape(weight.shape)
        positions += ops.cpu_prepack_moe_weight(digit, isa).reshape(-1).to(torch.int64) * scale
        scale *= base
    out = torch.empty_like(weight)
    out.view(-1)[positions] = weight.reshape(-1)
    return out
