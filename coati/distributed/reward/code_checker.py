"""The program that runs a HumanEval test's ``check`` in a sandbox of its own: a dataset's ``prompt`` and ``test`` are
code, and they run neither on the host nor where the candidate runs.

It runs as a script under the sandbox's interpreter (standard library only), beside ``code_runner.py`` for the
plain-data codec. One JSON line each way, the parent speaking first: the parent sends ``{"op": "start"}``; for each
call of the candidate the checker sends ``{"op": "call", "args", "kwargs"}`` (encoded plain data) and the parent
answers with the call's outcome from the candidate's sandbox (``{"ok": true, "value"}`` or ``{"ok": false,
"error"}``); the checker ends with ``{"op": "done", "passed", "error", "calls"}``. A check that returns without calling
the candidate passes nothing.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from code_runner import decode, encode  # noqa: E402 - staged beside this file

NEVER_CALLED = "the test's check never called the candidate"


class CandidateFailed(Exception):
    """The candidate's call failed (its error, a timeout, or an unreadable result)."""


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

    def candidate(*args, **kwargs):
        nonlocal calls
        calls += 1
        send({"op": "call", "args": encode(list(args)), "kwargs": encode(dict(kwargs))})
        outcome = receive()
        if not outcome.get("ok"):
            raise CandidateFailed(str(outcome.get("error")))
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
