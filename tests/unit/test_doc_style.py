"""The docs' shape check (``scripts/doc_style.py``, run by ``make check``): it fails a list that starts right under a
paragraph (Markdown renders it as part of the paragraph), a paragraph over the word limit, and a page that does not
open with an example; the project's pages pass it."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("doc_style", ROOT / "scripts" / "doc_style.py")
doc_style = importlib.util.module_from_spec(spec)
spec.loader.exec_module(doc_style)


def _problems(tmp_path, monkeypatch, text: str) -> list[str]:
    monkeypatch.setattr(doc_style, "ROOT", tmp_path)
    (tmp_path / "docs").mkdir(exist_ok=True)
    page = tmp_path / "docs" / "page.md"
    page.write_text(text)
    return doc_style.problems(page)


def test_a_list_without_its_blank_line_is_found(tmp_path, monkeypatch):
    text = "# Page\n\n```bash\nrun\n```\n\nThe guarantees:\n- one\n- two\n"
    assert _problems(tmp_path, monkeypatch, text) == [
        "docs/page.md:8: a list starts right under a paragraph; add a blank line before it"
    ]
    assert _problems(tmp_path, monkeypatch, text.replace(":\n-", ":\n\n-")) == []


def test_a_wall_of_text_and_a_page_without_an_example_are_found(tmp_path, monkeypatch):
    wall = " ".join(["word"] * 121)
    found = _problems(tmp_path, monkeypatch, f"# Page\n\nIntro.\n\n{wall}\n\nMore.\n\n```bash\nrun\n```\n")
    assert found == [
        "docs/page.md:5: a paragraph of 121 words (at most 120); split it or make a list",
        "docs/page.md:1: the page does not open with an example (a code block in its first blocks)",
    ]


def test_the_project_s_pages_pass():
    assert [p for page in doc_style.pages() for p in doc_style.problems(page)] == []
