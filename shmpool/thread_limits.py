"""Each worker runs its BLAS and OpenMP libraries with one thread; a forked worker's are found in the trainer.

A worker owns one core: a BLAS or OpenMP library that kept its default (a thread per core) would make every
env's matrix call fight the other workers.  threadpoolctl finds the loaded libraries by walking every shared
object of the process and asking the known ones for their thread counts.  In a freshly forked worker that
walk cost 12-16 ms (its first ctypes calls, and the copy-on-write faults each takes on the trainer's heap),
once per worker at every pool start, while the trainer waited.  A forked worker has exactly the libraries
the trainer had at the fork, so the trainer walks them (~2 ms) just before forking, and each worker only sets
the ones found to one thread (~1 ms).  The trainer's own thread counts are read, never changed.

A worker started by ``spawn`` or ``forkserver`` has its own libraries: it walks them itself.  Libraries an
env loads later (its ``make``) read ``OMP_NUM_THREADS`` and friends, which each worker sets to "1" in its own
environment first thing (``one_thread_each``).  The trainer's environment is never changed, not even for the
moment a worker starts: another thread starting a process then inherited the "1" (issue 69).  So a spawned
worker's libraries loaded before its first line (its start-up imports the trainer's ``__main__``) start with
their default thread counts, and are limited here like any other.
"""
from __future__ import annotations

import os
import sys

from threadpoolctl import ThreadpoolController, threadpool_limits

# What libraries an env loads later read for their thread count (OpenCV's own variable included).
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                   "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS",
                   "OPENCV_FOR_THREADS_NUM")


def found_for_fork(start_method: str) -> ThreadpoolController | None:
    """The BLAS and OpenMP libraries this process has loaded, for workers about to be forked from it;
    None for any other start method (the worker finds its own) or where threadpoolctl cannot look."""
    if start_method != "fork":
        return None
    try:
        return ThreadpoolController()
    except Exception:   # pragma: no cover - a library that cannot be queried: the worker looks itself
        return None


def limit_to_one_thread(found: ThreadpoolController | None) -> None:
    """In a worker: every BLAS and OpenMP library ``found`` in the trainer (or, without it, found here)
    runs one thread."""
    try:
        if found is None:
            threadpool_limits(1)
        else:
            found.limit(limits=1)
    except Exception:  # pragma: no cover - a BLAS that refuses is not worth a worker's death
        pass


def one_thread_each(found: ThreadpoolController | None) -> None:
    """In a worker: its own environment says one thread to every library loaded from now on, the libraries
    ``found`` in the trainer (or, without it, found here) run one thread, and so does OpenCV's thread pool
    (Atari resizes): a forked worker inherits the trainer's, sized for every core, and two workers' pools
    then fight over them."""
    for var in THREAD_ENV_VARS:
        os.environ[var] = "1"
    limit_to_one_thread(found)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        cv2.setNumThreads(1)
