"""Code rewards: run the completion's program against test cases in a sandbox, one interpreter per solution.

Test formats (``test_cases`` column, a dict or its JSON string):
- stdin/stdout (APPS/PRIME): ``{"inputs": [str, ...], "outputs": [str, ...]}``; outputs compared token by token;
- call-based: ``{"fn_name": "f", "inputs": [[args], ...], "outputs": [value, ...]}``; a top-level function or a
  method of ``class Solution``;
- HumanEval: ``{"test": "def check(candidate): ...", "entry_point": "f", "prompt": "..."}``; the prompt (optional)
  is run before the solution in the sandbox and, for the helpers the test uses, beside the test in the checker's.

The verdict is reached where the candidate cannot reach it. The sandboxed process (``code_runner.py``) only runs the
candidate and reports raw outputs: the text a case printed, or a call's return value as plain data (exact built-in
types, rebuilt here, so no object of the candidate's with its own ``__eq__`` survives). Expected outputs never enter
the sandbox. This process compares stdin/stdout and call results itself. A HumanEval ``check`` is dataset code: it
runs in a second sandbox (``code_checker.py``) with a ``candidate`` whose calls this process forwards into the
candidate's sandbox, handing back only plain-data results (values of the standard types tests compare, a
generator's items, exceptions by type, the arguments' in-place changes, and calls back of the functions the test
passes); the two sandboxes share no channel, and a check that never calls the candidate passes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from coati.distributed.reward import code_checker, code_runner
from coati.distributed.reward.base import REWARD_FNS, RewardResult
from coati.distributed.reward.sandbox import Sandbox

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)
_RUNNER = Path(code_runner.__file__).read_text()
_CHECKER = Path(code_checker.__file__).read_text()


def extract_code(text: str) -> tuple[str, bool]:
    """(program, format_ok): the last fenced code block, or the whole text when there is none."""
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1], True
    return text, False


def _spec_of(test_cases) -> dict:
    spec = json.loads(test_cases) if isinstance(test_cases, str) else dict(test_cases)
    if "test" in spec and "entry_point" in spec:
        return {
            "kind": "humaneval",
            "test": spec["test"],
            "entry_point": spec["entry_point"],
            "prompt": spec.get("prompt") or "",
            "num_cases": 1,
        }
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


class _SandboxLost(BaseException):
    """The candidate's process died, hung or broke the protocol: the check must fail even under a bare except."""


def run_tests(program: str, test_cases, per_case_timeout_s: float = 2.0, sandbox: Sandbox | None = None) -> dict:
    """Run ``program`` on every case in one sandboxed interpreter; returns passed, total and the first error."""
    spec = _spec_of(test_cases)
    total = spec["num_cases"]
    sandbox = sandbox or _get_sandbox()
    if spec["kind"] == "humaneval" and spec["prompt"]:
        program = spec["prompt"] + "\n" + program
    # Each case gets its own per_case_timeout_s (the runner's timer), so the session's wall and CPU budget is the
    # sum of them; the reward pool's item_timeout_s bounds a completion's scoring as a whole.
    budget = sandbox.timeout_s + per_case_timeout_s * total
    session = sandbox.start(
        {"runner.py": _RUNNER, "solution.py": program},
        "runner.py",
        "solution.py",
        env={"COATI_CASE_TIMEOUT_S": str(per_case_timeout_s)},
        timeout_s=budget,
        max_reply_bytes=_reply_cap(spec),
    )
    reply_wait = per_case_timeout_s + 2.0
    errors: list[str] = []
    checker = None
    try:
        if spec["kind"] == "humaneval":  # started now, so the two interpreters start side by side
            checker = _start_checker(spec, sandbox, budget)
        if spec["kind"] == "stdio":
            passed = _stdio_cases(session, spec, reply_wait, errors)
        else:
            loaded = session.request({"op": "load"}, reply_wait)
            if loaded is None or not loaded.get("ok"):
                errors.append(str((loaded or {}).get("error") or session.failure))
                passed = 0
            elif spec["kind"] == "call":
                passed = _call_cases(session, spec, reply_wait, errors)
            else:
                passed = _humaneval_check(session, checker, spec, reply_wait, errors, budget)
    finally:
        if checker is not None:
            checker.close()
        stderr = session.close()
    if session.failure and session.failure not in errors:
        errors.append(session.failure)
    if not errors and passed < total:
        errors.append(f"sandbox: {stderr.strip()[-200:]}")
    return {"passed": passed, "total": total, "error": errors[0] if errors else ""}


