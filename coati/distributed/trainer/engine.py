"""A consumer rank's training engine: ColossalAI launched on its process group, the policy boosted with
HybridParallelPlugin and HybridAdam, the optimizer's step and the frozen reference model; its checkpoints. Built once by
``build_engine``; the step (``trainer/step.py``) and the weight pushes (``trainer/weights.py``) use it."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from functools import partial

import torch

from coati.distributed.guards import all_finite
from coati.distributed.model import attention
from coati.distributed.model.architectures import auto_model_class, vision_towers
from coati.distributed.model.lora import peft_config
from coati.distributed.model.precision import resolve_compute_dtype
from coati.distributed.runtime.placement import whereabouts
from coati.distributed.runtime.threads import ThreadLease
from coati.distributed.trainer import sequence_parallel
from coati.distributed.trainer.colossal_cpu import apply_cpu_shims
from coati.distributed.trainer.config import ConsumerConfig
from coati.distributed.trainer.expert_parallel import expert_parallel_plugin, load_experts, save_experts
from coati.distributed.trainer.forward import causal_lm, check_output_layer
from coati.distributed.trainer.grad_clip import fold_clipping
from coati.distributed.trainer.optimizer_step import OptimizerSteps
from coati.distributed.transport.wire_layout import flatten_parameters, separate_storages

log = logging.getLogger(__name__)


@dataclass
class Engine:
    """What one consumer rank trains with."""

    rank: int
    world_size: int
    device: torch.device
    plugin: object
    """ColossalAI's HybridParallelPlugin (with ep_size > 1 its MoE plugin): the DP, TP, PP (and EP) groups"""
    booster: object
    model: object
    """the boosted policy (``model.unwrap()``: the Hugging Face module this rank holds)"""
    optimizer: object
    steps: OptimizerSteps
    """the optimizer's steps: learning-rate schedule, clipping, skipped non-finite updates"""
    ref_model: torch.nn.Module | None
    """the frozen reference (KL), a whole replica on the last pipeline stage; None without KL"""
    vocab_size: int
    compute_dtype: str
    """the forward passes' precision: "bf16" (autocast over the fp32 weights) or "fp32\""""
    attention: str | None
    """the model's attention implementation (with sequence parallelism, the one its exchange wraps)"""
    lease_layers: int
    """decoder layers whose forward and backward follow the thread lease"""

    @property
    def dp_rank(self) -> int:
        return self.plugin.dp_group.rank()

    @property
    def dp_size(self) -> int:
        """data-parallel shards (the SP ranks of one share it)"""
        return self.plugin.dp_group.size()

    @property
    def sp_group(self):
        """The sequence-parallel group (None without sequence parallelism): its ranks split each pass's columns."""
        return self.plugin.sp_group if getattr(self.plugin, "sp_size", 1) > 1 else None

    @property
    def grad_ranks(self) -> int:
        """Ranks the gradients are averaged over: DP x SP."""
        return self.plugin.mixed_dp_group.size()

    @property
    def tp_rank(self) -> int:
        return self.plugin.tp_group.rank() if self.plugin.tp_size > 1 else 0

    @property
    def pp_rank(self) -> int:
        return self.plugin.stage_manager.stage if self.plugin.pp_size > 1 else 0

    @property
    def is_last_stage(self) -> bool:
        return self.plugin.pp_size == 1 or self.plugin.stage_manager.is_last_stage()

    @property
    def ep_group(self):
        """The expert-parallel group (None without expert parallelism): its ranks make the same passes."""
        return self.plugin.ep_group if getattr(self.plugin, "ep_size", 1) > 1 else None

    @property
    def sdpa(self) -> bool:
        """Whether the attention takes a boolean 4D mask (packing a group into one row needs one)."""
        return self.attention in ("sdpa", attention.NAME)

    def compute(self):
        """The forward passes' precision: bf16 autocast over the fp32 weights, or nothing."""
        if self.compute_dtype == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def describe(self) -> dict:
        """Where the rank runs and what it computes with, for the driver's log."""
        return {
            **whereabouts(),
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "tp_rank": self.tp_rank,
            "pp_rank": self.pp_rank,
            "device": str(self.device),
            "compute_dtype": self.compute_dtype,
            "gradient_checkpointing": self.model.unwrap(unwrap_peft=False).is_gradient_checkpointing,
            "lease_layers": self.lease_layers,
            "attention": self.attention,
            "malloc": os.environ.get("GLIBC_TUNABLES", ""),
            "clipping": "in the update" if self.steps.clipping else "colossalai",
        }

    def save(self, folder: str, step: int) -> None:
        """Model and optimizer through the booster (sharded as the plugin holds them), plus this rank's RNG and
        ``step``. Refused when any weight is not finite: a checkpoint must be something worth resuming from."""
        bad = [n for n, p in self.model.unwrap().named_parameters() if not all_finite([p.detach()])]
        if bad:
            raise RuntimeError(
                f"refusing to checkpoint into {folder}: non-finite weights in {bad[:5]} ({len(bad)} tensors)"
            )
        # On CPU, ColossalAI's saver writes parameters as they are, and torch.save writes a view's whole storage.
        with separate_storages(self.model.unwrap()) if self.device.type == "cpu" else contextlib.nullcontext():
            self.booster.save_model(self.model, os.path.join(folder, "model"), shard=True)
        self.booster.save_optimizer(self.optimizer, os.path.join(folder, "optimizer"), shard=True)
        if self.ep_group is not None:
            save_experts(self.model.unwrap(), self.optimizer, self._experts_file(folder))
        torch.save({"torch": torch.get_rng_state(), "step": step}, os.path.join(folder, f"rng-consumer-{self.rank}.pt"))

    def _experts_file(self, folder: str) -> str:
        """This rank's experts and their optimizer states (expert parallelism: ``expert_parallel.save_experts``)."""
        return os.path.join(folder, f"experts-consumer-{self.rank}.pt")

    def load(self, folder: str) -> int:
        """Restore what ``save`` wrote; returns its step. Nothing in it can run code (``weights_only_loads``)."""
        with weights_only_loads():
            self.booster.load_model(self.model, os.path.join(folder, "model"))
            self.booster.load_optimizer(self.optimizer, os.path.join(folder, "optimizer"))
        if self.ep_group is not None:
            load_experts(self.model.unwrap(), self.optimizer, self._experts_file(folder))
        state = torch.load(os.path.join(folder, f"rng-consumer-{self.rank}.pt"), weights_only=True)
        torch.set_rng_state(state["torch"])
        return state["step"]


