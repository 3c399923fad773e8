"""Code rewards: run the completion's program against test cases in a sandbox, one interpreter per solution.

Test formats (``test_cases`` column, a dict or its JSON string):
- stdin/stdout (APPS/PRIME): ``{"inputs": [str, ...], "outputs": [str, ...]}``; outputs compared token by token;
- call-based: ``{"fn_name": "f", "inputs": [[args], ...], "outputs": [value, ...]}``; a top-level function or a
  method of ``class Solution``;
- HumanEval: ``{"test": "def check(candidate): ...", "entry_point": "f"}``.
A harness runs every case of one solution in one sandboxed interpreter and reports each result on a private pipe,
tagged with a per-run nonce, so partial results survive a kill and printed text cannot pose as a result.
"""

from __future__ import annotations

import json
import re
import secrets

from coati.distributed.reward.base import REWARD_FNS, RewardResult
from coati.distributed.reward.sandbox import Sandbox

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)

_HARNESS = r'''
import contextlib, io, json, os, signal, sys
_fd = int(os.environ.pop("COATI_RESULT_FD"))
_spec = json.loads(sys.stdin.readline())
_nonce = _spec.pop("nonce")
_per_case = float(_spec.get("per_case_timeout_s", 2.0))
_SOLUTION = __SOLUTION__
class _CaseTimeout(BaseException):
    pass
def _alarm(*_):
    raise _CaseTimeout()
signal.signal(signal.SIGALRM, _alarm)
def _report(i, ok, err=""):
    os.write(_fd, (_nonce + json.dumps({"i": i, "ok": bool(ok), "err": str(err)[:200]}) + "\n").encode())
def _tokens(text):
    return str(text).split()
def _plain(value):
    return json.loads(json.dumps(value, default=str))
def _run(i, fn):
    signal.setitimer(signal.ITIMER_REAL, _per_case)
    try:
        ok = fn()
        err = "" if ok else "wrong answer"
    except _CaseTimeout:
        ok, err = False, "case timeout"
    except SystemExit as e:
        ok, err = False, f"exit {e.code}"
    except BaseException as e:
        ok, err = False, f"{type(e).__name__}: {e}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    _report(i, ok, err)
_code = compile(_SOLUTION, "<solution>", "exec")
if _spec["kind"] == "stdio":
    for _i, (_inp, _want) in enumerate(zip(_spec["inputs"], _spec["outputs"])):
        def _case(_inp=_inp, _want=_want):
            _out = io.StringIO()
            sys.stdin = io.StringIO(_inp)
            try:
                with contextlib.redirect_stdout(_out):
                    exec(_code, {"__name__": "__main__"})
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise
            return _tokens(_out.getvalue()) == _tokens(_want)
        _run(_i, _case)
else:
    _g = {"__name__": "__solution__"}
    _loaded = []
    def _load():
        with contextlib.redirect_stdout(io.StringIO()):
            exec(_code, _g)
        _loaded.append(True)
        return True
    signal.setitimer(signal.ITIMER_REAL, _per_case)
    try:
        _load()
    except BaseException as e:
        _report(-1, False, f"load: {type(e).__name__}: {e}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if _loaded and _spec["kind"] == "call":
        _name = _spec["fn_name"]
        _fn = _g.get(_name) or getattr(_g.get("Solution", object)(), _name, None)
        for _i, (_args, _want) in enumerate(zip(_spec["inputs"], _spec["outputs"])):
            def _case(_args=_args, _want=_want):
                with contextlib.redirect_stdout(io.StringIO()):
                    _got = _fn(*_args)
                return _plain(_got) == _plain(_want)
            _run(_i, _case)
    elif _loaded:
        def _case():
            exec(compile(_spec["test"], "<test>", "exec"), _g)
            with contextlib.redirect_stdout(io.StringIO()):
                _g["check"](_g[_spec["entry_point"]])
            return True
        _run(0, _case)
'''


def extract_code(text: str) -> tuple[str, bool]:
    """(program, format_ok): the last fenced code block, or the whole text when there is none."""
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1], True
    return text, False


def _spec_of(test_cases) -> dict:
    spec = json.loads(test_cases) if isinstance(test_cases, str) else dict(test_cases)
    if "test" in spec and "entry_point" in spec:
        return {"kind": "humaneval", "test": spec["test"], "entry_point": spec["entry_point"], "num_cases": 1}
    if "inputs" not in spec or "outputs" not in spec:
        raise ValueError(
            f"test_cases needs inputs/outputs (APPS) or test/entry_point (HumanEval); got keys {sorted(spec)}"
        )
    if len(spec["inputs"]) != len(spec["outputs"]):
        raise ValueError(f"test_cases has {len(spec['inputs'])} inputs but {len(spec['outputs'])} outputs")
    kind = "call" if spec.get("fn_name") else "stdio"
    out = {"kind": kind, "inputs": spec["inputs"], "outputs": spec["outputs"], "num_cases": len(spec["inputs"])}
    if kind == "call":
        out["fn_name"] = spec["fn_name"]
    return out


_sandbox: Sandbox | None = None


def _get_sandbox() -> Sandbox:
    global _sandbox
    if _sandbox is None:
        _sandbox = Sandbox()
    return _sandbox


def run_tests(program: str, test_cases, per_case_timeout_s: float = 2.0, sandbox: Sandbox | None = None) -> dict:
    """Run ``program`` on every case in one sandboxed interpreter; returns passed, total and the first error."""
    spec = _spec_of(test_cases)
    total = spec.pop("num_cases")
    nonce = secrets.token_hex(16)
    spec.update(nonce=nonce, per_case_timeout_s=per_case_timeout_s)
    sandbox = sandbox or _get_sandbox()
    harness = _HARNESS.replace("__SOLUTION__", repr(program))
    wall = min(sandbox.timeout_s + per_case_timeout_s * total, 60.0)
    result = sandbox.run(harness, json.dumps(spec) + "\n", timeout_s=wall)
    passed, errors = set(), []
    for line in result.extra.splitlines():
        if not line.startswith(nonce):
            continue
        record = json.loads(line[len(nonce) :])
        if record["ok"] and 0 <= record["i"] < total:
            passed.add(record["i"])
        elif record["err"]:
            errors.append(record["err"])
    if result.timed_out:
        errors.append("wall timeout")
    if result.output_truncated:
        errors.append("output cap")
    if not errors and len(passed) < total:
        errors.append(f"sandbox exited with {result.returncode}: {result.stderr.strip()[-200:]}")
    return {"passed": len(passed), "total": total, "error": errors[0] if errors else ""}


@REWARD_FNS.register("code")
def code_reward(
    completions: list[str],
    test_cases: list,
    partial_credit: bool = False,
    per_case_timeout_s: float = 2.0,
    **_fields,
) -> list[RewardResult]:
    """1.0 when the program (last fenced code block) passes every test case, else 0.0; with ``partial_credit`` the
    fraction of cases passed. Runs each solution in the sandbox described in ``sandbox.py``.
    """
    results = []
    for text, cases in zip(completions, test_cases, strict=True):
        program, format_ok = extract_code(text)
        outcome = run_tests(program, cases, per_case_timeout_s)
        rate = outcome["passed"] / max(outcome["total"], 1)
        all_ok = outcome["passed"] == outcome["total"] and outcome["total"] > 0
        reward = rate if partial_credit else float(all_ok)
        results.append(RewardResult(reward, format_ok, all_ok, {"pass_rate": rate, "error": outcome["error"]}))
    return results
