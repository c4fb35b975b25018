# cython: language_level=3, boundscheck=False, wraparound=False
"""What spinning costs on this CPU: one spin-wait hint, and two cores handing one word back and forth.

``relax_ns`` turns libgomp's ``GOMP_SPINCOUNT`` into a time (docs/performance.md: why the pool
quiets that spin beside its workers); ``spin_pingpong`` is the floor of any round trip (``bench
core`` sets a pool's against it).
"""
from libc.stdint cimport uint32_t, int64_t


cdef extern from "_wire.h" nogil:
    uint32_t shm_load_acquire(const uint32_t *p)
    void shm_store_release(uint32_t *p, uint32_t v)
    void shm_cpu_relax()
    int64_t shm_now_ns()


def relax_ns(Py_ssize_t rounds=20000, int trials=5):
    """Nanoseconds of one spin-wait hint on this CPU (x86 ``pause``, arm ``yield``): the step of
    libgomp's spin loop, which turns its ``GOMP_SPINCOUNT`` into a time.  The least of ``trials``
    timings of ``rounds`` hints (a preempted trial only runs long)."""
    cdef Py_ssize_t i
    cdef int k
    cdef int64_t t0, best = -1
    with nogil:
        for k in range(trials):
            t0 = shm_now_ns()
            for i in range(rounds):
                shm_cpu_relax()
            t0 = shm_now_ns() - t0
            if best < 0 or t0 < best:
                best = t0
    return best / <double>rounds


def spin_pingpong(buf, Py_ssize_t offset, int role, Py_ssize_t rounds):
    """C-speed ping-pong on one shared word: the floor for any round trip.

    Role 0 serves odd values, role 1 even ones; run one of each in two
    processes.  Returns elapsed nanoseconds for ``rounds`` round trips."""
    cdef unsigned char[::1] raw = buf   # a writable buffer (an mmap shared by the two processes)
    if offset < 0 or offset + 4 > raw.shape[0] or offset % 4:
        raise ValueError("word offset out of range or unaligned")
    cdef uint32_t *w = <uint32_t *>&raw[offset]
    cdef Py_ssize_t i
    cdef int64_t t0
    cdef uint32_t v
    with nogil:
        t0 = shm_now_ns()
        for i in range(rounds):
            v = 2 * <uint32_t>i + <uint32_t>role
            while shm_load_acquire(w) != v:
                shm_cpu_relax()
            shm_store_release(w, v + 1)
        t0 = shm_now_ns() - t0
    return t0
