"""A process an env forks inside a worker never acts as that worker.

An env may fork: ``subprocess`` (which execs at once), a ``multiprocessing`` child (which runs its
target and leaves with ``os._exit``), or a bare ``os.fork()`` whose child returns from the env's
call.  That last child is a second copy of the worker: it would write its shard's rows in the
shared region and answer on the worker's pipe beside the worker, and the trainer would read a mix
of the two (a CartPole shard returned counts one step behind, 28 steps of 29).  So a worker marks
any process forked from it (``os.register_at_fork``), and each place where an env's code returns
into the worker (``Shard``'s step and reset, a batched shard's calls, ``call``/``get_attr``/
``set_attr``) ends such a child at once, before it touches anything the worker owns.  A
``multiprocessing`` or ``subprocess`` child never returns there and is not affected.
"""
from __future__ import annotations

import os
import sys

in_child = False   # True in a process forked from a worker (read after every env call: one global)


def _mark_child() -> None:
    global in_child
    in_child = True


def watch_forks() -> None:
    """Mark every process this worker forks from now on (call once, in the worker)."""
    os.register_at_fork(after_in_child=_mark_child)


def leave_child(what: str) -> None:
    """End this process: it was forked inside an env's ``what`` and returned into the worker."""
    try:
        sys.stderr.write(f"shmpool: a process forked inside {what} returned into the worker's loop; it exits "
                         "here so that it cannot write the worker's rows or answer on its pipe\n")
        sys.stderr.flush()
    finally:
        os._exit(0)
