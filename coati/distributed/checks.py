"""What every config module shares: the field docstrings that become ``--help``, and the checks that turn bad input
into a ValueError naming the value and the fix."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from functools import lru_cache


def field_docs(cls) -> dict[str, str]:
    """The string literal under each annotated field of dataclass ``cls`` (and its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        docs.update(_class_field_docs(klass))
    return docs


@lru_cache(maxsize=None)
def _class_field_docs(klass) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    body = tree.body[0].body
    out = {}
    for node, nxt in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


SEED_MAX = 2**32 - 1


def seed_in_range(name: str, value) -> None:
    """A seed torch, numpy and the engines all accept: an integer in 0..2**32-1."""
    require(
        isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SEED_MAX,
        f"{name} must be an integer in 0..{SEED_MAX} (numpy and the engines refuse others), got {value!r}",
    )


def finite(obj, *names: str, low: float | None = None, strict: bool = False, where: str | None = None) -> None:
    """Each field a finite number, at least ``low`` (above it when ``strict``); errors name it ``where.name`` (by
    default the section's class)."""
    import math

    for name in names:
        value = getattr(obj, name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        bound = "" if low is None else f" {'>' if strict else '>='} {low:g}"
        if ok and low is not None:
            ok = value > low if strict else value >= low
        require(ok, f"{where or type(obj).__name__}.{name} must be a finite number{bound}, got {value!r}")


def positive(obj, *names: str, where: str | None = None) -> None:
    for name in names:
        value = getattr(obj, name)
        require(
            isinstance(value, int) and value > 0,
            f"{where or type(obj).__name__}.{name} must be a positive integer, got {value!r}",
        )


def divides(small_name: str, small: int, big_name: str, big: int) -> None:
    if big % small:
        lower = max(d for d in range(1, min(small, big) + 1) if big % d == 0)
        upper = next((m for m in range(small, big + 1) if big % m == 0), None)
        choices = f"{lower} or {upper}" if upper is not None else f"{lower} (at most {big_name})"
        raise ValueError(
            f"{big_name}={big} is not divisible by {small_name}={small}; "
            f"use {small_name}={choices}, or change {big_name}"
        )