@contextlib.contextmanager
def weights_only_loads():
    """Every ``torch.load`` in the block unpickles tensors and plain data only, whatever the environment says.
    ColossalAI's checkpoint readers call ``torch.load`` without ``weights_only``, which
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` turns into a full unpickle: a pickle planted in a shard would run."""
    names = ("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    saved = {name: os.environ.pop(name, None) for name in names}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def launch_colossalai(rank: int, world_size: int, master_addr: str, master_port: int, seed: int) -> torch.device:
    """ColossalAI's process group over the consumers (gloo on CPU, with its CPU shims; NCCL on GPUs); the device."""
    import colossalai

    on_cpu = apply_cpu_shims()
    colossalai.launch(rank, world_size, master_addr, master_port, backend="gloo" if on_cpu else "nccl", seed=seed)
    return torch.device("cpu") if on_cpu else torch.device("cuda", torch.cuda.current_device())


def make_plugin(cfg: ConsumerConfig):
    """The HybridParallelPlugin of the consumer config's layout and precision."""
    from colossalai.booster.plugin import HybridParallelPlugin

    from coati.distributed.trainer.colossal_policy import DecoderLMPolicy  # deferred: imports ColossalAI

    p = cfg.plugin
    plugin_class = HybridParallelPlugin
    if p.ep_size > 1:  # ColossalAI's MoE plugin, with coati's expert shards over transformers 5's fused experts
        plugin_class = partial(expert_parallel_plugin, ep_size=p.ep_size)
    return plugin_class(
        tp_size=p.tp_size,
        pp_size=p.pp_size,
        zero_stage=p.zero_stage,
        cpu_offload=p.cpu_offload,
        precision=p.precision,
        # With clipping off the norm is still measured (every step reports it, and a non-finite one skips the step):
        # a bound no gradient reaches.
        max_norm=cfg.max_grad_norm or 1e30,
        num_microbatches=p.pp_num_microbatches if p.pp_size > 1 else None,
        make_vocab_size_divisible_by=p.tp_size,
        **sequence_parallelism(p),
        enable_metadata_cache=False,
        parallel_output=False,
        custom_policy=DecoderLMPolicy(),
    )


def sequence_parallelism(p) -> dict:
    """The plugin's sequence-parallel arguments: its groups (SP, and DP x SP for the gradients' mean); coati's
    exchanging attention (``sequence_parallel``) does the rest."""
    if p.sp_size == 1:
        return {}
    return {"sp_size": p.sp_size, "enable_sequence_parallelism": True, "sequence_parallelism_mode": p.sp_mode}


def load_policy(model_path: str, cfg: ConsumerConfig, device: torch.device, seed: int):
    """The policy as it is boosted: fp32, without a KV cache, with gradient checkpointing and a LoRA adapter as
    configured (peft wraps it before boosting; only the adapter trains)."""
    torch.manual_seed(seed)
    model = auto_model_class(model_path).from_pretrained(model_path, dtype=torch.float32)
    if cfg.freeze_vision_tower:
        for tower in vision_towers(model):
            tower.requires_grad_(False)
    return for_training(model, cfg, device)


def for_training(model, cfg: ConsumerConfig, device: torch.device):
    """``model`` as a consumer trains it: without a KV cache, its attention for ``device``, with gradient
    checkpointing as configured (the policy's and the critic's alike)."""
    model.config.use_cache = False
    attention.use(model, device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def reference_model(model_path: str, device: torch.device) -> torch.nn.Module:
    """The frozen reference policy (KL) on ``device``."""
    model = auto_model_class(model_path).from_pretrained(model_path, dtype=torch.float32)
    attention.use(model, device)
    return model.to(device).eval().requires_grad_(False)


def value_model_config(model_path: str):
    """The config of a critic over ``model_path``'s backbone: one label (the value), no dropout before the head."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, num_labels=1)
    config.classifier_dropout = 0.0  # transformers' token-classification heads default to 0.1 without it
    return config


def load_value_model(model_path: str, cfg: ConsumerConfig, device: torch.device, seed: int):
    """A critic: the backbone of ``model_path`` (a causal LM's, or a token-classification model's such as a
    critic this exports) under a scalar head, ``AutoModelForTokenClassification`` with one label and no dropout; a
    head the folder lacks starts at zero, so the first values are 0 rather than noise."""
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(seed)
    model, info = AutoModelForTokenClassification.from_pretrained(
        model_path, config=value_model_config(model_path), dtype=torch.float32, output_loading_info=True
    )
    head = model.score
    if any(k.startswith("score.") for k in info["missing_keys"]):
        torch.nn.init.zeros_(head.weight)
        if head.bias is not None:
            torch.nn.init.zeros_(head.bias)
    return for_training(model, cfg, device)


def boosted_policy(model_path: str, cfg: ConsumerConfig, plugin, booster, device, seed: int, value_head: bool = False):
    """(the boosted policy, its HybridAdam, its vocabulary size): the policy loaded (a critic with ``value_head``),
    its LoRA adapter added, and under ZeRO without TP or PP its weights cast, moved and flattened before boosting."""
    from colossalai.nn.optimizer import HybridAdam

    p = cfg.plugin
    model = (load_value_model if value_head else load_policy)(model_path, cfg, device, seed)
    if cfg.lora_rank:
        lora = peft_config(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, model_path)
        model = plugin.enable_lora(model, lora_config=lora)
    vocab_size = model.config.get_text_config().vocab_size
    if p.zero_stage > 0 and p.tp_size == 1 and p.pp_size == 1:
        model.to(device, {"bf16": torch.bfloat16, "fp16": torch.float16}[p.precision])
        flatten_parameters(model)
    trainable = [param for param in model.parameters() if param.requires_grad]
    optimizer = HybridAdam(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    model, optimizer, *_ = booster.boost(model, optimizer)
    return model, optimizer, vocab_size


def build_engine(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    model_path: str,
    cfg: ConsumerConfig,
    reference: bool,
    seed: int,
    threads: ThreadLease,
    value_head: bool = False,
) -> Engine:
    """Launch ColossalAI, load and boost the policy (a critic's value model with ``value_head``), and load the
    reference model with ``reference`` (a KL to it in the loss or the reward, held by this rank).

    The weights live in flat buffers laid out as a transformers producer's, so pushes go in a few transfers and are
    received in place. ZeRO's optimizer keeps views of each parameter's storage for its gathers, so there the weights
    are cast, moved and flattened before boosting (which then leaves them as they are); not with TP or PP, which
    replace or drop parameters and would leave the old flat buffers alive."""
    from colossalai.booster import Booster

    device = launch_colossalai(rank, world_size, master_addr, master_port, seed)
    plugin, p = make_plugin(cfg), cfg.plugin
    booster = Booster(plugin=plugin)
    model, optimizer, vocab_size = boosted_policy(model_path, cfg, plugin, booster, device, seed, value_head)
    lease_layers = threads.follow_layers(model)
    clipping = fold_clipping(optimizer, p.tp_size, p.pp_size, getattr(plugin, "ep_group", None))
    steps = OptimizerSteps(optimizer, cfg, clipping, device, world_size, "critic" if value_head else "actor")
    if p.zero_stage == 0 and not cfg.lora_rank:  # an adapter's push is small: no flat layout needed
        flatten_parameters(model.unwrap())  # after boosting: only the parameters this rank holds
    last_stage = p.pp_size == 1 or plugin.stage_manager.is_last_stage()
    ref_model = None
    if reference and last_stage:  # a whole unsharded replica, needed only where the loss is computed
        ref_model = reference_model(model_path, device)
        lease_layers += threads.follow_layers(ref_model)  # its forward takes up lends too
    if p.pp_size == 1 and not value_head:  # pipeline stages compute the loss from the model's own logits
        check_output_layer(model)
    attention_name = getattr(causal_lm(model).config, "_attn_implementation", None)
    if p.sp_size > 1:
        sequence_parallel.use(causal_lm(model), plugin.sp_group)
    compute_dtype = resolve_compute_dtype(cfg.compute_dtype, device, p.precision, p.tp_size)
    if rank == 0:
        log.warning(
            "trainer computes in %s (compute_dtype=%s, weights %s)", compute_dtype, cfg.compute_dtype, p.precision
        )
    return Engine(
        rank=rank,
        world_size=world_size,
        device=device,
        plugin=plugin,
        booster=booster,
        model=model,
        optimizer=optimizer,
        steps=steps,
        ref_model=ref_model,
        vocab_size=vocab_size,
        compute_dtype=compute_dtype,
        attention=attention_name,
        lease_layers=lease_layers,
    )
