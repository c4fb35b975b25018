"""Other pools on this machine whose workers are pinned to the cores a new pool would use.

Two training scripts on one box (several seeds at once) each pin their workers to the same cores by
default, and each then runs at about half its speed (two CleanRL Atari runs: 56-58 SPS each against
150-258 alone) with nothing said.  A worker names its process ``shmpool-w<k>`` (``/proc/<pid>/comm``,
``WORKER_NAME_PREFIX``), which any user may read, as any user may read a process's allowed cpus; a new
pool lists the workers of *other* processes pinned to one of its cores, says so once (``Pool`` warns),
and ``repr(pool)`` shows them.  A pool's own process's other pools are not counted (the suite, or a
trainer with a train and an eval pool, decides that itself), nor unpinned workers (``pin=False``: the
kernel spreads them), nor what only looks like a worker: a process a worker's env forked (it keeps the worker's
name and core; its parent is a worker, or once that worker is gone, init or a subreaper, which holds no pool's
region mapped as every trainer does) and the zombies of a trainer that was killed.

Two trainers started at the same moment each look before the other's workers exist, so a pool looks again once
its own workers run (``Pool``): of two pools that start together, the one that looks last sees the other's.
"""
from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass

from .memory import REGION_NAME

WORKER_NAME_PREFIX = "shmpool-w"   # a worker's process name (at most 15 bytes: the kernel's comm)


def name_this_worker(index: int) -> None:
    """Name this process ``shmpool-w<index>`` (its ``comm``; the command line stays as it was)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(f"{WORKER_NAME_PREFIX}{index}"[:15])
    except OSError:   # no /proc: nothing can find us, and nothing else changes
        pass


@dataclass(frozen=True)
class Neighbour:
    """A worker of another process's pool pinned to ``cpu``: its ``pid``, its pool's process ``owner``
    (the parent pid) and that process's ``user``."""

    pid: int
    cpu: int
    owner: int
    user: str


def _field(status: str, name: str) -> str | None:
    for line in status.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


def _cpu_list(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


def _user(uid: int) -> str:
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def _named_worker(proc: str, pid: int | str) -> bool:
    """Whether process ``pid`` bears a worker's name (False when it cannot be read)."""
    try:
        with open(f"{proc}/{pid}/comm") as f:
            return f.read().startswith(WORKER_NAME_PREFIX)
    except OSError:
        return False


def _holds_a_region(proc: str, pid: int | str) -> bool | None:
    """Whether process ``pid`` maps a pool's region, as a trainer does for its pools' lives (None when its maps
    cannot be read: another user's process)."""
    try:
        with open(f"{proc}/{pid}/maps") as f:
            return any(f"/memfd:{REGION_NAME}" in line for line in f)
    except OSError:
        return None


def _orphaned(proc: str, owner: int) -> bool:
    """Whether a process named like a worker, child of ``owner``, was left behind by one (an env's helper
    adopted by init or a subreaper): a worker dies with its trainer, which maps its region all along."""
    holds = _holds_a_region(proc, owner)
    return holds is False or (holds is None and owner == 1)


GONE = ("Z", "X")   # a zombie (exited, not reaped: a killed trainer's workers under a reaper-less init), dead


def pinned_neighbours(cpus: list[int], proc: str = "/proc", exclude: Collection[int] = ()) -> list[Neighbour]:
    """The workers of other processes' pools pinned to exactly one of ``cpus``, by cpu then pid (empty
    where ``/proc`` cannot be read); ``exclude``: pids never counted (the asking pool's own workers)."""
    me = os.getpid()
    wanted = set(cpus)
    found = []
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid in exclude or not _named_worker(proc, pid):
            continue
        try:
            with open(f"{proc}/{pid}/status") as f:
                status = f.read()
        except OSError:   # gone meanwhile, or not ours to read
            continue
        owner, allowed, uid = _field(status, "PPid"), _field(status, "Cpus_allowed_list"), _field(status, "Uid")
        if owner is None or allowed is None or int(owner) == me:
            continue
        if (_field(status, "State") or "?")[:1] in GONE or _named_worker(proc, owner) or _orphaned(proc, int(owner)):
            continue   # gone, or an env's helper (its worker still there, or gone)
        pinned = _cpu_list(allowed)
        if len(pinned) == 1 and pinned <= wanted:
            found.append(Neighbour(pid, pinned.pop(), int(owner), _user(int(uid.split()[0])) if uid else "?"))
    return sorted(found, key=lambda n: (n.cpu, n.pid))


def describe(neighbours: list[Neighbour] | tuple[Neighbour, ...]) -> str:
    """The neighbours as ``repr(pool)`` and the warning say them."""
    owners = sorted({(n.owner, n.user) for n in neighbours})
    who = ", ".join(f"process {pid} of user {user}" for pid, user in owners)
    cpus = sorted({n.cpu for n in neighbours})
    return f"cpus {cpus} shared with the workers of another shmpool pool ({who})"


def warning(neighbours: list[Neighbour] | tuple[Neighbour, ...], free: list[int]) -> str:
    """What a pool pinned beside ``neighbours`` warns of, with what to do (``free``: allowed cores none
    of them is pinned to)."""
    advice = (f"give each pool its own cores with cpus= (free here: {free})" if free else
              "no allowed core is free of them: give each pool its own cores with cpus= on a larger machine")
    return (f"this pool's workers are pinned to {describe(neighbours)}: both pools then run at about half "
            f"speed; {advice}, or pin=False to let the kernel place the workers")
