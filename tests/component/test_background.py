"""The suite's background tests (``tests/background.py``): a marked test runs in a second pytest process at the lowest
CPU priority, and the suite reports its outcome (a failure with its own text, a skip with its reason), after the
suite's own tests."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests import background

ROOT = Path(__file__).resolve().parents[2]


def run_probe(probe: Path, **env) -> subprocess.CompletedProcess:
    """Run the probe suite with the background process as ``env`` sets it (on unless COATI_BACKGROUND=0)."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in (background.RESULTS_ENV, "COATI_BACKGROUND")},
        **env,
        "BACKGROUND_PROBE": str(probe),
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests/component/background_probe.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_marked_tests_run_beside_at_the_lowest_priority_and_report_in_the_suite(tmp_path):
    probe = tmp_path / "where.jsonl"
    out = run_probe(probe)
    assert out.returncode == 1, out.stdout[-3000:]  # one failure
    lines = out.stdout.splitlines()
    outcome = {
        line.split()[1].split("::")[-1]: line.split()[0] for line in lines if line.startswith(("PASSED ", "FAILED "))
    }
    assert outcome == {
        "test_in_the_suite": "PASSED",
        "test_passes_beside": "PASSED",
        "test_fails_beside": "FAILED",
    }, outcome
    assert "the background failure's own message" in out.stdout and "(call, in the background process)" in out.stdout
    assert any(line.startswith("SKIPPED") and "a reason given beside" in line for line in lines), lines
    assert "background process (nice 19): 1 failed, 1 passed, 1 skipped" in out.stdout
    # the suite's own test first, in the suite's process; the marked ones in another, at niceness 19
    where = {r["test"]: r for r in map(json.loads, probe.read_text().splitlines())}
    assert where["suite"]["nice"] == os.nice(0) != 19
    assert where["passes"]["nice"] == where["fails"]["nice"] == 19
    assert where["passes"]["pid"] == where["fails"]["pid"] != where["suite"]["pid"]


def test_with_the_background_off_marked_tests_run_in_the_suite_s_process(tmp_path):
    probe = tmp_path / "where.jsonl"
    out = run_probe(probe, COATI_BACKGROUND="0")
    assert out.returncode == 1 and "background process (nice 19)" not in out.stdout, out.stdout[-3000:]
    where = {r["test"]: r for r in map(json.loads, probe.read_text().splitlines())}
    assert where["suite"]["pid"] == where["passes"]["pid"] == where["fails"]["pid"]
    assert where["passes"]["nice"] == os.nice(0) != 19


def test_the_second_process_s_orphans_are_reaped_beside_not_left_to_the_suite():
    """The second process runs under a reaper (``background.reap``): what it leaves behind is adopted, stopped and
    reaped there, never re-parented to the suite's process (a subreaper once it has run a sandbox) as a zombie."""
    from coati.distributed.reward.processes import become_subreaper

    become_subreaper()
    leave = "import subprocess; print(subprocess.Popen(['sleep', '30']).pid)"  # ends, its child still running
    out = subprocess.run(
        [sys.executable, background.__file__, sys.executable, "-c", leave], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    orphan = int(out.stdout)
    assert not os.path.exists(f"/proc/{orphan}"), Path(f"/proc/{orphan}/stat").read_text()


def test_the_second_process_is_reaped_as_soon_as_it_ends(tmp_path, monkeypatch):
    """Its end is waited for at once, not at the suite's next look at it: a sandbox test counting the zombies of the
    suite's process found the second process there when it ended before the suite's last test."""
    from coati.distributed.reward.processes import _stat_fields

    monkeypatch.setenv("BACKGROUND_PROBE", str(tmp_path / "where.jsonl"))
    beside = background.Beside(["tests/component/background_probe.py::test_passes_beside"])
    deadline = time.monotonic() + 120
    while (fields := _stat_fields(beside.proc.pid)) and fields[1] != "Z" and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # ended: a moment for the reaping
    assert _stat_fields(beside.proc.pid) is None, beside.tail()
    assert [r["outcome"] for r in beside.result("tests/component/background_probe.py::test_passes_beside")] == [
        "passed"
    ] * 3
    assert beside.ended is not None
