"""``report.html``: a run folder's result on one self-contained page (no network, no scripts): the held-out result
before and after training, the training loop's account, every plot (embedded), sample completions with their
reference answers and verdicts, and the resolved config."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from coati.distributed.loggers.metrics import EVAL_RESULTS

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;
vertical-align:top}th{background:#f3f3f3}img{max-width:100%;display:block;margin:1em 0}pre{background:#f6f6f6;
padding:1em;overflow:auto;font-size:.85em}.ok{color:#176b1e}.no{color:#a01c1c}"""


def flipped(before: list[dict], after: list[dict]) -> list[dict]:
    """The held-out items whose lenient verdict changed between two evaluations' predictions (matched by index):
    each with its prompt, reference, and both responses and verdicts."""
    earlier = {item["index"]: item for item in before}
    out = []
    for item in after:
        old = earlier.get(item["index"])
        if old is not None and bool(old["lenient_ok"]) != bool(item["lenient_ok"]):
            out.append(
                {
                    "index": item["index"],
                    "prompt": item.get("prompt"),
                    "reference": item.get("reference"),
                    "before": old.get("response"),
                    "after": item.get("response"),
                    "now_right": bool(item["lenient_ok"]),
                }
            )
    return out


def write_report(folder: Path, summary: dict, samples: list[dict], loop_lines: list[str], flips=()) -> Path:
    """Write ``folder/report.html`` from the run's ``summary`` (summary.json's content, plots included), the last
    step's ``samples``, the loop account's ``loop_lines`` and the held-out items that ``flips`` (``flipped``);
    returns its path."""
    e = html.escape
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>coati run {e(folder.name)}</title>",
        f"<style>{STYLE}</style></head><body><h1>Run {e(folder.name)}</h1>",
    ]
    times = f"{summary.get('started_at', '?')} to {summary.get('finished_at', '?')}"
    parts.append(f"<p>{summary.get('steps', 0)} steps in {summary.get('wall_s', 0) / 60:.1f} min ({e(times)})</p>")
    parts.append(_results(summary.get("evals", [])))
    if loop_lines:
        parts.append("<h2>Training loop</h2><ul>" + "".join(f"<li>{e(line)}</li>" for line in loop_lines) + "</ul>")
    plots = [Path(p) for p in summary.get("plots", []) if Path(p).is_file()]
    if plots:
        parts.append("<h2>Plots</h2>")
        for path in plots:
            data = base64.b64encode(path.read_bytes()).decode()
            parts.append(f'<img alt="{e(path.stem)}" src="data:image/png;base64,{data}">')
    if samples:
        parts.append(
            "<h2>Sample completions (last step)</h2><table><tr><th>prompt</th><th>completion</th>"
            "<th>reference</th><th>reward</th><th>verdict</th></tr>"
        )
        for s in samples:
            verdict = _verdict(s)
            prompt, response = e(str(s.get("prompt", ""))), e(str(s.get("response", "")))
            pictures = "".join(
                f'<img alt="prompt image {k}" src="data:image/png;base64,{e(str(data))}">'
                for k, data in enumerate(s.get("images") or [])
            )
            parts.append(
                f"<tr><td>{pictures}<pre>{prompt}</pre></td><td><pre>{response}</pre></td>"
                f"<td>{e(str(s.get('reference', '')))}"
                f"</td><td>{s.get('reward', 0):.3f}</td><td>{verdict}</td></tr>"
            )
        parts.append("</table>")
    if flips:
        right = sum(f["now_right"] for f in flips)
        parts.append(
            f"<h2>Held-out items that flipped</h2><p>{right} wrong before and right after, "
            f"{len(flips) - right} right before and wrong after (lenient)</p><table><tr><th>prompt</th>"
            "<th>reference</th><th>before</th><th>after</th></tr>"
        )
        for f in flips:
            parts.append(
                f"<tr><td><pre>{e(str(f['prompt']))}</pre></td><td>{e(str(f['reference']))}</td>"
                f"<td><pre>{e(str(f['before']))}</pre></td><td class={'ok' if f['now_right'] else 'no'}>"
                f"<pre>{e(str(f['after']))}</pre></td></tr>"
            )
        parts.append("</table>")
    config = folder / "config.yaml"
    if config.is_file():
        parts.append(f"<h2>Config</h2><pre>{e(config.read_text())}</pre>")
    parts.append("</body></html>")
    path = folder / "report.html"
    path.write_text("\n".join(parts))
    return path


def _results(evals: list[dict]) -> str:
    if not evals:
        return "<p>No held-out evaluation (no held-out set).</p>"
    first, last = evals[0], evals[-1]
    rows = "".join(
        f"<tr><td>{key}</td><td>{first[key]:.3f}</td><td>{last[key]:.3f}</td>"
        f"<td>{last[key] - first[key]:+.3f}</td></tr>"
        for key in EVAL_RESULTS
        if key in first and key in last
    )
    count = first.get("eval/count", "?")
    if first.get("eval/cached"):
        count = f"{count} (before: the base model's cached evaluation)"
    return (
        f"<h2>Held-out result</h2><p>{count} items, greedy; step {first.get('step', 0)} to step "
        f"{last.get('step', 0)}</p><table><tr><th>result</th><th>before</th><th>after</th><th>change</th></tr>"
        f"{rows}</table>"
    )


def _verdict(sample: dict) -> str:
    if "strict_ok" not in sample and "lenient_ok" not in sample:
        return ""
    marks = []
    for key in ("strict_ok", "lenient_ok"):
        if key in sample:
            ok = bool(sample[key])
            marks.append(
                f"<span class={'ok' if ok else 'no'}>{key.removesuffix('_ok')}: {'right' if ok else 'wrong'}</span>"
            )
    return "<br>".join(marks)
