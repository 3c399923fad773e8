"""ColossalChat's import path for the backends: ``from coati.distributed.inference_backend import BACKEND_MAP``.
The backends live in ``inference/``."""

from coati.distributed.inference import BACKEND_MAP

__all__ = ["BACKEND_MAP"]
