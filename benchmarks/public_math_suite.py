"""A public grader's own regression cases, as (gold, prediction, expected) triples: math_verify's test suite, read
from its source distribution on PyPI (the version coati pins, checked by its SHA-256). The files are parsed, never
run: each ``pytest.mark.parametrize`` table whose test compares a gold answer with a prediction under the grader's
defaults is read as literals. Kept out of the repository; downloaded once into the user's own cache folder.

    from benchmarks.public_math_suite import public_cases
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from coati.default_model import CACHE

VERSION = "0.9.0"
SHA256 = "45ac6c61344ba056b9e99a660a4bc8d044ed408f730aed68c60435aa5eec4645"
SDIST = f"math_verify-{VERSION}.tar.gz"

SETTINGS = {"match_types", "precision"}
"""keyword arguments a table may give its comparison and still be read: which extractors and how many digits.
Tables that loosen or tighten the verdict itself (``strict``, ``allow_set_relation_comp``) are left out."""

CONVENTIONS = {
    (
        "test_all.py",
        "test_latex_notation",
        "$9$",
        "Answer $ \n 9 \n $",
    ): "the grader's rule that inline math may not span lines; the answer stated is 9, which is right",
    (
        "test_all.py",
        "test_latex_notation",
        "$9$",
        "Answer \\( \n 9 \n \\)",
    ): "the same rule for \\( \\); the answer stated is 9, which is right",
}
"""cases where the suite expects 0 for a right answer written in a way its parser declines; coati's 1 there is not a
false positive"""


def sdist(cache: Path | None = None) -> Path:
    """The source distribution, downloaded with pip into ``<cache>/public-suites`` (a folder of the user's own) if
    it is not there; its hash is checked either way."""
    folder = Path(cache or os.environ.get("COATI_CACHE", CACHE)) / "public-suites"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    path = folder / SDIST
    if not path.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"math-verify=={VERSION}", "--dest", str(folder)],
            check=True,
        )  # fmt: skip
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise ValueError(f"{path} has SHA-256 {digest}, not math-verify {VERSION}'s {SHA256}: delete it")
    return path


def public_cases(cache: Path | None = None) -> list[dict]:
    """Every readable case: file, test, gold, pred, expected (0 or 1)."""
    cases = []
    with tarfile.open(sdist(cache)) as archive:
        for member in sorted(archive.getmembers(), key=lambda m: m.name):
            parts = Path(member.name).parts
            if len(parts) == 3 and parts[1] == "tests" and parts[2].startswith("test_") and member.isfile():
                text = io.TextIOWrapper(archive.extractfile(member), encoding="utf-8").read()
                cases += cases_in(parts[2], text)
    return cases


def cases_in(file: str, source: str) -> list[dict]:
    cases = []
    for fn in ast.parse(source).body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        settings = comparison_settings(fn)
        if settings is None:
            continue
        for table in (d for d in fn.decorator_list if is_parametrize(d)):
            names = [n.strip() for n in ast.literal_eval(table.args[0]).split(",")]
            try:
                rows = ast.literal_eval(table.args[1])
            except ValueError:  # a table built by code (f-strings, calls): not a literal, left out
                continue
            for row in rows:
                values = dict(zip(names, row, strict=True))
                expected = values.get("expected", values.get("result"))
                if {"gold", "pred"} <= values.keys() and expected in (0, 1):
                    cases.append(
                        {"file": file, "test": fn.name, "gold": values["gold"], "pred": values["pred"],
                         "expected": int(expected)}
                    )  # fmt: skip
    return cases


def is_parametrize(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize" and len(node.args) == 2


def comparison_settings(fn: ast.FunctionDef) -> dict | None:
    """The keywords the test's comparison passes, or None when it compares otherwise than the defaults allow."""
    calls = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("compare_strings", "verify")
    ]
    if not calls:
        return None
    keywords = {k.arg for call in calls for k in call.keywords}
    return None if keywords - SETTINGS else {"keywords": sorted(keywords)}
