"""The pool's shared region as anonymous memory: sized, reserved and mapped up front.

``memfd_create`` gives memory that no filesystem limits (Docker's and Kubernetes' 64 MB /dev/shm
does not apply) and that vanishes with its last descriptor or mapping, so no crash can leak it;
workers receive the descriptor over their socket.  Its pages are reserved at creation
(``posix_fallocate``), so a shortage fails here, in the constructor, with an error that names the
size, instead of as a SIGBUS in a worker on first touch.  Before that, ``check_memory`` compares the
size with what this process may really get (its memory cgroups' limits, the host's MemAvailable), so a
region that does not fit is refused at once instead of reserved until the kernel's OOM killer ends
the process (exit 137)."""
from __future__ import annotations

import errno
import mmap
import os
import resource
from dataclasses import dataclass
from multiprocessing.reduction import recv_handle
from pathlib import Path

import posix_ipc
import psutil

from .errors import PoolResourceError

_FIX = ("use fewer envs or smaller observations, or give the process more memory "
        "(container memory limit, ulimit -v)")


def human(size: int) -> str:
    """``size`` bytes in words: '4.0 GiB'."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def check_address_space(size: int) -> None:
    """Refuse at once a region this process could not map under its address-space limit (``ulimit -v``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return
    used = psutil.Process().memory_info().vms
    if used + size > soft:
        raise PoolResourceError(
            f"the pool's shared region needs {human(size)} ({size} bytes) but this process may map only "
            f"{human(soft - used)} more under its address-space limit (RLIMIT_AS, ulimit -v) of {human(soft)}: "
            f"{_FIX}", errno_=errno.ENOMEM, resource="address space", size=size, limit=soft)


# --- memory the process may really get: cgroup limits (v2 and v1) and MemAvailable ---

# A limit this high is none: cgroup v1 writes "unlimited" as its largest page count in bytes
# (9223372036854771712 with 4 KiB pages), v2 writes "max".
_UNLIMITED = 1 << 60

# Page cache a cgroup can give back before its limit bites.  Not v2's "file", which counts shmem
# too (tmpfs, memfd: another pool's region), memory no reclaim frees without swap; the file LRU
# lists hold only the page cache the kernel can drop.  Active pages count as well: the kernel
# deactivates and drops them before it OOM-kills.
_RECLAIMABLE_V2 = ("inactive_file", "active_file", "slab_reclaimable")
_RECLAIMABLE_V1 = ("total_inactive_file", "total_active_file")

# A region is refused only when it exceeds the room by more than this (1/32 of the room, at
# least 16 MiB).  The numbers are a snapshot and the kernel can do better than they say: it
# reclaims more than we count (slabs, other caches), MemAvailable leaves out its low watermark and
# half of the reclaimable slab, v1's usage lags by per-cpu charge batches.  Refusing a pool that
# would have run is the worse mistake: a region within the slack is left to posix_fallocate.
_SLACK_MIN = 16 << 20


def _slack(room: int) -> int:
    return max(_SLACK_MIN, room // 32)


@dataclass(frozen=True)
class MemoryLimit:
    """One bound on the memory a new region may take.

    ``room``: bytes that still fit under it (free swap the limit allows included); ``limit``: the
    limit itself (a cgroup's ``memory.max``, the host's MemAvailable); ``used``: what already counts
    against it and cannot be reclaimed; ``where``: the file it was read from; ``cgroup``: the
    cgroup's path, None for the host."""

    room: int
    limit: int
    used: int
    where: str
    cgroup: str | None = None

    def shortage(self) -> str:
        """Why a region does not fit, the clause after "needs N bytes but"."""
        swap_room = self.room - max(0, self.limit - self.used)
        swap = f", plus {human(swap_room)} of free swap" if swap_room > 0 else ""
        if self.cgroup is None:
            return f"this host has only {human(self.limit)} available (MemAvailable in {self.where}){swap}"
        return (f"only {human(self.room)} more fits under the memory limit of {human(self.limit)} of the cgroup "
                f"{self.cgroup} ({self.where}, {human(self.used)} of it in use{swap})")

    def fix(self) -> str:
        if self.cgroup is None:
            return "use fewer envs or smaller observations, or free memory on this host"
        return ("use fewer envs or smaller observations, or raise the memory limit "
                "(docker run -m, a Kubernetes memory limit, the cgroup's memory limit)")


def _read(path: Path) -> str | None:
    """A small file's text, or None when it cannot be read (missing, permission, not a file)."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: Path) -> int | None:
    """A cgroup file's byte count; None when unreadable or unlimited ("max", a huge v1 value)."""
    text = _read(path)
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:   # "max"
        return None
    return value if 0 <= value < _UNLIMITED else None


def _stat_sum(path: Path, keys: tuple[str, ...]) -> int | None:
    """The sum of ``keys`` in a ``memory.stat`` file; None when it cannot be read."""
    text = _read(path)
    if text is None:
        return None
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in keys and parts[1].isdigit():
            total += int(parts[1])
    return total


def _meminfo(proc: Path) -> dict[str, int]:
    """/proc/meminfo in bytes (values are in kB); empty when unreadable."""
    out: dict[str, int] = {}
    for line in (_read(proc / "meminfo") or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def _own_cgroups(proc: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process, from ``/proc/self/cgroup``."""
    v2 = v1 = None
    for line in (_read(proc / "self" / "cgroup") or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _ancestors(mount: Path, path: str) -> list[tuple[Path, str]]:
    """The cgroup's directory and each parent up to the mount, with their cgroup paths: a parent's
    limit binds its children too.  Directories that do not exist here are skipped (a container sees
    its own cgroup as the mount's root, though /proc/self/cgroup may name the host's path)."""
    parts = [p for p in path.split("/") if p]
    out = []
    for k in range(len(parts), -1, -1):
        d = mount.joinpath(*parts[:k])
        if d.is_dir():
            out.append((d, "/" + "/".join(parts[:k])))
    return out


def memory_limits(proc: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> list[MemoryLimit]:
    """Every bound on the memory this process may still take: each of its memory cgroups with a
    limit (v2 ``memory.max`` less ``memory.current``, v1 ``memory.limit_in_bytes`` less
    ``memory.usage_in_bytes``, page cache it can reclaim not counted as used) and the host's
    ``MemAvailable``.  Free swap is added where the limits allow it (``memory.swap.max``, v1's
    ``memory.memsw.limit_in_bytes``): the region's pages can be swapped out.  A few small file reads;
    a file that cannot be read gives no bound, never an error."""
    proc, root = Path(proc), Path(cgroup_root)
    info = _meminfo(proc)
    swap_free = info.get("SwapFree", 0)
    found: list[MemoryLimit] = []
    v2, v1 = _own_cgroups(proc)
    if v2 is not None:
        mount = root if (root / "cgroup.controllers").exists() else root / "unified"
        for d, name in _ancestors(mount, v2):
            limit = _number(d / "memory.max")
            if limit is None:
                continue
            used = _used(d / "memory.current", d / "memory.stat", _RECLAIMABLE_V2)
            swap = swap_free
            swap_max = _number(d / "memory.swap.max")   # None: "max", or no swap accounting
            if swap_max is not None:
                swap = min(swap, max(0, swap_max - (_number(d / "memory.swap.current") or 0)))
            found.append(MemoryLimit(max(0, limit - used) + swap, limit, used, str(d / "memory.max"), name))
    mount = root / "memory"
    if v1 is not None:
        for d, name in _ancestors(mount, v1):
            limit = _number(d / "memory.limit_in_bytes")
            if limit is None:
                continue
            used = _used(d / "memory.usage_in_bytes", d / "memory.stat", _RECLAIMABLE_V1)
            room = max(0, limit - used) + swap_free
            memsw = _number(d / "memory.memsw.limit_in_bytes")   # memory + swap; absent without swap accounting
            if memsw is not None:
                memsw_used = _used(d / "memory.memsw.usage_in_bytes", d / "memory.stat", _RECLAIMABLE_V1)
                room = min(room, max(0, memsw - memsw_used))
            found.append(MemoryLimit(room, limit, used, str(d / "memory.limit_in_bytes"), name))
    if "MemAvailable" in info:
        available = info["MemAvailable"]
        found.append(MemoryLimit(available + swap_free, available, 0, str(proc / "meminfo")))
    return found


def _used(usage_file: Path, stat_file: Path, reclaimable: tuple[str, ...]) -> int:
    """A cgroup's usage less the page cache it can reclaim.  Without ``memory.stat`` the usage is
    not counted at all (only the limit is compared): part of it may be cache, and a check that cannot
    tell must not refuse what would fit."""
    usage = _number(usage_file)
    cache = _stat_sum(stat_file, reclaimable)
    if usage is None or cache is None:
        return 0
    return max(0, usage - cache)


def check_memory(size: int, proc: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> None:
    """Refuse at once a region that does not fit in the memory this process may really get: the
    tightest of its memory cgroups' limits (a container's ``docker run -m``, a Kubernetes memory
    limit) and the host's MemAvailable (``memory_limits``).  Reserving it anyway would end with the
    kernel's OOM killer (exit 137), not an error.  Raises ``PoolResourceError`` naming the size, the
    limit and the fix; a region within a small slack of the room is let through (``_SLACK_MIN``)."""
    for bound in sorted(memory_limits(proc, cgroup_root), key=lambda b: b.room):
        if size > bound.room + _slack(bound.room):
            raise PoolResourceError(
                f"the pool's shared region needs {human(size)} ({size} bytes) but {bound.shortage()}: {bound.fix()}",
                errno_=errno.ENOMEM, resource="memory", size=size, limit=bound.limit)


REGION_NAME = "shmpool-region"   # the memfd's name: how /proc/<pid>/maps and /proc/<pid>/fd show a region

_PROT_NONE, _MAP_FIXED, _MAP_NORESERVE = 0, 0x10, 0x4000   # Linux's values (the mmap module lacks them)


def drop_inherited_regions(proc: str = "/proc/self") -> int:
    """In a worker started by ``fork``: let go of every pool region it inherited from the trainer
    (other pools' regions, mapped and maybe open there), before it maps its own.  Otherwise a
    pool's memory stays allocated after its ``close()`` for as long as another pool's workers
    live, and their envs could write into it.  Each inherited mapping is replaced in place by an
    inaccessible anonymous one (the Python objects that point at it are the forked pools', which
    refuse every call), and each inherited region fd is closed.  Returns how many mappings went.

    Ranges come from the kernel's own list (``maps``), never from remembered addresses: an address
    the trainer unmapped and reused must not be touched."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    dropped = 0
    try:
        with open(f"{proc}/maps") as f:
            ranges = [line.split()[0] for line in f if f"/memfd:{REGION_NAME}" in line]
    except OSError:
        return 0
    for span in ranges:
        start, end = (int(x, 16) for x in span.split("-"))
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE
        if libc.mmap(start, end - start, _PROT_NONE, flags, -1, 0) == start:
            dropped += 1
    try:
        fds = os.listdir(f"{proc}/fd")
    except OSError:
        fds = []
    for name in fds:
        try:
            if os.readlink(f"{proc}/fd/{name}").startswith(f"/memfd:{REGION_NAME}"):
                os.close(int(name))
        except OSError:
            pass   # the listing's own fd, already gone
    return dropped


def check_room(size: int) -> None:
    """``PoolResourceError`` when a region of ``size`` bytes cannot be had: more than the address
    space or the memory this process may get (``check_address_space``, ``check_memory``)."""
    check_address_space(size)
    check_memory(size)


def create_region(size: int) -> int:
    """A file descriptor of ``size`` bytes of shared memory with every page reserved.

    Raises ``PoolResourceError`` (an ``OSError``) naming the size when the memory is not there:
    before reserving anything when a limit says so (``check_room``)."""
    check_room(size)
    if not hasattr(os, "memfd_create"):  # not Linux: a posix shared-memory object, unlinked at once
        shm = posix_ipc.SharedMemory(None, posix_ipc.O_CREX, size=size)
        shm.unlink()
        return shm.fd
    fd = os.memfd_create(REGION_NAME, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        os.close(fd)
        raise PoolResourceError(
            f"the pool's shared region needs {human(size)} ({size} bytes) and the system could not reserve it "
            f"({os.strerror(exc.errno)}): {_FIX}", errno_=exc.errno, resource="memory", size=size,
            limit=None) from exc
    return fd


def map_region(fd: int, size: int) -> mmap.mmap:
    """Map the region; a refusal names the size."""
    try:
        return mmap.mmap(fd, size)
    except OSError as exc:
        raise PoolResourceError(
            f"mapping the pool's shared region of {human(size)} ({size} bytes) failed "
            f"({os.strerror(exc.errno)}): {_FIX}", errno_=exc.errno, resource="address space", size=size,
            limit=None) from exc


def receive_region(conn, size: int) -> mmap.mmap:
    """Inside a worker: receive the region's descriptor on ``conn`` and map it.

    The worker's own limits are checked here, where they bite: no free file descriptor
    (``RLIMIT_NOFILE``, which its envs may have used up) or no address space (``RLIMIT_AS``)
    raises ``PoolResourceError`` naming the limit, the size and what to change."""
    try:
        fd = recv_handle(conn)
    except (RuntimeError, OSError) as exc:   # RuntimeError: the kernel dropped the descriptor it had no room for
        if isinstance(exc, OSError) and exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        raise PoolResourceError(
            f"could not receive the pool's shared region: no free file descriptor under its RLIMIT_NOFILE "
            f"(ulimit -n) of {soft}, which its envs have used up: raise the limit (ulimit -n, a container's "
            f"nofile limit) or open fewer files per env", errno_=errno.EMFILE, resource="file descriptors",
            size=None, limit=None if soft == resource.RLIM_INFINITY else soft) from exc
    try:
        check_address_space(size)
        return map_region(fd, size)
    finally:
        os.close(fd)
