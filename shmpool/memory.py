"""The pool's shared region as anonymous memory: sized, reserved and mapped up front.

``memfd_create`` gives memory that no filesystem limits (Docker's and Kubernetes' 64 MB /dev/shm
does not apply) and that vanishes with its last descriptor or mapping, so no crash can leak it;
workers receive the descriptor over their socket.  Its pages are reserved at creation
(``posix_fallocate``), so a shortage fails here, in the constructor, with an error that names the
size, instead of as a SIGBUS in a worker on first touch."""
from __future__ import annotations

import errno
import mmap
import os
import resource
from multiprocessing.reduction import recv_handle

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


def create_region(size: int) -> int:
    """A file descriptor of ``size`` bytes of shared memory with every page reserved.

    Raises ``PoolResourceError`` (an ``OSError``) naming the size when the memory is not there."""
    check_address_space(size)
    if not hasattr(os, "memfd_create"):  # not Linux: a posix shared-memory object, unlinked at once
        shm = posix_ipc.SharedMemory(None, posix_ipc.O_CREX, size=size)
        shm.unlink()
        return shm.fd
    fd = os.memfd_create("shmpool-region", os.MFD_CLOEXEC)
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
