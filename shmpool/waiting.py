"""The parent's one wait loop: every wait of the pool's process on its workers runs here, in slices.

A slice is the longest the parent waits without looking up (``SLICE_NS``, 50 ms).  The caller says what
one slice waits for (``ready(slice_ns)``, which returns within ``slice_ns``) and what is looked at between
two slices (``between()``: for the supervisor a ``close()`` requested meanwhile, dead workers and the step
timeout; for a worker starting, whether it exited).  So no room needs a loop of its own, and whatever a
look between slices leads to (a worker replaced, the pool closed) happens here, between two slices, never
from inside the call that was reading a pipe: the worker set only polls and reads, the restart room only
replaces (issue 70: a replacement made from inside ``WorkerSet.reply`` stacked ``WorkerSet → Supervisor →
Restarts → WorkerSet``).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

SLICE_NS = 50_000_000        # longest uninterrupted wait: liveness is checked between slices
SLICE_S = SLICE_NS / 1e9


def in_slices(ready: Callable[[int], bool], between: Callable[[], object], deadline: float | None = None,
              clock: Callable[[], float] = time.monotonic) -> bool:
    """Ask ``ready(slice_ns)`` until it returns True, then return True; ``between()`` runs after each
    unmet slice (it may raise, which ends the wait).  With a ``deadline`` (a ``clock()`` time) the slices
    shrink to end there, and once it has passed after an unmet slice (and its ``between``) this returns
    False.  ``ready`` is always asked at least once, so what has already come is taken even late."""
    while True:
        slice_ns = SLICE_NS
        if deadline is not None:   # rounded up: a slice that ends a nanosecond short would leave one of 0 ns
            slice_ns = max(0, min(slice_ns, math.ceil((deadline - clock()) * 1e9)))
        if ready(slice_ns):
            return True
        between()
        if deadline is not None and (slice_ns == 0 or clock() >= deadline):
            return False
