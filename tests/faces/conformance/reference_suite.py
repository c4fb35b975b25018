"""Fetch a reference project's own test file from its sdist on the package registry and run it with
shmpool's face swapped in, in a child pytest: the reference's suite is the spec of a drop-in.

The sdist of the *installed* version is downloaded once with pip (the ordinary client) into a cache
directory, so the suite and the library under test always agree."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("SHMPOOL_CONFORMANCE_CACHE", Path.home() / ".cache" / "shmpool-conformance"))


class RegistryUnreachable(RuntimeError):
    """pip could not download the sdist (no network, no such release)."""


def sdist(dist: str) -> Path:
    """The sdist of the installed version of ``dist``, downloaded into the cache on first use."""
    version = metadata.version(dist)
    folder = CACHE / f"{dist}-{version}"
    found = sorted(folder.glob("*.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", "--dest", str(folder), f"{dist}=={version}"],
        capture_output=True, text=True, timeout=300)
    found = sorted(folder.glob("*.tar.gz"))
    if done.returncode != 0 or not found:
        raise RegistryUnreachable(f"pip download {dist}=={version} failed: {done.stderr.strip()[-400:]}")
    return found[0]


def extract(archive: Path, member_suffix: str, dest: Path) -> Path:
    """Write the archive's member ending in ``member_suffix`` into ``dest``; returns its path."""
    with tarfile.open(archive) as tar:
        names = [m for m in tar.getmembers() if m.name.endswith(member_suffix)]
        if not names:
            raise FileNotFoundError(f"{archive.name} has no {member_suffix}")
        data = tar.extractfile(names[0]).read()
    path = dest / Path(member_suffix).name
    path.write_bytes(data)
    return path


def patch(path: Path, old: str, new: str) -> None:
    """Replace one exact line of the reference's test file; a missing line means the suite changed."""
    text = path.read_text()
    if text.count(old) != 1:
        raise AssertionError(f"{path.name}: expected exactly one {old!r}; the reference suite changed, "
                             "update tests/faces/conformance")
    path.write_text(text.replace(old, new))


@dataclass
class Outcome:
    passed: set[str]
    failed: dict[str, str]   # test id -> first line of the failure
    skipped: dict[str, str]  # test id -> skip reason


def run(test_file: Path, timeout: float, extra_args: tuple[str, ...] = (), qualified: bool = False) -> Outcome:
    """Run ``test_file`` (or a folder of them) in a child pytest (its own rootdir, no plugins of ours) and
    read its junit XML; ``qualified``: cases are named ``module::case`` (a folder's files share case names)."""
    report = test_file.with_suffix(".xml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(test_file.parent), os.environ.get(
        "PYTHONPATH")]))}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(test_file.parent),
         f"--junitxml={report}", "-o", "timeout=120", *extra_args, str(test_file)],
        cwd=test_file.parent, env=env, capture_output=True, text=True, timeout=timeout)
    if not report.exists():
        pytest.fail(f"the reference suite {test_file.name} did not run")
    passed, skipped, failed = set(), {}, {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}" if qualified else case.get("name")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            failed[name] = (problem.get("message") or "").split("\n")[0][:300]
        elif case.find("skipped") is not None:
            skipped[name] = case.find("skipped").get("message") or ""
        else:
            passed.add(name)
    return Outcome(passed, failed, skipped)