def _reply_cap(spec: dict) -> int:
    """Bytes a reply may take: 1 MiB, or room for four times the largest expected output as the runner encodes it
    (a right answer is never refused for its size; a flood beyond that is)."""
    largest = 0
    for want in spec.get("outputs") or ():
        try:
            size = len(json.dumps(code_runner.encode(want), separators=(",", ":")))
        except (TypeError, ValueError):
            size = len(str(want))
        largest = max(largest, size)
    return max(1 << 20, 4 * largest + 4096)


def _stdio_cases(session, spec, wait, errors) -> int:
    passed = 0
    for inp, want in zip(spec["inputs"], spec["outputs"], strict=True):
        reply = session.request({"op": "stdio", "input": str(inp)}, wait)
        if reply is None:
            break
        if not reply.get("ok"):
            errors.append(str(reply.get("error")))
            if reply.get("error") == code_runner.CASE_TIMEOUT:
                break  # a wrong solution: its other cases would each take their whole budget too
        elif not isinstance(reply.get("stdout"), str):
            errors.append("malformed reply")
        elif reply["stdout"].split() == str(want).split():
            passed += 1
        else:
            errors.append("wrong answer")
    return passed


def _returned(session, msg: dict, wait: float):
    """What the candidate returned for one call, rebuilt as plain data; raises on any failure."""
    reply = session.request(msg, wait)
    if reply is None:
        raise _SandboxLost(session.failure)
    if not reply.get("ok"):
        raise RuntimeError(str(reply.get("error")))
    try:
        return code_runner.decode(reply.get("value"))
    except Exception as e:  # noqa: BLE001 - a forged reply (unhashable keys, any shape) is a failure, never an error
        raise _SandboxLost(f"malformed reply ({type(e).__name__})") from None


def _call_cases(session, spec, wait, errors) -> int:
    passed = 0
    for args, want in zip(spec["inputs"], spec["outputs"], strict=True):
        msg = {"op": "call", "name": spec["fn_name"], "args": code_runner.encode(list(args)), "kwargs": {"dict": []}}
        try:
            got = _returned(session, msg, wait)
        except _SandboxLost as e:
            errors.append(str(e))
            break
        except (RuntimeError, ValueError) as e:
            errors.append(str(e)[:200])
            if str(e) == code_runner.CASE_TIMEOUT:
                break  # a wrong solution: its other cases would each take their whole budget too
            continue
        if isinstance(got, Iterator):  # a generator's items (consumed in the sandbox)
            got = list(got)
        # JSON test data has lists where a solution may return tuples: compare both through JSON.
        if _as_json(got) == _as_json(want):
            passed += 1
        else:
            errors.append("wrong answer")
    return passed


def _as_json(value):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return ("unserialisable", repr(value))


def _start_checker(spec: dict, sandbox: Sandbox, budget: float):
    """The sandbox of the test's ``check`` (``code_checker.py``): dataset code runs neither here nor beside the
    candidate."""
    return sandbox.start(
        {"checker.py": _CHECKER, "code_runner.py": _RUNNER, "prompt.py": spec["prompt"], "test.py": spec["test"]},
        "checker.py",
        "prompt.py",
        "test.py",
        env={"COATI_ENTRY_POINT": spec["entry_point"]},
        timeout_s=budget,
    )


