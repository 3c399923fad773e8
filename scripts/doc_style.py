"""The docs' shape, checked by ``make check``: each page opens with an example (a code block among the first blocks
after its title), no paragraph or list item runs over ``MAX_WORDS`` words, and a list has a blank line before it
(without one Markdown renders it as part of the paragraph above, which ``mkdocs --strict`` does not catch).

    python scripts/doc_style.py --check     # exit 1 listing every problem as file:line: what
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS = 120
"""the longest paragraph (or list item) a page may hold"""
EXAMPLE_WITHIN = 3
"""the blocks after a page's title among which its first example (a fenced code block) must be"""
GENERATED = {"docs/reference/config.md", "docs/reference/metrics.md", "docs/reference/results.md"}
"""pages written from the code (scripts/reference_pages.py): tables, checked there"""
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if str(p.relative_to(ROOT)) not in GENERATED]


def blocks(lines: list[str]) -> list[tuple[int, str, list[str]]]:
    """The page as (first line number, kind, lines): kind is fence, heading, table, list, html or paragraph. A list
    block is one item with its continuation lines."""
    out: list[tuple[int, str, list[str]]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        start = i
        if line.lstrip().startswith("```"):
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                i += 1
            out.append((start + 1, "fence", lines[start : i + 1]))
            i += 1
            continue
        if line.startswith("#"):
            out.append((start + 1, "heading", [line]))
            i += 1
            continue
        kind = "table" if line.lstrip().startswith("|") else "html" if line.lstrip().startswith("<") else None
        if kind is None:
            kind = "list" if LIST_ITEM.match(line) else "paragraph"
        i += 1
        while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith("```"):
            nxt = lines[i]
            if nxt.startswith("#") or (kind == "list" and LIST_ITEM.match(nxt)):
                break
            if kind == "paragraph" and LIST_ITEM.match(nxt):
                out.append((start + 1, kind, lines[start:i]))
                out.append((i + 1, "list-without-blank", [nxt]))
                start, kind = i, "list"
            i += 1
        out.append((start + 1, kind, lines[start:i]))
    return out


def problems(path: Path) -> list[str]:
    name = str(path.relative_to(ROOT))
    found = []
    page = blocks(path.read_text().splitlines())
    for line, kind, text in page:
        words = len(" ".join(text).split())
        if kind == "list-without-blank":
            found.append(f"{name}:{line}: a list starts right under a paragraph; add a blank line before it")
        elif kind in ("paragraph", "list") and words > MAX_WORDS:
            what = "paragraph" if kind == "paragraph" else "list item"
            found.append(f"{name}:{line}: a {what} of {words} words (at most {MAX_WORDS}); split it or make a list")
    body = [b for b in page if b[1] != "list-without-blank"]
    if body and body[0][1] == "heading" and body[0][2][0].startswith("# "):
        body = body[1:]
    if path.name != "README.md" and not any(kind == "fence" for _, kind, _ in body[:EXAMPLE_WITHIN]):
        found.append(f"{name}:1: the page does not open with an example (a code block in its first blocks)")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page breaks a rule")
    parser.parse_args(argv)
    found = [p for path in pages() for p in problems(path)]
    for problem in found:
        print(problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
