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


MAX_ITEMS = 10_000
"""the items an iterator the candidate returns is consumed to (an endless generator reports its first ones)"""
_FACTORIES = {"int": int, "float": float, "str": str, "list": list, "dict": dict, "set": set, "tuple": tuple}
"""the default factories a defaultdict may cross with (built-in types; a function of the candidate's cannot)"""
_ITERATORS = {type(iter(())), type(iter([])), type(iter("")), type(iter({})), type(iter(set())), type(iter(range(1)))}
_ITERATORS |= {type(x for x in ()), map, filter, zip, enumerate, reversed, type(reversed([]))}
"""the built-in iterators (generators among them) a call may return; consumed, they cross as their items"""


def encode(value, depth=0, callables=None):
    """Plain data as tagged JSON: exact built-in types, and the standard library's containers tests compare
    (``Counter``, ``OrderedDict``, ``defaultdict`` of a built-in factory, ``deque``, ``Fraction``, ``Decimal``,
    ``range``); a built-in iterator or generator is consumed (``MAX_ITEMS`` at most) and crosses as its items. A
    subclass with its own ``__eq__`` is refused: only these exact types are rebuilt on the other side. With
    ``callables`` (a list), a function crosses as ``{"callback": index}`` into that list."""
    import collections
    import decimal
    import fractions

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
        return [encode(v, depth + 1, callables) for v in value]
    if t is tuple:
        return {"tuple": [encode(v, depth + 1, callables) for v in value]}
    if t is set or t is frozenset:
        return {t.__name__: [encode(v, depth + 1, callables) for v in value]}
    if t is dict or t is collections.Counter or t is collections.OrderedDict:
        return {t.__name__: _pairs(value, depth, callables)}
    if t is collections.defaultdict:
        factory = next((n for n, f in _FACTORIES.items() if value.default_factory is f), None)
        if value.default_factory is not None and factory is None:
            raise TypeError("cannot report a defaultdict whose default factory is not a built-in type")
        return {"defaultdict": [factory, _pairs(value, depth, callables)]}
    if t is collections.deque:
        return {"deque": [[encode(v, depth + 1, callables) for v in value], value.maxlen]}
    if t is fractions.Fraction:
        return {"Fraction": [str(value.numerator), str(value.denominator)]}
    if t is decimal.Decimal:
        return {"Decimal": str(value)}
    if t is range:
        return {"range": [value.start, value.stop, value.step]}
    if t in _ITERATORS:
        items = []
        for item in value:
            items.append(encode(item, depth + 1, callables))
            if len(items) >= MAX_ITEMS:
                break
        return {"iterator": items}
    if t is bytes:
        return {"bytes": value.hex()}
    if t is bytearray:
        return {"bytearray": value.hex()}
    if t is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if callables is not None and callable(value):  # a function of the test's: called back where it lives
        callables.append(value)
        return {"callback": len(callables) - 1}
    raise TypeError(f"cannot report a value of type {t.__name__}")


def _pairs(mapping, depth, callables):
    return [[encode(k, depth + 1, callables), encode(v, depth + 1, callables)] for k, v in mapping.items()]


class Unreportable(Exception):
    """A call's result is not plain data (``encode`` refused it): the candidate's failure, said as such."""


