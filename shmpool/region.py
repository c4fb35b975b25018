"""The pool's one shared-memory region: created, mapped, handed to the workers, released.

The region is anonymous memory (``shmpool.memory``): workers get its file descriptor
over their pipe, so no crash can leave it in /dev/shm, and no /dev/shm size limits it.  ``release()`` is called only
when no call of the pool is inside the wire (``shmpool.state.Lifecycle`` sees to
that), and frees the memory at once unless the caller still holds arrays that
view it — those keep the mapping alive until they are dropped, never dangling.
"""
from __future__ import annotations

import mmap
import os
from multiprocessing.reduction import send_handle

import posix_ipc

from . import _core
from . import layout as L
from .memory import create_region, map_region
from .workerset import SLICE_NS

# Where the sync counter starts.  A test hook: tests start it just below 2**32 so that a real
# pool's steps carry the 32-bit counter across its wrap.
SYNC_START = 0

class Region:
    """The mapping, its wire (wait/wake on the control words) and its fd."""

    def __init__(self, layout: L.Layout, shard_sizes: list[int], use_semaphores: bool) -> None:
        self.layout = layout
        self.map: mmap.mmap | None = None
        self.wire: _core.Wire | None = None
        self.fd: int | None = None
        self.semaphores: list = []
        self.fd = create_region(layout.size)   # anonymous and reserved: a shortage is a PoolResourceError
        try:
            self.map = map_region(self.fd, layout.size)
            if use_semaphores:
                self.semaphores = [posix_ipc.Semaphore(None, posix_ipc.O_CREX)
                                   for _ in range(_core.Wire.signal_count(len(shard_sizes)))]
            self.wire = _core.Wire(self.map, shard_sizes, num_envs=layout.num_envs,
                                   sems=self.semaphores or None, slice_ns=SLICE_NS)
            self.wire.init_header(SYNC_START)
        except BaseException:
            self.release()
            raise

    @property
    def semaphore_names(self) -> list[str] | None:
        return [sem.name for sem in self.semaphores] or None

    def hand_over(self, conn, pid: int) -> None:
        """Send the region's fd to worker ``pid`` (after its MapRegion message)."""
        send_handle(conn, self.fd, pid)

    def started(self, keep_fd: bool) -> None:
        """Every worker has mapped the region: unlink the semaphores, and close the fd
        unless replacement workers will need it (``on_worker_error="restart"``)."""
        self._unlink_semaphores()
        if not keep_fd:
            self._close_fd()

    def views(self) -> L.Views:
        """Numpy views of every array in the region; binds the wire's result scan."""
        views = L.Views(self.layout, self.map)
        self.wire.bind_results(self.layout.offsets["status"], self.layout.offsets["info_mask"])
        return views

    def release(self) -> bool:
        """Drop the wire, unmap and close the fd.  Call only when every view the pool
        made is dropped and no call is inside the wire.  False if the caller still
        holds views (the mapping then goes with the last of them)."""
        self._close_fd()
        self._unlink_semaphores()
        if self.wire is not None:
            self.wire.release()
            self.wire = None
        unmapped = True
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                unmapped = False   # exported arrays keep the mmap object, and so the mapping, alive
            self.map = None
        return unmapped

    def _unlink_semaphores(self) -> None:
        for sem in self.semaphores:
            try:
                sem.unlink()
            except posix_ipc.ExistentialError:
                pass   # already unlinked
        self.semaphores = []

    def _close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
