"""The documentation site builds without warnings, and every Python snippet in it runs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # the mkdocs build, and every snippet run in its own interpreter

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for k, code in enumerate(SNIPPET.findall(page.read_text())):
            found.append((f"{page.relative_to(ROOT)}#{k}", code))
    return found


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs need the [docs] extra")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_there_are_snippets():
    assert len(snippets()) >= 5


@pytest.mark.parametrize("where,code", snippets(), ids=[w for w, _ in snippets()])
def test_snippet_runs(where, code, tmp_path):
    # A fresh interpreter per snippet, as a reader would paste it.
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-2000:]}"
