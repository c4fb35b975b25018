"""Counting the parent's slices, for tests that bound a wait (issue 70).

Every wait of the pool's process runs in one loop (``shmpool.waiting.in_slices``): a slice waits at most
``SLICE_NS`` for what it waits for, then the parent looks up (dead workers, a close requested, a timeout)
and waits again.  A bound in seconds ("noticed within 3 s") is stretched by a loaded machine and says
little on a quiet one; a count of looks is neither: a dead worker is found at the first look after its
death, a deadline of ``t`` seconds ends after at most ``looks_within(t)`` looks however slow each is.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import pytest

from shmpool.restarts import Restarts
from shmpool.supervisor import Supervisor
from shmpool.waiting import SLICE_S, in_slices


def looks_within(seconds: float) -> int:
    """The most looks a wait cut at a deadline ``seconds`` away can make: each slice lasts its full length
    (``SLICE_S``) unless what it waits for comes, and the last one shrinks to end at the deadline."""
    return math.ceil(seconds / SLICE_S) + 1


def exited(pid: int) -> bool:
    """Whether this process's child ``pid`` has exited (without reaping it: the pool still does)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:   # reaped already
        return True


def wait_exited(pid: int) -> None:
    """Block until this process's child ``pid`` has exited (not reaping it)."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


@dataclass
class Wait:
    """One ``in_slices`` wait: the looks between its slices, and whether what it waited for came
    (``met``: False when its deadline ended it; None when a look raised)."""

    looks: int = 0
    met: bool | None = None


def record_waits(monkeypatch: pytest.MonkeyPatch, module) -> list[Wait]:
    """Every wait ``module`` (e.g. ``shmpool.workerset``) makes through its ``in_slices`` from now on."""
    waits: list[Wait] = []

    def recorded(ready, between, *args, **kwargs):
        wait = Wait()
        waits.append(wait)

        def look():
            wait.looks += 1
            return between()
        wait.met = in_slices(ready, look, *args, **kwargs)
        return wait.met
    monkeypatch.setattr(module, "in_slices", recorded)
    return waits


@dataclass
class Looks:
    """The supervisor's looks between two slices over the test (``Supervisor.between_slices``): how many,
    the look at which each replacement was made, the looks that raised (a death, a timeout, a close), and
    for each pid in ``watch`` the first look that began with that process already exited."""

    count: int = 0
    replaced_at: list[int] = field(default_factory=list)
    raised_at: list[int] = field(default_factory=list)
    watch: set[int] = field(default_factory=set)
    found_exited_at: dict[int, int] = field(default_factory=dict)


def count_looks(monkeypatch: pytest.MonkeyPatch) -> Looks:
    looks = Looks()
    between, replace = Supervisor.between_slices, Restarts.replace

    def counted(self, *args, **kwargs):
        looks.count += 1
        for pid in looks.watch - set(looks.found_exited_at):
            if exited(pid):
                looks.found_exited_at[pid] = looks.count
        try:
            return between(self, *args, **kwargs)
        except BaseException:
            looks.raised_at.append(looks.count)
            raise

    def replaced(self, *args, **kwargs):
        looks.replaced_at.append(looks.count)
        return replace(self, *args, **kwargs)
    monkeypatch.setattr(Supervisor, "between_slices", counted)
    monkeypatch.setattr(Restarts, "replace", replaced)
    return looks


def count_watch_looks(monkeypatch: pytest.MonkeyPatch) -> Looks:
    """A RayPool's looks between two slices (``Watch.after_slice`` of shmpool/distributed/faults.py, every wait of
    a RayPool call) from now on: how many, and which raised (a limit, a close, a death).  Ray is imported here,
    not with this module (tests/heavy_imports.py)."""
    from shmpool.distributed import faults
    looks = Looks()
    real = faults.Watch.after_slice

    def counted(self, waiting_on):
        looks.count += 1
        try:
            return real(self, waiting_on)
        except BaseException:
            looks.raised_at.append(looks.count)
            raise
    monkeypatch.setattr(faults.Watch, "after_slice", counted)
    return looks


def record_stops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """How a RayPool's actors are stopped from now on: "close" (its pools asked to close, waited for up to the
    close's grace, then killed: "close", "kill") or "kill" alone (at once, no grace waited)."""
    from shmpool.distributed.fleet import Fleet
    stops: list[str] = []
    close, kill_all = Fleet.close, Fleet.kill_all

    def closing(self, *args, **kwargs):
        stops.append("close")
        return close(self, *args, **kwargs)

    def killing(self, *args, **kwargs):
        stops.append("kill")
        return kill_all(self, *args, **kwargs)
    monkeypatch.setattr(Fleet, "close", closing)
    monkeypatch.setattr(Fleet, "kill_all", killing)
    return stops
