"""The configuration reference page, generated from the config tree: ``docs/reference/config.md`` lists every field
of every section with its flag(s), type, default and meaning (the field's docstring), so the page cannot drift from
the code. ``python scripts/config_reference.py`` writes it; ``--check`` exits 1 if the page differs (``make check``
and the test suite run the check)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coati.distributed.config.cli import flags  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "config.md"

INTRO = """# Configuration reference

Every field of the config tree, by section, generated from the tree's own field docstrings by
`python scripts/config_reference.py`. A field is set in a config file (`--config run.yaml`, the section as a mapping:
`consumer: {learning_rate: 1.0e-6}`), by its flag, or as a keyword of `Config` in Python; flags override the file.
`--print-config` prints the resolved tree of a command, `--help-all` every flag. The `algorithm` section overrides
fields of the preset that `--algo` names; its defaults are the preset's (see [Algorithms](../algorithms.md)).
"""


def _type(kind: type, optional: bool) -> str:
    name = getattr(kind, "__name__", str(kind))
    name = {"tuple": "list", "str": "text", "int": "integer", "float": "number", "bool": "true/false"}.get(name, name)
    return f"{name} or null" if optional else name


def _default(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    sections: dict[str, list] = {}
    for flag in flags():
        section = flag.key.split(".")[0] if "." in flag.key else "(top level)"
        sections.setdefault(section, []).append(flag)
    out = [INTRO]
    for section, rows in sections.items():
        out.append(f"\n## {section}\n")
        out.append("| field | flag | type | default | meaning |")
        out.append("|---|---|---|---|---|")
        for f in rows:
            field = f.key.split(".", 1)[1] if "." in f.key else f.key
            names = ", ".join(f"`{n}`" for n in f.names)
            default = "the preset's" if section == "algorithm" else _default(f.default)
            out.append(f"| `{field}` | {names} | {_type(f.kind, f.optional)} | {default} | {_cell(f.help)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is not the config tree's; run python scripts/config_reference.py")
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(PAGE.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
