"""The suite's parts as README.md states them, and as a run finds them (issues 59 and 60).

README.md's test table has a row per command: the whole suite (``--all``), the fast part (``pytest`` with
no ``-m``: ``conftest.py`` leaves the slow tests out) and ``-m slow``, each with its number of tests and its
time on 2 quiet cores and the date it was measured::

    | `python -m pytest -q` | the fast part: faces, units, ... | about 1,320 | about 2 minutes (2026-11-29) |

The counts are checked: ``tests/project/test_docs.py`` fails when one is more than ``COUNT_TOLERANCE`` off
the suite as collected, naming the number to write.  The times are a machine's, so they are shown,
not checked: ``conftest.py`` prints, at the end of a run of one of those commands, what it took beside
what the table says (``compare``), with the machine's cores and load, and the lead writes a new time
from a quiet machine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# The parts and the commands that run them.  The fast part is the default (issue 70): a contributor who
# types `pytest` gets the ~2 minute run, and the whole suite is one option away (conftest.py's --all).
COMMANDS = {"all": "python -m pytest -q --all", "fast": "python -m pytest -q", "slow": "python -m pytest -q -m slow"}
PARTS = tuple(COMMANDS)
# How far a stated count may be from the suite's before tests/project/test_docs.py fails: the table is read
# for its size, so a few tests added since it was written need no edit; a stale table (969 stated
# for 1,219) fails.
COUNT_TOLERANCE = 0.05

_ROW = re.compile(r"^\| `(?P<command>python -m pytest[^`]*)` \| [^|]+ \| about (?P<tests>[\d,]+) \| "
                  r"about (?P<minutes>[\d.]+) minutes \((?P<date>\d{4}-\d\d-\d\d)\) \|$", re.M)


@dataclass(frozen=True)
class Stated:
    """One row of README.md's test table."""

    command: str
    tests: int
    minutes: float
    measured: str    # the date, YYYY-MM-DD


@dataclass(frozen=True)
class Counted:
    """The items a collection of the whole suite found in each part (before ``-m`` deselects any)."""

    fast: int
    slow: int

    def of(self, part: str) -> int:
        return {"all": self.fast + self.slow, "fast": self.fast, "slow": self.slow}[part]


@dataclass(frozen=True)
class Collection:
    """What a run's collection found: the parts' counts, whether it collected from every test file
    (``whole``: no file named or ignored), and the files it could not collect (skipped for a missing
    extra, or failed)."""

    counted: Counted
    whole: bool
    not_collected: tuple[str, ...]


COLLECTION = pytest.StashKey[Collection]()            # set by conftest.py at collection
STARTED = pytest.StashKey[tuple[float, float]]()      # the run's start (time.monotonic()) and load average
WRITE_COLLECTION_TO = "SHMPOOL_WRITE_COLLECTION_TO"   # conftest.py writes the Collection there as JSON


def write(found: Collection, path: str) -> None:
    Path(path).write_text(json.dumps(dataclasses.asdict(found)))


def collect_in_a_subprocess() -> Collection:
    """The whole suite's collection, for a run that collected only some of it (~20 s on 2 quiet cores)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "collection.json")
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**os.environ, WRITE_COLLECTION_TO: out})
        if not os.path.exists(out):
            raise AssertionError(f"the suite's collection wrote no counts:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
        raw = json.loads(Path(out).read_text())
    return Collection(Counted(**raw["counted"]), raw["whole"], tuple(raw["not_collected"]))


def stated(text: str | None = None) -> dict[str, Stated]:
    """README.md's test table by part (``"all"``, ``"fast"``, ``"slow"``)."""
    text = README.read_text() if text is None else text
    by_command = {m["command"]: Stated(m["command"], int(m["tests"].replace(",", "")), float(m["minutes"]),
                                       m["date"]) for m in _ROW.finditer(text)}
    return {part: by_command[command] for part, command in COMMANDS.items() if command in by_command}


def count_is_off(said: int, found: int) -> bool:
    return abs(said - found) > COUNT_TOLERANCE * found


def minutes_and_seconds(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def part_run(markexpr: str, whole: bool) -> str | None:
    """The part a run with mark expression ``markexpr`` (and ``--all`` when ``whole``) selects, if it is one."""
    if markexpr == "slow":
        return "slow"
    if markexpr == "not slow" or (markexpr == "" and not whole):
        return "fast"
    return "all" if markexpr == "" else None


def compare(part: str, seconds: float, counted: Counted | None, cores: int, load: tuple[float, float]) -> str:
    """One line for the end of a run of README's command for ``part``: what it took beside the table
    (``load``: the 1-minute load average at the run's start and end; others' load stretches a run)."""
    row = stated().get(part)
    if row is None:
        return f"README.md's test table has no row for `{COMMANDS[part]}`"
    found = "" if counted is None else f"{counted.of(part):,} tests, "
    return (f"`{row.command}`: {found}{minutes_and_seconds(seconds)} here ({cores} cores, load average "
            f"{load[0]:.1f} at the start, {load[1]:.1f} at the end); README.md: about {row.tests:,} tests, about "
            f"{row.minutes:g} minutes on 2 quiet cores (measured {row.measured})")
