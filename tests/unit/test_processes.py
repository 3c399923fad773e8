"""Waiting for a sandboxed run's process and reading the machine's process table (``reward.processes``)."""

import os
import subprocess
import time

from coati.distributed.reward.processes import process_states, reap_orphans, wait_exit

MIB = b"x" * (1 << 20)  # past a pipe's 64 KiB buffer: a writer blocks until the reader reads


def test_input_is_written_whole_to_a_reader_and_the_wait_ends_with_it():
    proc = subprocess.Popen(["sh", "-c", "wc -c"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert wait_exit(proc, 30, MIB)
    assert proc.returncode == 0 and int(proc.stdout.read()) == len(MIB)


def test_a_program_that_exits_without_reading_its_input_ends_the_wait():
    proc = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    assert wait_exit(proc, 30, MIB) and proc.returncode == 0


def test_a_program_that_neither_reads_nor_exits_is_reported_at_the_deadline():
    for stdin in (MIB, None):
        proc = subprocess.Popen(["sleep", "30"], stdin=subprocess.PIPE)
        start = time.monotonic()
        try:
            assert wait_exit(proc, 0.5, stdin) is False
            assert proc.poll() is None and time.monotonic() - start < 20
        finally:
            proc.kill()
            proc.wait()


def test_process_states_reads_pid_parent_state_and_real_uid():
    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.1)
        ((pid, parent, state, uid),) = process_states([child.pid])
        assert (pid, parent, uid) == (child.pid, os.getpid(), os.getuid()) and state in "SR"
        child.kill()
        child_exited = time.monotonic() + 10
        while process_states([child.pid])[0][2] != "Z" and time.monotonic() < child_exited:
            time.sleep(0.01)
        assert process_states([child.pid])[0][2] == "Z"  # a zombie until reaped
    finally:
        child.kill()
        child.wait()
    assert process_states([child.pid, 2**22 + 1]) == []


def test_reaping_orphans_leaves_other_children_s_status_alone():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while process_states([child.pid])[0][2] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    reap_orphans()
    # still a zombie for its parent to reap (WNOWAIT looks without reaping): it is no bwrap orphan
    assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    assert child.wait(5) == 0


def test_reaping_looks_at_this_process_s_children_only(monkeypatch):
    """Where the kernel lists each thread's children, reaping reads the stat files of this process's children, not of
    every process on the machine (it did so at every sandbox run's end whenever this process had no child)."""
    from coati.distributed.reward import processes

    before = set(processes._children())  # the session's Ray processes and servers, when it has started them
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert set(processes._children()) - before == {child.pid}
    finally:
        child.kill()
        child.wait()
    listed = []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path=".": listed.append(str(path)) or real_listdir(path))
    reap_orphans()
    assert "/proc" not in listed, listed
