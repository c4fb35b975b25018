"""The documentation site builds without warnings, every Python snippet in it runs, and README.md's test
table states how many tests each part of the suite has."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import suite_parts  # tests/ is on sys.path (conftest.py)

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
SNIPPET = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for k, code in enumerate(SNIPPET.findall(page.read_text())):
            found.append((f"{page.relative_to(ROOT)}#{k}", code))
    return found


@pytest.mark.slow   # the mkdocs build: ~30 s
def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs need the [docs] extra")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_there_are_snippets():
    assert len(snippets()) >= 5


@pytest.mark.slow   # every snippet in an interpreter of its own: ~1-10 s each
@pytest.mark.parametrize("where,code", snippets(), ids=[w for w, _ in snippets()])
def test_snippet_runs(where, code, tmp_path):
    # A fresh interpreter per snippet, as a reader would paste it.
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-2000:]}"


def test_the_readme_states_how_many_tests_each_part_of_the_suite_has(request):
    from shmpool.gym_compat import LEGACY
    if LEGACY:
        pytest.skip("README.md counts the suite under gymnasium 1.x (under 0.29 whole files collect as one skip)")
    found = request.config.stash.get(suite_parts.COLLECTION, None)
    if found is None or not found.whole:   # this run collected part of the suite: collect all of it
        found = suite_parts.collect_in_a_subprocess()
    if found.not_collected:
        pytest.skip(f"README.md counts the suite with every extra of [test]; not collected here: {found.not_collected}")
    table = suite_parts.stated()
    assert set(table) == set(suite_parts.COMMANDS), (
        f"README.md's test table needs a row for each of {list(suite_parts.COMMANDS.values())} in the form "
        f"| `command` | what | about N | about M minutes (YYYY-MM-DD) |; "
        f"it has {sorted(r.command for r in table.values())}")
    wrong = [f"`{row.command}`: README.md says about {row.tests:,} tests, the suite has {found.counted.of(expr):,} "
             f"(write about {found.counted.of(expr):,})"
             for expr, row in table.items() if suite_parts.count_is_off(row.tests, found.counted.of(expr))]
    assert not wrong, (f"README.md's test table is more than {suite_parts.COUNT_TOLERANCE:.0%} off:\n"
                       + "\n".join(wrong))
