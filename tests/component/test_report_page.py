"""``report.html`` in a real headless browser (Debian's chromium, which .ci/run installs): the page of a run folder the
real reporter wrote loads with no console error, and every image on it renders."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from coati.distributed.driver.reporting import Reporter

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PROBE = (
    "<script>document.title = 'images ' + [...document.images].filter(i => i.complete && i.naturalWidth > 0).length"
    " + '/' + document.images.length;</script>"
)


def reap_browser_orphans() -> None:
    """Chromium's helper processes outlive it briefly; where this process is a child subreaper (the code sandbox makes
    it one) they become its children and, once they exit, its zombies: wait for them here."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == os.getpid() and "chrom" in name.lower():
            os.waitpid(int(entry), 0)


def picture() -> str:
    """A prompt's picture as a sample carries it: a base64 PNG."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (24, 16), (255, 0, 0)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium; .ci/run installs it)")
def test_the_report_page_loads_and_every_image_renders(tmp_path):
    reporter = Reporter(
        str(tmp_path / "run"), report_to=("jsonl",), progress=False, describe={"config.yaml": "algo: DAPO\n"}
    )
    evals = [
        {"step": 0, "eval/strict": 0.25, "eval/lenient": 0.5, "eval/count": 4},
        {"step": 3, "eval/strict": 0.5, "eval/lenient": 0.75, "eval/count": 4},
    ]
    predictions = [
        {"index": i, "prompt": f"q{i}", "response": "r", "reference": str(i), "strict_ok": False, "lenient_ok": i == 1}
        for i in range(4)
    ]
    reporter.on_step({**evals[0], "eval_samples": predictions})
    for step in (1, 2):
        sample = {
            "prompt": "What is 1 + <2>?",
            "response": "3 </td>",
            "reward": 1.0,
            "policy_version": step - 1,
            "reference": "3",
            "strict_ok": True,
            "lenient_ok": True,
            "images": [picture()],  # the prompt's picture, as the model received it
        }
        reporter.on_step(
            {
                "step": step,
                "reward/mean": 0.25 * step,
                "actor/lr": 1e-6,
                "response/length_mean": 9.0,
                "samples": [sample],
            }
        )
    after = [dict(p, lenient_ok=p["index"] in (2, 3), response="r2") for p in predictions]
    reporter.on_step({"step": 3, "reward/mean": 0.5, **evals[1], "eval_samples": after})
    summary = reporter.finish({"evals": evals})
    kept = [json.loads(line) for line in (tmp_path / "run" / "eval_samples.jsonl").read_text().splitlines()]
    assert [(p["step"], p["index"]) for p in kept] == [(0, i) for i in range(4)] + [(3, i) for i in range(4)]
    page = tmp_path / "run" / "report.html"
    assert summary["report"] == str(page) and json.loads((tmp_path / "run" / "summary.json").read_text())["report"]
    text = page.read_text()
    assert "2 wrong before and right after, 1 right before and wrong after" in text
    assert "0.500" in text and "0.750" in text and "What is 1 + &lt;2&gt;?" in text and "3 &lt;/td&gt;" in text
    assert "http" not in text.replace("http-equiv", "")  # self-contained: nothing fetched
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            probed.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    reap_browser_orphans()
    title = re.search(r"<title>images (\d+)/(\d+)</title>", out.stdout)
    assert title, out.stdout[:2000] + out.stderr[-2000:]
    loaded, total = map(int, title.groups())
    assert total == len(summary["plots"]) + 1 and len(summary["plots"]) >= 3 and loaded == total, (loaded, total)
    console = [line for line in out.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
