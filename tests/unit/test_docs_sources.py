"""A code block that a page marks ``<!-- source: FILE:NAME -->`` is the source of NAME in FILE, as it is: pages show
what the tests run, not a copy that drifts."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"<!-- source: (?P<file>[^:\s]+):(?P<name>\w+) -->\n```python\n(?P<code>.*?)\n```", re.S)


def marked_blocks():
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for m in MARK.finditer(page.read_text()):
            yield page.relative_to(ROOT), m["file"], m["name"], m["code"]


def source_of(file: str, name: str) -> str:
    text = (ROOT / file).read_text()
    node = next(n for n in ast.parse(text).body if getattr(n, "name", None) == name)
    return ast.get_source_segment(text, node)


def test_marked_code_blocks_are_the_sources_they_name():
    blocks = list(marked_blocks())
    assert any(file == "tests/e2e/test_colossalchat.py" for _, file, _, _ in blocks), "the ColossalChat page's call"
    for page, file, name, code in blocks:
        assert code == source_of(file, name), f"{page}: the block marked {file}:{name} is not its source"
