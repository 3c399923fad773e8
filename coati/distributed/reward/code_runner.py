"""The program that runs inside the code sandbox, and the plain-data codec both sides speak.

The sandboxed process runs the candidate and reports raw outputs only: what a stdin/stdout case printed, or what a
function call returned, encoded as plain data. It never sees an expected output and never decides a verdict; the
parent compares (``code_reward.py``). A candidate that tampers with this runner can therefore only change what it
reports as its own output, which is what it could do by computing it.

Protocol: one JSON request per line on fd ``COATI_REQ_FD``, one JSON reply per line on fd ``COATI_REP_FD``.
Requests: ``{"op": "load"}``, ``{"op": "stdio", "input": str}``, ``{"op": "call", "name": str, "args": enc,
"kwargs": enc}``. Replies: ``{"ok": true, ...}`` or ``{"ok": false, "error": str}``.

This file runs as a script under the sandbox's interpreter (standard library only) and is imported by the parent
for ``encode``/``decode``.
"""

import json
import math
import os
import signal
import sys

MAX_DEPTH = 64
SAFE_INT = 10**18
CASE_TIMEOUT = "case timeout"
"""the error a case reports when it runs past its budget"""


def encode(value, depth=0):
    """Plain data as tagged JSON: exact built-in types only (a subclass with its own ``__eq__`` is refused)."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if t is int:  # a plain JSON number where it is exact both ways and parses fast; tagged text beyond
        return value if -SAFE_INT < value < SAFE_INT else {"int": str(value)}
    if t is float:
        return {"float": repr(value)} if not math.isfinite(value) else value
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"tuple": [encode(v, depth + 1) for v in value]}
    if t is set or t is frozenset:
        return {t.__name__: [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if t is bytes:
        return {"bytes": value.hex()}
    if t is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    raise TypeError(f"cannot report a value of type {t.__name__}")


def decode(data, depth=0):
    """The inverse of ``encode``, building only built-in objects; anything else raises ValueError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if data is None or isinstance(data, (bool, str)):
        return data
    if isinstance(data, (int, float)):
        return data
    if isinstance(data, list):
        return [decode(v, depth + 1) for v in data]
    if isinstance(data, dict) and len(data) == 1:
        ((tag, v),) = data.items()
        if tag == "int" and isinstance(v, str):
            return int(v)
        if tag == "float" and v in ("inf", "-inf", "nan"):
            return float(v)
        if tag == "tuple" and isinstance(v, list):
            return tuple(decode(x, depth + 1) for x in v)
        if tag in ("set", "frozenset") and isinstance(v, list):
            items = [decode(x, depth + 1) for x in v]
            return set(items) if tag == "set" else frozenset(items)
        if tag == "dict" and isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
            return {decode(k, depth + 1): decode(x, depth + 1) for k, x in v}
        if tag == "bytes" and isinstance(v, str):
            return bytes.fromhex(v)
        if tag == "complex" and isinstance(v, list) and len(v) == 2:
            return complex(float(v[0]), float(v[1]))
    raise ValueError(f"not an encoded value: {str(data)[:80]}")


class _CaseTimeout(BaseException):
    pass


def _alarm(*_):
    raise _CaseTimeout()


def _timed(fn, seconds):
    """fn() under a per-case timer; returns (ok, value or error text)."""
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return True, fn()
    except _CaseTimeout:
        return False, CASE_TIMEOUT
    except SystemExit as e:
        return False, f"exit {e.code}"
    except BaseException as e:  # noqa: BLE001 - the candidate's failure is its result
        return False, f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _case(fn, data: bytes, seconds: float, out_path: str, in_path: str):
    """fn() under the per-case timer, with fd 0 reading ``data`` and fd 1 writing a fresh file; returns
    ((ok, value or error text), what was written to fd 1)."""
    import io

    with open(in_path, "wb") as f:
        f.write(data)
    saved = os.dup(0), os.dup(1)
    fin, fout = os.open(in_path, os.O_RDONLY), os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fin, 0)
    os.dup2(fout, 1)
    os.close(fin)
    os.close(fout)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), write_through=False)
    try:
        outcome = _timed(fn, seconds)
    finally:
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001 - a broken stdout is the candidate's problem
            pass
        os.dup2(saved[0], 0)
        os.dup2(saved[1], 1)
        os.close(saved[0])
        os.close(saved[1])
        sys.stdin, sys.stdout = sys.__stdin__, sys.__stdout__
    with open(out_path, "rb") as f:
        return outcome, f.read()


def main():
    req = os.fdopen(int(os.environ.pop("COATI_REQ_FD")), "r")
    rep = int(os.environ.pop("COATI_REP_FD"))
    per_case = float(os.environ.pop("COATI_CASE_TIMEOUT_S"))
    source_path = sys.argv[1]
    try:
        with open(source_path) as f:
            code, broken = compile(f.read(), "<solution>", "exec"), ""
    except (SyntaxError, ValueError) as e:  # the candidate's failure, reported for every request
        code, broken = None, f"{type(e).__name__}: {e}"[:300]
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an output over the cap fails the write, not the process
    workdir = os.getcwd()
    out_path, in_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stdin")
    namespace = {"__name__": "__solution__"}

    def reply(obj):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        while data:  # a large reply takes more than one write to the pipe
            data = data[os.write(rep, data) :]

    for line in req:
        msg = json.loads(line)
        op = msg["op"]
        if broken:
            reply({"ok": False, "error": broken})
            continue
        if op == "stdio":

            def as_script():
                try:
                    exec(code, {"__name__": "__main__"})
                except SystemExit as e:
                    if e.code not in (None, 0):
                        raise

            (ok, err), printed = _case(as_script, msg["input"].encode(), per_case, out_path, in_path)
            reply({"ok": True, "stdout": printed.decode(errors="replace")} if ok else {"ok": False, "error": err})
        elif op == "load":
            (ok, err), _ = _case(lambda: exec(code, namespace), b"", per_case, out_path, in_path)
            reply({"ok": True} if ok else {"ok": False, "error": f"load: {err}"})
        elif op == "call":
            fn = namespace.get(msg["name"])
            if fn is None and callable(namespace.get("Solution")):
                fn = getattr(namespace["Solution"](), msg["name"], None)
            if not callable(fn):
                reply({"ok": False, "error": f"no function {msg['name']!r}"})
                continue
            args, kwargs = decode(msg["args"]), decode(msg["kwargs"])
            (ok, value), _ = _case(lambda: fn(*args, **kwargs), b"", per_case, out_path, in_path)
            if not ok:
                reply({"ok": False, "error": value})
                continue
            try:
                reply({"ok": True, "value": encode(value)})
            except (TypeError, ValueError, RecursionError) as e:
                reply({"ok": False, "error": f"result not reportable: {e}"})


if __name__ == "__main__":
    main()
