"""The inference-backend seam: a producer holds one backend and asks it for rollouts and weight loads.

``generate(prompts, n, greedy)`` takes tokenised prompts and returns a ``RolloutBatch`` (rows prompt-major: the n
completions of prompt i are rows i*n .. i*n+n-1, ``group_ids`` = i) with the loss mask and the rollout log-probs
already filled in. ``load_weights`` takes a dict of named tensors, a partial dict (one pipeline stage), or an
iterable of dicts (buckets streamed by ``ray_broadcast_tensor_dict``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from coati.distributed.config import GenerationConfig
from coati.distributed.rollout import RolloutBatch


class InferenceBackend:
    """Base class; one implementation per module, chosen by name from ``BACKEND_MAP``."""

    OPTIONS: dict[str, str] = {}
    """engine options a user may pass (``inference_model_config`` keys beside ``path``), with what each does"""

    def __init__(self, model_path: str, generation: GenerationConfig, **options):
        self.check_options(options)
        self.model_path = model_path
        self.generation = generation
        self.options = options

    @classmethod
    def check_options(cls, options: Mapping) -> None:
        """Refuse options this backend does not know, naming them and the known ones (nothing is ignored)."""
        unknown = sorted(set(options) - set(cls.OPTIONS))
        if unknown:
            known = ", ".join(f"{k} ({v})" for k, v in cls.OPTIONS.items()) or "none"
            raise ValueError(f"inference option(s) {unknown} are not known to {cls.__name__}; known: {known}")

    @classmethod
    def check_available(cls) -> None:
        """Raise ImportError, with the install command, when the engine is not installed."""

    def generate(self, prompts: list[list[int]], n: int = 1, greedy: bool = False) -> RolloutBatch:
        raise NotImplementedError

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[Mapping[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def weight_destinations(self) -> Mapping[str, torch.Tensor]:
        """Tensors a weight push may be received into in place, by name (the default, none: everything goes
        through ``load_weights``)."""
        return {}

    def sleep(self) -> None:
        """Free accelerator memory between rollouts (optional)."""

    def wake(self) -> None:
        """Undo ``sleep`` (optional)."""

    @staticmethod
    def _require(module: str, hint: str) -> None:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise ImportError(f"the {module} inference backend needs {module} installed: {hint}")

    @staticmethod
    def _as_batches(weights) -> Iterable[Mapping[str, torch.Tensor]]:
        return [weights] if isinstance(weights, Mapping) else weights