def _humaneval_check(session, checker, spec, wait, errors, budget) -> int:
    """Run the test's ``check`` in the checker's sandbox, forwarding each of its calls of the candidate into the
    candidate's sandbox (and each call the candidate makes of a function the test passed back to the checker);
    passed is 1 when ``check`` returns, having called the candidate, and the candidate's sandbox stayed sound
    throughout. Only plain data crosses, checked here on its way."""
    try:
        msg = checker.request({"op": "start"}, budget)
        while msg is not None and msg.get("op") == "call":
            call = {"op": "call", "name": spec["entry_point"], "args": msg.get("args"), "kwargs": msg.get("kwargs")}
            reply = session.request(call, wait)
            while reply is not None and reply.get("op") == "callback":  # the candidate calls the test's function
                try:
                    asked = _plain({k: reply.get(k) for k in ("args", "kwargs")})
                    answer = checker.request({"op": "callback", "id": reply.get("id"), **asked}, budget)
                    reply = session.request(_plain_outcome(answer), wait) if answer is not None else None
                except _Forged as e:
                    return _failed(errors, f"malformed reply ({e})")
            if reply is None:
                return 0
            try:
                outcome = _plain_outcome(reply)
            except _Forged as e:
                return _failed(errors, f"malformed reply ({e})")
            msg = checker.request(outcome, budget)
    finally:
        checker_stderr = checker.close()
    if msg is None or msg.get("op") != "done":
        return _failed(errors, f"checker: {checker.failure or 'unexpected message'} {checker_stderr.strip()[-200:]}")
    if msg.get("passed") is not True:
        return _failed(errors, str(msg.get("error"))[:300])
    return 0 if session.failure else 1


class _Forged(Exception):
    """A message from a sandbox that is not the plain data the protocol carries."""


def _plain(fields: dict) -> dict:
    """``fields`` with each value checked to decode as plain data (a forged value of any shape is refused)."""
    for name, value in fields.items():
        try:
            code_runner.decode(value)
        except Exception as e:  # noqa: BLE001 - whatever a forged value raises
            raise _Forged(f"{name}: {type(e).__name__}") from None
    return fields


def _plain_outcome(reply: dict) -> dict:
    """A call's (or a call back's) outcome as it may cross to the other sandbox: its value and its arguments'
    states when it succeeded, its error text and exception type when it failed; nothing else."""
    if reply.get("ok"):
        after = reply.get("args_after")
        after = [a for a in after] if isinstance(after, list) else []
        kw_after = reply.get("kwargs_after") if isinstance(reply.get("kwargs_after"), dict) else {}
        _plain({"value": reply.get("value"), **{f"args_after[{i}]": a for i, a in enumerate(after)}})
        _plain({f"kwargs_after[{k}]": v for k, v in kw_after.items()})
        return {"ok": True, "value": reply.get("value"), "args_after": after, "kwargs_after": kw_after}
    raised = reply.get("raised")
    if isinstance(raised, dict) and isinstance(raised.get("type"), str) and len(raised["type"]) <= 100:
        raised = {
            "type": raised["type"],
            "custom": bool(raised.get("custom")),
            "message": str(raised.get("message", ""))[:200],
            **_plain({"args": raised.get("args") or []}),
        }
    else:
        raised = None
    return {"ok": False, "error": str(reply.get("error"))[:300], "raised": raised}


def _failed(errors: list, why: str) -> int:
    errors.append(why)
    return 0


@REWARD_FNS.register("code")
def code_reward(
    completions: list[str],
    test_cases: list,
    partial_credit: bool = False,
    per_case_timeout_s: float = 2.0,
    **_fields,
) -> list[RewardResult]:
    """1.0 when the program (last fenced code block) passes every test case, else 0.0; with ``partial_credit`` the
    fraction of cases passed. Each solution runs in the sandbox described in ``sandbox.py``; the verdict is
    reached outside it, from plain-data outputs.
    """
    results = []
    for text, cases in zip(completions, test_cases, strict=True):
        program, format_ok = extract_code(text)
        outcome = run_tests(program, cases, per_case_timeout_s)
        rate = outcome["passed"] / max(outcome["total"], 1)
        all_ok = outcome["passed"] == outcome["total"] and outcome["total"] > 0
        reward = rate if partial_credit else float(all_ok)
        # Why the solution failed is a result ("failure"), not a scoring error ("error", counted by the run).
        results.append(RewardResult(reward, format_ok, all_ok, {"pass_rate": rate, "failure": outcome["error"]}))
    return results
