"""The inference-backend seam: a producer holds one backend and asks it for rollouts and weights; the driver asks the
backend's class, before any actor starts, what the engine needs.

Class side (launch): ``engine_options`` turns the user's options plus the launch's choices (engine processes per
producer, sleeping while consumers train, loading pushes while a batch is being generated) into the constructor's
keyword arguments, refusing what the backend cannot do; ``weight_ranks`` says how many members of each weight group one
producer brings. Instance side (producer): ``generate(prompts, n, greedy)`` takes tokenised prompts and returns a
``RolloutBatch`` (rows prompt-major: the n completions of prompt i are rows i*n .. i*n+n-1, ``group_ids`` = i) with the
loss mask and the rollout log-probs already filled in. ``join_weight_group``/``receive_weights`` take part in the
consumers' pushes; the default receives in the producer process into ``weight_destinations`` and ``load_weights`` (a
dict of named tensors, a partial dict for one pipeline stage, or buckets as they land). ``sleep``/``wake`` free and
retake accelerator memory while consumers train.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import torch

from coati.distributed.inference.config import GenerationConfig
from coati.distributed.inference.options import BackendOptions
from coati.distributed.record import RolloutBatch


def one_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype | None:
    """The one floating dtype among ``dtypes``; None when there are several or none."""
    found = {d for d in dtypes if d.is_floating_point}
    return found.pop() if len(found) == 1 else None


def checkpoint_dtype(model_path: str) -> str:
    """The dtype the checkpoint's config records (what the trainer loads), else vLLM's "auto". Rolling out a float32
    checkpoint in bfloat16 (vLLM's "auto") put the default job's rollout log-probs 0.11 (median mean |diff|) away from
    the trainer's and learned less; see docs/backends.md. SGLang's "auto" would run it in float16."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else "auto"


class InferenceBackend(BackendOptions):
    """Base class of the engines; one implementation per module, chosen by name from ``BACKEND_MAP`` through its
    options class (``options.BackendOptions``)."""

    def __init__(
        self, model_path: str, generation: GenerationConfig, lora_rank: int = 0, record_routing: bool = False, **options
    ):
        # lora_rank (set by engine_options when pushes carry adapters) is for the engines that size for it (vLLM)
        self.check_options(options)
        self.record_routing = record_routing
        """record each token's routed experts in the batches (routing replay; set by engine_options)"""
        self.model_path = model_path
        self.generation = generation
        self.options = options
        self.between_steps: Callable[[], None] = lambda: None
        """called by the generating thread between decode steps (engines stepped in this process): the producer
        applies cores lent to it mid-round there"""

    def generate(
        self, prompts: list[list[int]], n: int = 1, greedy: bool = False, images: list | None = None
    ) -> RolloutBatch:
        """``n`` completions of each prompt (token ids); ``images``: for a vision-language model, each prompt as
        ``rollout.images.ImagePrompt`` (engines whose options say ``IMAGES``)."""
        raise NotImplementedError

    def submit(self, key: int, prompt: list[int], n: int) -> None:
        """Streaming: start ``n`` samples of ``prompt`` as one group labelled ``key``; it runs across calls until
        ``collect`` returns it."""
        raise NotImplementedError(f"{type(self).__name__} generates rounds only (STREAMS is False)")

    def collect(self) -> list[tuple[int, RolloutBatch]]:
        """Streaming: run until at least one submitted group has finished; each finished group as (key, its n rows,
        ``group_ids`` 0)."""
        raise NotImplementedError(f"{type(self).__name__} generates rounds only (STREAMS is False)")

    def withdraw(self) -> list[int]:
        """Streaming: drop every submitted group not yet collected; their keys in submission order."""
        raise NotImplementedError(f"{type(self).__name__} generates rounds only (STREAMS is False)")

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[Mapping[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def join_weight_group(self, world_size: int, rank: int, group_name: str, backend: str, timeout_s: float) -> None:
        """Join the weight group ``group_name`` as rank ``rank`` (and the ``weight_ranks - 1`` ranks after it)."""
        from coati.distributed.transport import init_group  # deferred: imports Ray's collective module

        init_group(world_size, rank, group_name, backend=backend, timeout_s=timeout_s)

    def receive_weights(self, group_name: str, threads: int | None = None) -> dict:
        """Receive one push on ``group_name``; returns {"version": the consumer's, and how the push travelled:
        "transfers" (collective calls), "nbytes", "direct_bytes" (sent straight from the consumer's weights, not
        packed), "in_place_bytes" (landed straight in the engine's weights)}. ``threads`` are the cores for loading a
        push once it is whole; here it lands in the weights as it arrives, leaving nothing to load after."""
        from coati.distributed.transport import ray_broadcast_tensor_dict  # deferred: imports Ray's collective module

        loaded = ray_broadcast_tensor_dict(
            None,
            0,
            getattr(self, "device", "cpu"),
            group_name,
            on_bucket=self.load_weights,
            into=self.weight_destinations(),
        )
        start = time.perf_counter()
        fingerprints = self.fingerprints(loaded.version)
        return {
            "version": loaded.version,
            "transfers": loaded.transfers,
            "nbytes": loaded.nbytes,
            "direct_bytes": loaded.direct_bytes,
            "in_place_bytes": loaded.in_place_bytes,
            "fingerprints": fingerprints,
            "attest_s": time.perf_counter() - start,
        }

    def fingerprints(self, version: int) -> dict[str, list] | None:
        """{name: [CRC of its sample, shape]} of the weights the engine computes with, for push ``version``
        (``attest``); None where the backend cannot read them back (the push goes unattested)."""
        return None

    def receive_adapter(self, group_name: str, lora: dict) -> dict:
        """Receive one push of a LoRA adapter (wire-named tensors, see ``lora``) and apply it with ``load_adapter``
        (``lora``: rank, alpha, dropout, target_modules); returns what ``receive_weights`` does."""
        from coati.distributed.transport import ray_broadcast_tensor_dict  # deferred: imports Ray's collective module

        got = ray_broadcast_tensor_dict(None, 0, getattr(self, "device", "cpu"), group_name)
        self.load_adapter({k: v for k, v in got.items() if isinstance(v, torch.Tensor)}, lora["alpha"] / lora["rank"])
        start = time.perf_counter()
        fingerprints = self.fingerprints(got.version)
        return {
            "version": got.version,
            "transfers": got.transfers,
            "nbytes": got.nbytes,
            "direct_bytes": got.direct_bytes,
            "in_place_bytes": 0,
            "fingerprints": fingerprints,
            "attest_s": time.perf_counter() - start,
        }

    def load_adapter(self, adapter: Mapping[str, torch.Tensor], scale: float) -> None:
        """Serve the base weights plus ``scale`` * B A of every adapter pair (the base itself kept intact)."""
        raise NotImplementedError(f"{type(self).__name__} cannot apply LoRA adapters")

    def weight_dtype(self) -> torch.dtype | None:
        """The dtype every floating weight of the engine is held in, or None where they differ or the backend cannot
        tell. A full push travels in it (the consumer casts before sending what the engine would cast on arrival:
        bf16 engine weights under fp32 masters take half the bytes); None leaves pushes in the trainer's dtypes."""
        return None

    def weight_destinations(self) -> Mapping[str, torch.Tensor]:
        """Tensors a weight push may be received into in place, by name (the default, none: everything goes
        through ``load_weights``)."""
        return {}

    def sleep(self) -> None:
        """Free accelerator memory between rollouts (nothing to free by default)."""

    def wake(self) -> None:
        """Undo ``sleep``."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The engine's current weights under the Hugging Face names (tests compare them with the consumer's)."""
        raise NotImplementedError

    @staticmethod
    def _as_batches(weights) -> Iterable[Mapping[str, torch.Tensor]]:
        return [weights] if isinstance(weights, Mapping) else weights
