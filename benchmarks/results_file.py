"""A benchmark's raw result as a file: ``benchmarks/results/<name>.json`` holding the command that made it, the
commit, the package versions, the machine (CPU, its vector features, cores and a one-thread matmul probe) and the
result itself. Docs quote these files, not numbers typed by hand."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from coati.provenance import commit, machine, matmul_probe, versions

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, result, argv: list[str] | None = None) -> Path:
    """Write ``result`` with its provenance to ``benchmarks/results/<name>.json``; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join(["python", *(argv if argv is not None else sys.argv)]),
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "machine": {**machine(), "matmul_gflops_1_thread": matmul_probe()},
        "result": result,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
