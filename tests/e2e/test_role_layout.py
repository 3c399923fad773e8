"""OpenRLHF's role layouts on a simulated 6-node cluster (``layout_job.py``, in its own process so the session's
Ray cluster is untouched): the guide's layout, the producer, reference, reward model, critic and actor a node each,
and its colocated one, every model on one node beside the producer's; each actor lands where the plan put it, the
roles on distinct nodes in the first and on one node in the second; the first trains a PPO step."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coati.testing import build_tiny_model, build_tiny_reward_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.background
def test_the_guides_layouts_land_where_planned_and_train(tmp_path):
    tiny, rm = build_tiny_model(tmp_path / "policy", vocab_multiple=8), build_tiny_reward_model(tmp_path / "rm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/e2e/layout_job.py"), str(tiny), str(rm)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("LAYOUT ")), None)
    assert line is not None, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(line[len("LAYOUT ") :])
    guide, colocated = result["guide"], result["colocated"]
    for run in (guide, colocated):
        assert run["actual"] == run["planned"]
    assert guide["trained"]
    one_each = [nodes[0] for nodes in guide["actual"].values()]
    assert all(len(nodes) == 1 for nodes in guide["actual"].values())
    assert len(set(one_each)) == 5  # five roles, five nodes
    models = {n for role, nodes in colocated["actual"].items() if role != "producer" for n in nodes}
    assert len(models) == 1 and models.isdisjoint(colocated["actual"]["producer"])
