"""The program that runs a HumanEval test's ``check`` in a sandbox of its own: a dataset's ``prompt`` and ``test`` are
code, and they run neither on the host nor where the candidate runs.

It runs as a script under the sandbox's interpreter (standard library only), beside ``code_runner.py`` for the
plain-data codec. One JSON line each way, the parent speaking first: the parent sends ``{"op": "start"}``; for each
call of the candidate the checker sends ``{"op": "call", "args", "kwargs"}`` (encoded plain data; a function of the
test's as ``{"callback": n}``) and the parent answers with the call's outcome from the candidate's sandbox: ``{"ok":
true, "value", "args_after", "kwargs_after"}`` (the arguments as the call left them) or ``{"ok": false, "error",
"raised"}`` (the exception by type), after any number of ``{"op": "callback", "id", "args", "kwargs"}`` the
candidate made, each answered here with the test function's result. The checker ends with ``{"op": "done", "passed",
"error", "calls"}``. A check that returns without calling the candidate passes nothing.

What the test sees of the candidate is what a direct ``check(candidate)`` sees, rebuilt from plain data: return
values of the standard types tests compare (``Counter``, ``OrderedDict``, sets, nested containers, a generator's
items), exceptions by type, in-place changes to the arguments, and calls of the functions it passes.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from code_runner import decode, encode  # staged beside this file

NEVER_CALLED = "the test's check never called the candidate"


class CandidateFailed(BaseException):
    """The candidate's call failed in a way a test cannot expect (a timeout, an unreadable result, a lost sandbox):
    a BaseException, so a test's ``except Exception`` does not take it for the error it expects."""


def rebuilt(outcome: dict, namespace: dict) -> BaseException:
    """The exception a failed call raised, as the test can catch it: a built-in exception of the same type and
    arguments, or the prompt's exception class of that name; else CandidateFailed."""
    import builtins

    info = outcome.get("raised")
    if isinstance(info, dict) and isinstance(info.get("type"), str):
        name = info["type"]
        cls = namespace.get(name) if info.get("custom") else getattr(builtins, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(str(info.get("message", ""))) if info.get("custom") else cls(*decode(info.get("args") or []))
            except Exception:  # noqa: BLE001 - arguments the class refuses: the class alone
                return cls.__new__(cls)
    return CandidateFailed(str(outcome.get("error")))


def update_in_place(original, after) -> None:
    """Give ``original`` (an argument the test passed) the state the candidate's call left its copy in."""
    if after is None:
        return
    new = decode(after)
    if type(new) is not type(original):
        return
    if isinstance(original, (list, bytearray)):
        original[:] = new
    elif isinstance(original, (dict, set)):
        original.clear()
        original.update(new)
    elif hasattr(original, "extend") and hasattr(original, "clear"):  # a deque
        original.clear()
        original.extend(new)


def main():
    requests = os.fdopen(int(os.environ.pop("COATI_REQ_FD")), "r")
    rep = int(os.environ.pop("COATI_REP_FD"))
    entry_point = os.environ.pop("COATI_ENTRY_POINT")
    prompt_path, test_path = sys.argv[1], sys.argv[2]

    def send(obj):
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(rep, data) :]

    def receive():
        line = requests.readline()
        if not line:
            os._exit(1)
        return json.loads(line)

    receive()  # start
    calls = 0

    def answer_callback(callables, msg):
        """Call the test's function the candidate called, and send back its result."""
        index = msg.get("id")
        if type(index) is not int or not 0 <= index < len(callables):
            raise CandidateFailed("a call back to no function of the test's")
        try:
            value = callables[index](*decode(msg.get("args")), **decode(msg.get("kwargs")))
            send({"ok": True, "value": encode(value)})
        except CandidateFailed:
            raise
        except Exception as e:  # noqa: BLE001 - the test's function failed: the candidate sees it fail
            send({"ok": False, "error": f"{type(e).__name__}: {str(e)[:200]}"})

    def candidate(*args, **kwargs):
        nonlocal calls
        calls += 1
        callables = []
        send({"op": "call", "args": encode(list(args), 0, callables), "kwargs": encode(dict(kwargs), 0, callables)})
        while True:
            outcome = receive()
            if outcome.get("op") != "callback":
                break
            answer_callback(callables, outcome)
        if not outcome.get("ok"):
            raise rebuilt(outcome, namespace)
        for original, after in zip(args, outcome.get("args_after") or [], strict=False):
            update_in_place(original, after)
        for name, after in (outcome.get("kwargs_after") or {}).items():
            if name in kwargs:
                update_in_place(kwargs[name], after)
        return decode(outcome.get("value"))

    namespace = {"__name__": "__check__"}
    try:
        with open(prompt_path) as f:
            exec(compile(f.read(), "<prompt>", "exec"), namespace)
        # Some tests also call the entry point by name: it is the candidate there too, never the prompt's stub.
        namespace[entry_point] = candidate
        with open(test_path) as f:
            exec(compile(f.read(), "<test>", "exec"), namespace)
        namespace["check"](candidate)
    except BaseException as e:  # noqa: BLE001 - a failed check (assertion, the candidate's error) passes nothing
        send({"op": "done", "passed": False, "error": f"{type(e).__name__}: {str(e)[:200]}", "calls": calls})
        return
    send({"op": "done", "passed": calls > 0, "error": "" if calls else NEVER_CALLED, "calls": calls})


if __name__ == "__main__":
    main()
