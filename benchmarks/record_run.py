"""A finished run folder as a result file: ``python benchmarks/record_run.py RUN NAME`` writes
``benchmarks/results/NAME.json`` with the run's summary, its env.json (the commit it ran, versions, machine and matmul
probe) and command, so that docs quote a run from a committed file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result


def main(run: str, name: str) -> Path:
    folder = Path(run)
    summary = json.loads((folder / "summary.json").read_text())
    summary.pop("plots", None)
    record = {
        "summary": summary,
        "env": json.loads((folder / "env.json").read_text()),
        "command": (folder / "command.txt").read_text().strip(),
    }
    return write_result(name, record)


if __name__ == "__main__":
    print(main(*sys.argv[1:3]))
