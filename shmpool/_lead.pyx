# cython: language_level=3, boundscheck=False, wraparound=False
"""Async evenness: no env gets more than ``max_lead`` steps ahead of the least-advanced env out.

Envs are bound to workers, and two workers do not run at the same speed (the parent
shares one's core; the other pays an idle core's wake-up), so "first to finish comes
back" alone lets one shard lap the other.  EnvPool is even because its threads take any
env from one queue.  Here ``recv`` returns finished envs oldest completion first, except
that a finished env already ``max_lead`` steps ahead of the least-advanced env still out
is held back until that one catches up.  The least-advanced env is never held, so
``recv`` always fills its batch, and the envs out advance by the same number of steps to
within ``max_lead``.

"Out" means sent (or async-reset) and not yet received.  Envs the user keeps are not
out and hold nothing back; when one is sent again its count is raised to the least
count out, so a pause earns it no catch-up burst.  On the hot path (every ``send`` and
``recv``), hence C loops instead of numpy calls of a few microseconds each.
"""
from libc.stdint cimport int64_t, uint8_t, uint32_t

import numpy as np

cdef int64_t _NONE_OUT = 0x7FFFFFFFFFFFFFFF


cdef class LeadLimit:
    """Steps received per env, and the finished envs held back (completion order).

    ``out`` below is a pool's ``in_flight`` bytes (one per env, 1 = sent and not
    received).  Held envs stay 1 there (the user cannot send them), so a pool must
    not count them as owed by a worker (``is_held``).  ``max_lead``: a positive int, or
    None to never hold, as ``shmpool.arguments.check_max_lead`` resolved it."""
    cdef int64_t[::1] steps
    cdef uint8_t[::1] held_mask
    cdef uint32_t[::1] held          # ring-free list: held[:n_held], completion order
    cdef public Py_ssize_t n_held
    cdef public int64_t floor        # least ``steps`` of the envs out, as of the last refresh
    cdef readonly object max_lead
    cdef int64_t lead
    cdef Py_ssize_t num_envs

    def __init__(self, Py_ssize_t num_envs, max_lead=None):
        self.max_lead = max_lead
        self.lead = _NONE_OUT if max_lead is None else max_lead
        self.num_envs = num_envs
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.held_mask = np.zeros(num_envs, dtype=np.uint8)
        self.held = np.zeros(num_envs, dtype=np.uint32)
        self.n_held = 0
        self.floor = 0

    @property
    def counts(self):
        """Steps received per env (int64, a copy)."""
        return np.asarray(self.steps).copy()

    def held_envs(self) -> list:
        return [self.held[i] for i in range(self.n_held)]

    def sent(self, const int64_t[::1] ids):
        """``ids`` were sent: an env back from a pause starts level with the envs out."""
        cdef Py_ssize_t i
        cdef int64_t e
        for i in range(ids.shape[0]):
            e = ids[i]
            if self.steps[e] < self.floor:
                self.steps[e] = self.floor

    def received(self, const uint32_t[::1] ids):
        """``ids`` were received without a look at their lead (every env out came back)."""
        cdef Py_ssize_t i
        for i in range(ids.shape[0]):
            self.steps[ids[i]] += 1

    def is_held(self, Py_ssize_t env) -> bool:
        return self.held_mask[env] != 0

    cdef void _refresh(self, const uint8_t[::1] out) noexcept:
        cdef int64_t least = _NONE_OUT
        cdef Py_ssize_t e
        for e in range(self.num_envs):
            if out[e] and self.steps[e] < least:
                least = self.steps[e]
        if least != _NONE_OUT:
            self.floor = least

    cdef inline bint _ahead(self, uint32_t e) noexcept:
        return self.steps[e] - self.floor >= self.lead

    def admit(self, const uint32_t[::1] taken, uint8_t[::1] out, uint32_t[::1] dest, Py_ssize_t start):
        """Sort ``taken`` (env ids just taken from the workers, completion order): those
        less than ``max_lead`` ahead go to ``dest[start:]`` (received), the others are
        held.  Returns how many went to ``dest``."""
        cdef Py_ssize_t i, got = 0, n = taken.shape[0]
        cdef uint32_t e
        cdef bint stale = False
        if n == 0:
            return 0
        for i in range(n):
            if taken[i] >= self.num_envs or self.held_mask[taken[i]]:
                raise ValueError(f"env {taken[i]} taken twice or out of range")
            out[taken[i]] = 1   # out until sorted
        self._refresh(out)
        for i in range(n):
            e = taken[i]
            if stale and self._ahead(e):
                self._refresh(out)   # an env received just before sat at the floor: it may have risen
                stale = False
            if self._ahead(e):
                self.held[self.n_held] = e
                self.n_held += 1
                self.held_mask[e] = 1
            else:
                stale = stale or self.steps[e] == self.floor
                out[e] = 0
                self.steps[e] += 1
                dest[start + got] = e
                got += 1
        return got

    def release(self, uint8_t[::1] out, uint32_t[::1] dest, Py_ssize_t start, Py_ssize_t n):
        """Move up to ``n`` held envs that are no longer too far ahead into ``dest[start:]``,
        oldest completion first.  Returns how many."""
        cdef Py_ssize_t i, j, got = 0
        cdef uint32_t e
        cdef bint stale = True   # the floor may have risen since the last refresh
        while self.n_held and got < n:
            if stale:
                self._refresh(out)
            for i in range(self.n_held):
                if not self._ahead(self.held[i]):
                    break
            else:
                break
            e = self.held[i]
            for j in range(i, self.n_held - 1):
                self.held[j] = self.held[j + 1]
            self.n_held -= 1
            self.held_mask[e] = 0
            stale = self.steps[e] == self.floor   # only the envs at the floor hold it down
            out[e] = 0
            self.steps[e] += 1
            dest[start + got] = e
            got += 1
        return got

    def drop_held(self) -> list:
        """Forget every held env (a drain takes them all); returns them."""
        cdef list held = self.held_envs()
        cdef Py_ssize_t i
        for i in range(self.n_held):
            self.held_mask[self.held[i]] = 0
        self.n_held = 0
        return held
