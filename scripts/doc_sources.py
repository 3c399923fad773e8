"""Code blocks of the docs that show a source file's function or class as it is: a block under the marker
``<!-- source: FILE:NAME -->`` is NAME's source in FILE. ``python scripts/doc_sources.py`` rewrites every marked
block from its source; ``--check`` exits 1 naming each block that differs (the test suite runs the check)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(
    r"(?P<head><!-- source: (?P<file>[^:\s]+):(?P<name>\w+) -->\n```python\n)(?P<code>.*?)(?P<tail>\n```)", re.S
)


def source_of(file: str, name: str) -> str:
    text = (ROOT / file).read_text()
    node = next((n for n in ast.parse(text).body if getattr(n, "name", None) == name), None)
    if node is None:
        raise ValueError(f"{file} defines no {name} at its top level")
    return ast.get_source_segment(text, node)


def blocks() -> list[tuple[Path, str, str, str]]:
    """(page, file, name, the block's code) for every marked block under docs/."""
    return [
        (page, m["file"], m["name"], m["code"])
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for m in MARK.finditer(page.read_text())
    ]


def stale() -> list[str]:
    return [
        f"{page.relative_to(ROOT)}: {file}:{name}"
        for page, file, name, code in blocks()
        if code != source_of(file, name)
    ]


def rewrite() -> None:
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        new = MARK.sub(lambda m: m["head"] + source_of(m["file"], m["name"]) + m["tail"], text)
        if new != text:
            page.write_text(new)


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        problems = stale()
        for p in problems:
            print(f"stale code block: {p}; run python scripts/doc_sources.py")
        sys.exit(1 if problems else 0)
    rewrite()
