"""Inference backends, chosen by name. ``BACKEND_MAP`` names each backend's options class (``options``: its options,
checks and capabilities, without torch or the engine); the engine class it names is imported only where an engine
starts (``backend_class``), so vLLM and SGLang load only when selected."""

from __future__ import annotations

import importlib

from coati.distributed.inference.hints import INSTALL_HINTS
from coati.registry import Registry

BACKEND_MAP: Registry = Registry("inference backend")
BACKEND_MAP.register("transformers", "coati.distributed.inference.options:TransformersOptions")
BACKEND_MAP.register("vllm", "coati.distributed.inference.vllm_options:VLLMOptions")
BACKEND_MAP.register("sglang", "coati.distributed.inference.options:SGLangOptions")

__all__ = ["BACKEND_MAP", "INSTALL_HINTS", "backend_class", "backend_options"]


def _load(path: str):
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def backend_options(name: str):
    """The options class of the backend registered as ``name`` (its checks and capabilities); an ImportError with
    the install command if its engine is missing."""
    cls = _load(BACKEND_MAP.get(name))
    cls.check_available()
    return cls


def backend_class(name: str):
    """The engine class of the backend registered as ``name``; an ImportError with the install command if its
    engine is missing."""
    return _load(backend_options(name).ENGINE)
