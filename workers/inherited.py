"""What a worker started by ``fork`` lets go of: the trainer's sockets.

A forked worker starts with a copy of every descriptor the trainer had open.  A socket among them
keeps the trainer's listening port bound, and its connections open, for as long as the worker
lives, whatever the trainer closes (and an env could talk on them).  Each such socket is pointed at
``/dev/null`` in place: the descriptor number stays taken, so a Python object of the trainer's
that closes it later closes nothing of ours, and the socket itself is no longer held here.  The
worker's own pipe to the pool is kept (a logging handler of the trainer's that writes to a socket,
syslog's or a SocketHandler, reaches nothing from a worker).  Regular files and pipes are left alone: an env may log
through a handler the trainer configured, as under ``AsyncVectorEnv``; ``start_method="forkserver"``
inherits nothing at all.  Other pools' regions: ``shmpool.memory.drop_inherited_regions``.

A forked worker also starts with every Python object of the trainer's, its unreachable reference
cycles among them; their finalizers are the trainer's to run (``set_aside_trainer_objects``).
"""
from __future__ import annotations

import gc
import os
import stat


def set_aside_trainer_objects() -> None:
    """Keep the trainer's objects out of this process's garbage collection, then turn it on.

    Collected here, a cycle's finalizer acts on the trainer's resources from the wrong process: Ray's
    zero-copy arrays release through the trainer's object-store socket and Ray exits the process
    when that fails (code 1, no words); a buffered file would be flushed twice.  Frozen, they are
    never collected here.  The pool forks with collection off (``WorkerSet.spawn``), so nothing is
    collected before this runs."""
    gc.freeze()
    gc.enable()


def shed_sockets(keep: set[int], fd_dir: str = "/proc/self/fd") -> int:
    """Point every socket descriptor not in ``keep`` at /dev/null; returns how many."""
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
