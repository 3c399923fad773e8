"""A code block that a page marks ``<!-- source: FILE:NAME -->`` is the source of NAME in FILE, as it is: pages show
what the tests run, not a copy that drifts (``python scripts/doc_sources.py`` rewrites them)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("doc_sources", ROOT / "scripts" / "doc_sources.py")
doc_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(doc_sources)


def test_marked_code_blocks_are_the_sources_they_name():
    assert any(file == "tests/e2e/test_colossalchat.py" for _, file, _, _ in doc_sources.blocks()), (
        "ColossalChat's call"
    )
    assert doc_sources.stale() == [], "run python scripts/doc_sources.py"


def test_every_troubleshooting_message_is_one_the_code_writes_and_a_test_asserts():
    import re

    rows = re.findall(r"^\| `([^`]+)` \|", (ROOT / "docs" / "troubleshooting.md").read_text(), re.M)
    assert len(rows) >= 15, rows
    code = "".join(p.read_text() for p in (ROOT / "coati").rglob("*.py"))
    tests = "".join(p.read_text() for p in (ROOT / "tests").rglob("*.py") if p.name != "test_doc_sources.py")
    assert [m for m in rows if m not in code] == [], "messages the code does not write"
    assert [m for m in rows if m not in tests] == [], "messages no test asserts"


def test_the_reference_pages_are_the_code_s():
    """docs/reference/config.md and metrics.md are what scripts/reference_pages.py renders from the config tree and
    the metrics registry: every field, flag and default, every metric, none missing."""
    import importlib.util

    from coati.distributed.loggers.metrics import METRICS

    spec = importlib.util.spec_from_file_location("reference_pages", ROOT / "scripts" / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for path, text in module.pages().items():
        assert path.read_text() == text, path
    assert all(f"`{key}`" in module.render_metrics() for key in METRICS)
    from coati.distributed.config.cli import flags

    page = module.render()
    assert all(f"`{f.names[-1]}`" in page for f in flags())
