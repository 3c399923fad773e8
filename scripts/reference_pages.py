"""The reference pages, generated from the code so they cannot drift from it: ``docs/reference/config.md`` lists every
field of every section of the config tree with its flag(s), type, default and meaning (the field's docstring);
``docs/reference/metrics.md`` every metric a run logs, from the registry in ``coati/distributed/loggers/metrics.py``.
``python scripts/reference_pages.py`` writes them; ``--check`` exits 1 if a page differs (``make check`` and the test
suite run the check)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coati.distributed.config.cli import flags  # noqa: E402
from coati.distributed.loggers.metrics import METRICS  # noqa: E402

REFERENCE = ROOT / "docs" / "reference"

INTRO = """# Configuration reference

Every field of the config tree, by section, generated from the tree's own field docstrings by
`python scripts/reference_pages.py`. A field is set in a config file (`--config run.yaml`, the section as a mapping:
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


METRICS_INTRO = """# Metrics

Every metric a run logs in `metrics.jsonl` (and TensorBoard or wandb), with its meaning and unit, generated from the
registry in `coati/distributed/loggers/metrics.py` by `python scripts/reference_pages.py`. A name with a `{...}` part
stands for a family (`reward/component/math`). Counts are per step; means are over the step's trained rows or tokens
unless the meaning says otherwise. A run that logs a name the registry lacks warns once; the test suite fails on it.
"""


def render_metrics() -> str:
    out = [METRICS_INTRO]
    sections: dict[str, list] = {}
    for key, metric in METRICS.items():
        sections.setdefault(key.split("/")[0] if "/" in key else "step", []).append((key, metric))
    for section, rows in sections.items():
        out.append(f"\n## {section}\n")
        out.append("| metric | unit | meaning |")
        out.append("|---|---|---|")
        out += [f"| `{key}` | {m.unit} | {_cell(m.meaning)} |" for key, m in rows]
    return "\n".join(out) + "\n"


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


RESULTS = ROOT / "benchmarks" / "results"

RESULTS_INTRO = """# Result files

Every committed result file under `benchmarks/results/`, rendered by `python scripts/reference_pages.py`: the command
that made it, the commit it ran, when, on what machine, and its values. A benchmark writes its file when a piece of
work is finished. Machines of one name differ: in fp32 by up to 2x, and in bf16 by 100x where one has AVX512-BF16 or AMX
and another has not (its one-thread matmul probe is shown where recorded), so times compare only within one file.
"""


def _leaves(value, prefix: str = ""):
    """(dotted key, value) of the numbers, booleans and short strings in a result, lists of them shortened."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) and value:
            shown = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in value[:8])
            yield prefix, f"[{shown}{', ...' if len(value) > 8 else ''}]"
        else:
            for i, v in enumerate(value[:12]):
                yield from _leaves(v, f"{prefix}[{i}]")
    elif isinstance(value, bool) or value is None:
        yield prefix, str(value).lower()
    elif isinstance(value, float):
        yield prefix, f"{value:.4g}"
    elif isinstance(value, int):
        yield prefix, str(value)
    elif isinstance(value, str) and len(value) <= 80:
        yield prefix, value


def render_results() -> str:
    import json

    out = [RESULTS_INTRO]
    for path in sorted(RESULTS.glob("*.json")):
        record = json.loads(path.read_text())
        m = record.get("machine", {})
        probe = m.get("matmul_gflops_1_thread") or record.get("result", {}).get("env", {}).get("matmul_gflops_1_thread")
        features = (", ".join(m["isa"]) or "no AVX2/AVX-512") if "isa" in m else "vector features not recorded"
        speed = (
            f"; matmul probe {probe.get('float32', '?')} fp32, {probe.get('bfloat16', '?')} bf16 GFLOP/s on one thread"
            if probe
            else ""
        )
        out.append(f"\n## {path.stem}\n")
        out.append(f"`{record.get('command', '?')}`\n")
        out.append(
            f"commit `{str(record.get('commit', '?'))[:10]}`, {record.get('date', '?')}, {m.get('cpu', '?')} "
            f"({features}; {m.get('cores', '?')} cores{speed}), Python {m.get('python', '?')}\n"
        )
        out.append("| value | |")
        out.append("|---|---|")
        out += [f"| `{k}` | {_cell(v)} |" for k, v in _leaves(record.get("result"))][:150]
    return "\n".join(out) + "\n"


def pages() -> dict[Path, str]:
    return {
        REFERENCE / "config.md": render(),
        REFERENCE / "metrics.md": render_metrics(),
        REFERENCE / "results.md": render_results(),
    }


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = [path for path, text in pages().items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path.relative_to(ROOT)} is not the code's; run python scripts/reference_pages.py")
        return 1 if stale else 0
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for path, text in pages().items():
        path.write_text(text)
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
