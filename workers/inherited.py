"""What a worker lets go of after a fork from the trainer: one room, one function (``let_go_of_the_trainer``),
which the worker's entry (``loop.main``) calls first of all; its steps run in the order below.

A forked worker starts with a copy of the trainer: every Python object (unreachable reference cycles
among them), every descriptor (sockets, other pools' region fds), every mapping (other pools' regions),
and thread pools sized for every core.  None of it is the worker's:

1. The trainer's objects leave this process's garbage collection (``set_aside_trainer_objects``):
   collected here, a cycle's finalizer acts on the trainer's resources from the wrong process.  The
   parent half of this step is ``collection_paused``: the pool forks with collection off, so nothing
   is collected before this step runs.  First, because any later step can allocate.
2. Other pools' regions are let go (``shmpool.memory.drop_inherited_regions``, beside the region's
   other memory code): held, a closed pool's memory stays allocated for as long as this worker lives,
   and its envs could write into it.
3. The trainer's sockets are pointed at /dev/null in place (``shed_sockets``): held, the trainer's
   listening ports stay bound and its connections open for as long as this worker lives.
4. The trainer's thread pools run one thread each (``shmpool.thread_limits.one_thread_each``): this
   worker owns one core, and a BLAS or OpenMP or OpenCV pool sized for every core would fight the
   other workers.

A worker started by ``spawn`` or ``forkserver`` inherits none of it; each step is then (close to) a no-op.
What stays elsewhere, being another idea: the kernel's parent-death signal and the parent check
(``loop.ParentWatch``: what the worker holds on to, its parent, not what it lets go of, and used by the
serving loop); Ctrl-C ignored and the cpu pinned (``loop``: the worker's own set-up under any start
method); the at-fork hooks of the trainer (``shmpool.pool``: a child of the trainer owns no pool;
``shmpool.openmp``: a child has none of the trainer's OpenMP threads) and of the worker
(``workers.forks``: a process an env forks never acts as the worker), which act in any child, not in a
worker at its start.
"""
from __future__ import annotations

import contextlib
import gc
import os
import stat
import threading

from shmpool.memory import drop_inherited_regions
from shmpool.thread_limits import one_thread_each


def let_go_of_the_trainer(keep: set[int], libraries=None) -> None:
    """In a worker at its start: let go of what a fork copied from the trainer, in order (see the module).
    ``keep``: the descriptors that are the worker's own (its pipe to the pool); ``libraries``: the BLAS and
    OpenMP libraries the trainer found just before forking (``shmpool.thread_limits.found_for_fork``;
    None: found here)."""
    set_aside_trainer_objects()   # 1: first, before anything here can trigger a collection
    drop_inherited_regions()      # 2: before this worker maps its own region
    shed_sockets(keep)            # 3
    one_thread_each(libraries)    # 4: before any env is built (its libraries read the environment)


# --- 1. the trainer's objects ----------------------------------------------------------------------

_COLLECTION_SWITCH = threading.Lock()


def _fresh_switch() -> None:   # a child forked while another thread held the switch starts with it free
    global _COLLECTION_SWITCH
    _COLLECTION_SWITCH = threading.Lock()


os.register_at_fork(after_in_child=_fresh_switch)


@contextlib.contextmanager
def collection_paused():
    """Garbage collection off in this process for the block, as it was after.  Around a fork (in the trainer,
    ``WorkerSet.spawn``), so the child starts with it off: nothing of the trainer's is collected there before
    ``set_aside_trainer_objects`` runs.  Locked, so pools started from two threads at once cannot leave it off."""
    with _COLLECTION_SWITCH:
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()


def set_aside_trainer_objects() -> None:
    """Keep the trainer's objects out of this process's garbage collection, then turn it on.

    Collected here, a cycle's finalizer acts on the trainer's resources from the wrong process: Ray's
    zero-copy arrays release through the trainer's object-store socket and Ray exits the process
    when that fails (code 1, no words); a buffered file would be flushed twice.  Frozen, they are
    never collected here.  The pool forks with collection off (``collection_paused``), so nothing is
    collected before this runs."""
    gc.freeze()
    gc.enable()


# --- 3. the trainer's sockets ----------------------------------------------------------------------

def shed_sockets(keep: set[int], fd_dir: str = "/proc/self/fd") -> int:
    """Point every socket descriptor not in ``keep`` at /dev/null; returns how many.

    The descriptor number stays taken, so a Python object of the trainer's that closes it later closes
    nothing of ours, and the socket itself is no longer held here.  The worker's own pipe to the pool is
    kept (a logging handler of the trainer's that writes to a socket, syslog's or a SocketHandler, reaches
    nothing from a worker).  Regular files and pipes are left alone: an env may log through a handler the
    trainer configured, as under ``AsyncVectorEnv``."""
    try:
        names = os.listdir(fd_dir)
    except OSError:   # no /proc: leave everything as it is
        return 0
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    shed = 0
    try:
        for name in names:
            fd = int(name)
            if fd in keep or fd == devnull or fd <= 2:
                continue
            try:
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    continue
                os.dup2(devnull, fd)
                shed += 1
            except OSError:   # the listing's own descriptor, already gone
                continue
    finally:
        os.close(devnull)
    return shed
