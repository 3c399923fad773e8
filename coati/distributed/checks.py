"""What every config module shares: the field docstrings that become ``--help``, and the checks that turn bad input
into a ValueError naming the value and the fix."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from functools import cache


def field_docs(cls) -> dict[str, str]:
    """The string literal under each annotated field of dataclass ``cls`` (and its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass) or not isinstance(klass, type):
            continue
        docs.update(_class_field_docs(klass))
    return docs


@cache
def _class_field_docs(klass: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef), klass
    body: list[ast.stmt | None] = [*cls.body, None]
    out = {}
    for node, nxt in zip(body[:-1], body[1:], strict=True):
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


MAX_JSON_DEPTH = 64
"""how deeply a data row or config file may nest (a row 100k levels deep crashed the run later, in pickling)"""


def strict_json(text: str, where: str):
    """``json.loads`` of ``text`` that refuses, naming ``where``, a key repeated in one object (plain JSON keeps
    the last silently) and nesting too deep for the parser. Malformed JSON raises ``json.JSONDecodeError`` as
    ``json.loads``. What it holds is checked by ``check_plain_data`` where the caller makes a row or a config of it."""
    import json

    def pairs(items):
        seen = {}
        for key, value in items:
            if key in seen:
                raise ValueError(f"{where}: the key {key!r} appears twice in one object; keep one")
            seen[key] = value
        return seen

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply to read (at most {MAX_JSON_DEPTH} levels)") from None
    return value


def check_plain_data(value, where: str) -> None:
    """Refuse data nested deeper than ``MAX_JSON_DEPTH`` or holding a string with a lone surrogate (``"\\ud800"``:
    no character, so the text cannot be written out again)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{where}: nested more than {MAX_JSON_DEPTH} levels deep; flatten the data")
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(
                    f"{where}: the text {node[max(0, e.start - 10) : e.start]!r}... holds a lone surrogate "
                    f"(\\u{ord(node[e.start]):04x}), which is no character; fix the text"
                ) from None
        elif isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
            stack.extend((k, depth + 1) for k in node if isinstance(k, str))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def check_finite_tree(config, prefix: str = "") -> None:
    """Every float in a config tree (its sections' fields, and the numbers inside their option dicts) is finite:
    ``--temperature inf`` or a NaN reward option would pass a range check and poison every step."""
    import math

    for f in dataclasses.fields(config):
        value, name = getattr(config, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_finite_tree(value, f"{name}.")
            continue
        stack = [(name, value)]
        while stack:
            where, node = stack.pop()
            if isinstance(node, float) and not math.isfinite(node):
                raise ValueError(f"{where}={node!r} is not a finite number; give a finite value")
            if isinstance(node, dict):
                stack.extend((f"{where}.{k}", v) for k, v in node.items())
            elif isinstance(node, (list, tuple)):
                stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))


def as_strings(value, name: str) -> tuple[str, ...]:
    """A setting that holds a list of strings, as a tuple: a single string is one item, taken whole (``tuple()`` of
    ``"</answer>"`` would make nine one-character items)."""
    if isinstance(value, str):
        return (value,)
    require(
        isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value),
        f"{name} must be a list of strings, got {value!r}",
    )
    return tuple(value)


_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]}
"""terminal control characters (ESC among them) but newline and tab, as escapes: model output printed raw could
move the cursor, retitle the terminal or hide lines"""


def console_safe(text: str) -> str:
    """``text`` with terminal control characters escaped (``\\x1b[2J`` prints as text, not as a command)."""
    return str(text).translate(_CONTROLS)
