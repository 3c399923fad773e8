"""Conventions as tests: registered pieces are documented, the README matches the registries, pure modules stay pure."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from coati.distributed.algo import (
    ADVANTAGE_ESTIMATORS,
    ALGO_MAP,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    OFF_POLICY_CORRECTIONS,
    POLICY_LOSSES,
)

ROOT = Path(__file__).resolve().parents[2]
PURE_DIR = ROOT / "coati" / "distributed" / "algo"
PURE_MODULES = sorted(PURE_DIR.glob("*.py")) + [
    ROOT / "coati" / "registry.py",
    *(
        ROOT / "coati" / "distributed" / name
        for name in (
            "checks.py",
            "record.py",
            "guards.py",
            "inference/config.py",
            "rollout/config.py",
            "trainer/config.py",
            "reward/config.py",
            "config/tree.py",
            "transport/wire_layout.py",
            "driver/rollout_buffer.py",
            "trainer/step_metrics.py",
            "reward/code_runner.py",
            "reward/compose.py",
        )
    ),
    *sorted((ROOT / "coati" / "distributed" / "envs").glob("*.py")),
]


@pytest.mark.parametrize(
    "registry", [ADVANTAGE_ESTIMATORS, POLICY_LOSSES, LOSS_AGGREGATIONS, KL_ESTIMATORS, OFF_POLICY_CORRECTIONS]
)
def test_registered_functions_have_docstrings(registry):
    for name, fn in registry.items():
        assert fn.__doc__ and len(fn.__doc__.strip()) > 20, f"{registry.kind} {name!r} has no docstring"


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: p.name)
def test_pure_modules_import_no_ray_and_touch_no_cuda(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "ray" for a in node.names), f"{path.name} imports ray"
        if isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] != "ray", f"{path.name} imports ray"
        if isinstance(node, ast.Attribute):
            assert node.attr != "cuda", f"{path.name} touches .cuda"
    assert path.read_text().count('"cuda"') == 0, f"{path.name} names a cuda device"


def readme_table(heading: str, page: str = "README.md") -> dict[str, list[str]]:
    text = (ROOT / page).read_text()
    section = text.split(heading, 1)[1]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not set(line) <= set("|-: "):
            cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    rows.pop("name", None)
    return rows


@pytest.mark.parametrize("page, heading", [("README.md", "## Algorithms"), ("docs/algorithms.md", "# Algorithms")])
def test_readme_algorithm_table_matches_registry(page, heading):
    rows = readme_table(heading, page)
    assert sorted(rows) == sorted(ALGO_MAP.names())
    for name, cells in rows.items():
        preset = ALGO_MAP[name]
        estimator, loss, agg, clip, beta = cells[:5]
        assert estimator == preset.advantage_estimator, name
        assert loss == preset.policy_loss, name
        assert agg == preset.loss_agg_mode, name
        assert clip == f"{preset.clip_eps_low:g}/{preset.clip_eps_high:g}", name
        assert float(beta) == preset.beta, name


def test_algo_map_imports_without_starting_actors():
    code = (
        "import sys; from coati.distributed.launch import ALGO_MAP; "
        "assert 'DAPO' in ALGO_MAP; "
        "import ray; assert not ray.is_initialized(), 'ray was initialised by an import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
