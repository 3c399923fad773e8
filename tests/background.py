"""Tests that run beside the suite: those marked ``background`` go to a second pytest process, started at the lowest
CPU priority (``nice -n 19``) as soon as the suite is collected, so they take the cores while the suite's own tests
wait (on actors, timeouts, process starts) and give them back when those tests compute. In the suite each is replaced
by an item at the end of the run that waits for its result there and reports it (its failure's text, a skip, or a
pass); the second process's slowest tests are listed at the end of the run.

A test fits this only if nothing it asserts depends on how fast it runs (at the lowest priority it may wait long for a
core) and it shares nothing with the suite's process (it gets a Ray cluster and forked-worker servers of its own:
``ray_cluster`` there is the second process's). ``COATI_BACKGROUND=0`` turns it off: the marked tests then run in the
suite's process, as any other. Loaded as a plugin (``-p tests.background``) in the second process, this module
records each test's reports for the suite (``RESULTS_ENV``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS_ENV = "COATI_BACKGROUND_RESULTS"
"""set in the second process: the file its test reports are appended to (one JSON object a line)"""
WAIT_S = 3600
"""the longest an item waits for the second process to report its test"""


class Beside:
    """The second pytest process, running ``nodeids`` in order, and the reports it has written so far."""

    def __init__(self, nodeids: list[str]):
        self.folder = tempfile.mkdtemp(prefix="coati-bg-")
        self.results = os.path.join(self.folder, "results.jsonl")
        self.log = os.path.join(self.folder, "pytest.log")
        open(self.results, "w").close()
        env = {**os.environ, RESULTS_ENV: self.results}
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "nice", "-n", "19", sys.executable, "-m", "pytest", "-q"]
                + ["-p", "no:cacheprovider", "-p", "tests.background"]
                + ["--basetemp", os.path.join(self.folder, "tmp"), *nodeids],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its processes (its Ray cluster's too) stopped together if the suite stops
            )
        self.reports: dict[str, list[dict]] = {}
        self._read = 0
        self.started = time.monotonic()
        self.ended: float | None = None
        # Reaped the moment it ends: the suite's process may be a subreaper counting its zombies (a sandbox test).
        threading.Thread(target=self._wait, name="background-wait", daemon=True).start()

    def _wait(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    def _poll(self) -> None:
        with open(self.results) as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind("\n") + 1]  # a line being written is read next time
        self._read += len(complete.encode())
        for line in complete.splitlines():
            report = json.loads(line)
            self.reports.setdefault(report["nodeid"], []).append(report)

    def result(self, nodeid: str) -> list[dict]:
        """Every report of ``nodeid`` (setup, call, teardown), once its teardown's is in; raises if the second
        process ended or ran out of time without it."""
        deadline = time.monotonic() + WAIT_S
        while True:
            ended = self.ended is not None  # before the read: a process that ended has written everything
            self._poll()
            reports = self.reports.get(nodeid, [])
            if any(r["when"] == "teardown" for r in reports):
                return reports
            if ended:
                raise BackgroundFailure(
                    f"the background pytest process ended (status {self.proc.returncode}) without running this "
                    f"test; the end of its output ({self.log}):\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise BackgroundFailure(f"no result from the background pytest process in {WAIT_S} s:\n{self.tail()}")
            time.sleep(0.2)

    def tail(self, chars: int = 4000) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()[-chars:]

    def stop(self) -> None:
        """Stop the second process and everything it started, if it still runs."""
        if self.ended is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


class BackgroundFailure(Exception):
    """A background test's failure, with the text the second process reported for it."""


class BackgroundItem(pytest.Item):
    """Stands in the suite for a test run by the second process: waits for its reports and repeats its outcome."""

    def __init__(self, *, beside: Beside, location, **kwargs):
        super().__init__(**kwargs)
        self.beside = beside
        self._location = location

    def runtest(self) -> None:
        reports = self.beside.result(self.nodeid)
        failed = [r for r in reports if r["outcome"] == "failed"]
        if failed:
            raise BackgroundFailure(
                "\n\n".join(f"({r['when']}, in the background process)\n{r['text']}" for r in failed)
            )
        skipped = [r for r in reports if r["outcome"] == "skipped"]
        if skipped:
            pytest.skip(skipped[0]["text"] or "skipped in the background process")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, BackgroundFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self._location


def take_marked(config, items: list) -> Beside | None:
    """In the suite's process: start the second process on the selected items marked ``background`` and put, at the
    end of ``items``, an item for each that waits for its result there."""
    if os.environ.get(RESULTS_ENV) or os.environ.get("COATI_BACKGROUND", "1") == "0" or config.option.collectonly:
        return None
    marked = [item for item in items if item.get_closest_marker("background") and not _skipped(item)]
    if not marked:
        return None
    beside = Beside([item.nodeid for item in marked])
    stand_ins = [
        BackgroundItem.from_parent(item.parent, name=item.name, beside=beside, location=item.location)
        for item in marked
    ]
    taken = set(map(id, marked))
    items[:] = [item for item in items if id(item) not in taken] + stand_ins
    return beside


def _skipped(item) -> bool:
    return any(mark.name == "skip" for mark in item.iter_markers())


def summary_lines(beside: Beside) -> list[str]:
    """The second process's account for the end of the run: its tests' outcomes, its time, its slowest tests."""
    beside._poll()
    calls = [r for reports in beside.reports.values() for r in reports if r["when"] == "call"]
    outcomes: dict[str, int] = {}
    for reports in beside.reports.values():
        outcome = next((r["outcome"] for r in reports if r["outcome"] != "passed"), "passed")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    end = beside.ended or time.monotonic()
    lines = [
        f"background process (nice 19): {', '.join(f'{n} {o}' for o, n in sorted(outcomes.items()))} "
        f"in {end - beside.started:.0f} s from the suite's collection; its slowest:"
    ]
    for r in sorted(calls, key=lambda r: -r["duration"])[:10]:
        lines.append(f"{r['duration']:8.2f}s call     {r['nodeid']}")
    return lines


# ---- in the second process (loaded with -p tests.background) ------------------------------------------------------


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    record = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "duration": report.duration,
        "text": report.longreprtext if report.outcome != "passed" else "",
    }
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):  # (file, line, "Skipped: reason")
        record["text"] = str(report.longrepr[2]).removeprefix("Skipped: ")
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


# ---- the reaper the second process runs under ------------------------------------------------------------------


def reap(argv: list[str]) -> int:
    """Run ``argv`` as the one who adopts its orphans (a child subreaper), reaping each as it ends; once ``argv``
    has ended, stop what it left behind. Without it the second process's orphans (its Ray clusters' processes) would
    go to the suite's process, a subreaper too once it has run a sandbox, and stay there as zombies."""
    from coati.distributed.reward.processes import become_subreaper

    become_subreaper()
    main = os.posix_spawnp(argv[0], argv, os.environ)
    code = 1
    deadline = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG if deadline is not None else 0)
        except ChildProcessError:
            return code
        if pid == main:
            code = os.waitstatus_to_exitcode(status)
            deadline = time.monotonic() + 10  # what it left: asked to end, then killed
            _signal_children(signal.SIGTERM)
        elif pid == 0:
            if time.monotonic() > deadline:
                _signal_children(signal.SIGKILL)
            time.sleep(0.1)


def _signal_children(signum: int) -> None:
    from coati.distributed.reward.processes import _children

    for pid in _children() or []:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    sys.exit(reap(sys.argv[1:]))
