"""Name -> object registries shared by every seam (estimators, losses, rewards, backends, algorithms).

A registry rejects duplicate names and answers an unknown name with the list of known ones, so a typo in a flag fails
at launch with the fix in the message instead of deep inside an actor.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A dict of named entries of one kind (``kind`` appears in error messages)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None):
        """Register ``obj`` under ``name``; without ``obj`` returns a decorator."""
        if obj is None:

            def decorator(fn: T) -> T:
                self.register(name, fn)
                return fn

            return decorator
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self._entries[name] = obj
        return obj

    def get(self, name: str) -> T:
        if name not in self._entries:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    __getitem__ = get

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self):
        return self._entries.items()

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def resolve_callable(name: str, registry: Registry[Callable]) -> Callable:
    """Look ``name`` up in ``registry``, or import it when written as a dotted path ``package.module:function``."""
    if ":" not in name:
        if "." in name and name not in registry:
            module, _, attr = name.rpartition(".")
            raise KeyError(
                f"unknown {registry.kind} {name!r}; a function of a module is named module:function "
                f"({module}:{attr}); registered: {', '.join(sorted(registry.names()))}"
            )
        return registry.get(name)
    import importlib

    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r} for {registry.kind} {name!r}: {e}") from e
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (asked for {registry.kind} {name!r})")
    return getattr(module, attr)
