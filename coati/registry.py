"""Name -> object registries shared by every seam (estimators, losses, rewards, backends, algorithms).

A registry rejects duplicate names and answers an unknown name with the list of known ones, so a typo in a flag fails
at launch with the fix in the message instead of deep inside an actor.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

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
    module_name, _, attr = name.partition(":")
    module = import_user_module(module_name, f"{registry.kind} {name!r}")
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (asked for {registry.kind} {name!r})")
    return getattr(module, attr)


USER_FOLDERS_ENV = "COATI_USER_FOLDERS"
"""the driver's user folders, as the actors it starts get them (``os.pathsep``-separated)"""
USER_FOLDERS: list[str] = []
"""the folders ``module:function`` names are looked up in, before the rest of the path (``use_user_folders``; in an
actor, the driver's, read from ``COATI_USER_FOLDERS`` at the first lookup: a worker forked from a preloaded process
gets its environment after the import)"""


def user_folders(data: list) -> list[str]:
    """Where a run looks for the user's modules: the current folder, then the folder of each data file (a dataset
    folder: itself and the folder holding it), as absolute paths, each once."""
    folders = [os.getcwd()]
    for path in data:
        if isinstance(path, str) and os.path.exists(path):
            path = os.path.abspath(path)
            folders += [path, os.path.dirname(path)] if os.path.isdir(path) else [os.path.dirname(path)]
    return list(dict.fromkeys(folders))


def use_user_folders(folders: list[str]) -> None:
    """Put ``folders`` first on this process's import path, in order (``USER_FOLDERS`` remembers them, so that the
    actors and worker processes this process starts look in the same places)."""
    import importlib
    import sys

    for folder in reversed(folders):
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    USER_FOLDERS[:] = list(dict.fromkeys([*folders, *USER_FOLDERS]))
    importlib.invalidate_caches()


def import_user_module(module_name: str, what: str):
    """``import module_name`` for ``what``; any failure is one ValueError line: where the module was looked for when
    it is missing, else the file and line its import failed at."""
    import importlib
    import sys

    if not USER_FOLDERS and os.environ.get(USER_FOLDERS_ENV):
        USER_FOLDERS[:] = [f for f in os.environ[USER_FOLDERS_ENV].split(os.pathsep) if f]
    if USER_FOLDERS and sys.path[: len(USER_FOLDERS)] != USER_FOLDERS:
        use_user_folders(list(USER_FOLDERS))
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name or module_name.startswith(f"{e.name}."):  # the module itself is missing
            folders = USER_FOLDERS or [p for p in sys.path[:1] if p]
            raise ValueError(
                f"cannot import module {module_name!r} for {what}: no {module_name.replace('.', '/')}.py in "
                f"{', '.join(folders) or 'the current folder'} (looked there first, then on the Python path); put "
                "it in the current folder or beside the data file"
            ) from None
        raise ValueError(f"importing module {module_name!r} for {what} failed at {_where(e)}") from None
    except SyntaxError as e:
        raise ValueError(
            f"module {module_name!r} for {what} has a syntax error at {e.filename}:{e.lineno}: {e.msg}"
        ) from None
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises on import, said in one line
        raise ValueError(f"importing module {module_name!r} for {what} failed at {_where(e)}") from None


def _where(error: BaseException) -> str:
    """``file:line: Type: message`` of the innermost frame of ``error``'s traceback outside the import machinery."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if "importlib" not in f.filename]
    place = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
    message = str(error).splitlines()[0] if str(error) else ""
    return f"{place}{type(error).__name__}: {message}"
