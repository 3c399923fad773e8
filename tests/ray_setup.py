"""Ray's setup step for the suite's cluster, without importing Ray.

Ray starts every worker whose runtime environment is not empty (in the suite, all of them: ``py_executable`` routes
them through ``tests/prefork.py``) as ``python setup_worker.py <worker args> --serialized-runtime-env-context=<json>
--language=<language>``; that script imports Ray (a second of a core) only to read the context, set its variables and
exec the worker through bash. The session fixture points Ray's setup step at this file, which does the same for
Python workers (``setup`` below, checked against Ray's own ``RuntimeEnvContext.exec_worker`` in
``tests/component/test_processes.py``) and hands any other language to Ray's script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys


def command(argv: list[str]) -> list[str] | None:
    """The command Ray's setup step would exec for ``argv`` (the arguments after the script), setting the context's
    variables in this process's environment as it does; None for a worker that is not Python's."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serialized-runtime-env-context", type=str)
    parser.add_argument("--language", type=str)
    args, rest = parser.parse_known_args(argv)
    if args.language != "PYTHON":
        return None
    context = json.loads(args.serialized_runtime_env_context or "{}")
    for key, value in (context.get("env_vars") or {}).items():
        # ${X} expands to the variable's value, or to nothing when it is unset
        os.environ[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
    if context.get("override_worker_entrypoint"):
        rest[0] = context["override_worker_entrypoint"]
    executable = ["exec", context.get("py_executable") or sys.executable]
    cmd = [*(context.get("command_prefix") or []), *executable, *(shlex.quote(a) for a in rest)]
    return ["bash", "-c", " ".join(cmd)]


def setup(argv: list[str]) -> None:
    cmd = command(argv)
    if cmd is None:
        from importlib.util import find_spec

        script = os.path.join(os.path.dirname(find_spec("ray").origin), "_private", "workers", "setup_worker.py")
        os.execv(sys.executable, [sys.executable, script, *argv])
    os.execvp("bash", cmd)


if __name__ == "__main__":
    setup(sys.argv[1:])