def decode(data, depth=0, callback=None):
    """The inverse of ``encode``, building only built-in and standard-library objects; anything else raises
    ValueError. ``{"callback": n}`` (a function of the test's, passed to the candidate) becomes ``callback(n)``
    where one is given, and is refused elsewhere."""
    import collections
    import decimal
    import fractions

    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if data is None or isinstance(data, (bool, str)):
        return data
    if isinstance(data, (int, float)):
        return data
    if isinstance(data, list):
        return [decode(v, depth + 1, callback) for v in data]
    if isinstance(data, dict) and len(data) == 1:
        ((tag, v),) = data.items()

        def items(pairs):
            if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs)):
                raise ValueError("not an encoded mapping")
            return [(decode(k, depth + 1, callback), decode(x, depth + 1, callback)) for k, x in pairs]

        if tag == "int" and isinstance(v, str):
            return int(v)
        if tag == "float" and v in ("inf", "-inf", "nan"):
            return float(v)
        if tag == "tuple" and isinstance(v, list):
            return tuple(decode(x, depth + 1, callback) for x in v)
        if tag in ("set", "frozenset") and isinstance(v, list):
            found = [decode(x, depth + 1, callback) for x in v]
            return set(found) if tag == "set" else frozenset(found)
        if tag == "dict":
            return dict(items(v))
        if tag == "Counter":
            return collections.Counter(dict(items(v)))
        if tag == "OrderedDict":
            return collections.OrderedDict(items(v))
        if tag == "defaultdict" and isinstance(v, list) and len(v) == 2 and (v[0] is None or v[0] in _FACTORIES):
            return collections.defaultdict(_FACTORIES.get(v[0]), items(v[1]))
        if tag == "deque" and isinstance(v, list) and len(v) == 2 and isinstance(v[0], list):
            maxlen = v[1] if isinstance(v[1], int) and not isinstance(v[1], bool) and v[1] >= 0 else None
            return collections.deque([decode(x, depth + 1, callback) for x in v[0]], maxlen)
        if tag == "Fraction" and isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v):
            return fractions.Fraction(int(v[0]), int(v[1]))
        if tag == "Decimal" and isinstance(v, str):
            return decimal.Decimal(v)
        if tag == "range" and isinstance(v, list) and len(v) == 3 and all(type(x) is int for x in v):
            return range(*v)
        if tag == "iterator" and isinstance(v, list):
            return iter([decode(x, depth + 1, callback) for x in v])
        if tag == "bytes" and isinstance(v, str):
            return bytes.fromhex(v)
        if tag == "bytearray" and isinstance(v, str):
            return bytearray.fromhex(v)
        if tag == "complex" and isinstance(v, list) and len(v) == 2:
            return complex(float(v[0]), float(v[1]))
        if tag == "callback" and type(v) is int and callback is not None:
            return callback(v)
    raise ValueError(f"not an encoded value: {str(data)[:80]}")


def raised(error: BaseException):
    """A failed call's exception as plain data, for the test to see it by type: a built-in exception (its name and
    its arguments when they are plain data), or one of a class the prompt defines (its name; ``custom``)."""
    import builtins

    t = type(error)
    if getattr(builtins, t.__name__, None) is t and issubclass(t, Exception):
        try:
            return {"type": t.__name__, "args": encode(list(error.args))}
        except (TypeError, ValueError, RecursionError):
            return {"type": t.__name__, "args": []}
    if issubclass(t, Exception):
        return {"type": t.__name__, "custom": True, "message": str(error)[:200]}
    return None


LAST_ERROR: BaseException | None = None
"""the exception of the last case that raised one (for ``raised``)"""

_MUTABLE = ("list", "dict", "set", "bytearray", "deque", "Counter", "OrderedDict", "defaultdict")
"""the argument types whose changes a call reports back (a function may sort or fill what it is given)"""


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
        global LAST_ERROR
        LAST_ERROR = e
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

            def callback(n):
                def call_back(*a, **k):  # the test's function, called where the test runs
                    reply({"op": "callback", "id": n, "args": encode(list(a)), "kwargs": encode(dict(k))})
                    answer = json.loads(req.readline() or "{}")
                    if not answer.get("ok"):
                        raise RuntimeError(f"callback failed: {answer.get('error')}")
                    return decode(answer.get("value"))

                return call_back

            args, kwargs = decode(msg["args"], callback=callback), decode(msg["kwargs"], callback=callback)

            def run(fn=fn, args=args, kwargs=kwargs):  # encoding consumes a returned generator: within the timer
                result = fn(*args, **kwargs)
                try:
                    value = encode(result)
                except (TypeError, ValueError, RecursionError) as e:
                    raise Unreportable(str(e)) from None
                return value, [_after(a) for a in args], {k: _after(v) for k, v in kwargs.items()}

            global LAST_ERROR
            LAST_ERROR = None
            (ok, value), _ = _case(run, b"", per_case, out_path, in_path)
            if ok:
                reply({"ok": True, "value": value[0], "args_after": value[1], "kwargs_after": value[2]})
            elif isinstance(LAST_ERROR, Unreportable):
                reply({"ok": False, "error": f"result not reportable: {LAST_ERROR}"})
            else:
                error = LAST_ERROR
                reply({"ok": False, "error": value, "raised": raised(error) if error is not None else None})


def _after(arg):
    """An argument as the call left it, where the call could change it in place; None otherwise."""
    if type(arg).__name__ not in _MUTABLE:
        return None
    try:
        return encode(arg)
    except (TypeError, ValueError, RecursionError):
        return None


if __name__ == "__main__":
    main()
