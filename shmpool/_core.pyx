# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The wire between the parent and its workers.

Everything that crosses a process boundary on the hot path goes through the
control region laid out here: per-worker command/done counters, per-worker
request rings (async dispatch) and per-worker completion rings of env ids
(single producer, single consumer: a worker that dies mid-publish leaves no
hole, and everything it published up to its head is a valid result).  Counters
only grow, so a waiter compares against a target instead of resetting flags.

Waiting is spin -> sched_yield -> sleep (futex, or a posix semaphore where
futex is missing), always bounded by a timeout slice so callers can check
liveness between slices.  A waker only issues a syscall when the sleeper has
raised the word's waiters flag.  An adaptive policy (workers under "auto")
learns how long commands take to come (the parent stamps each post with the
time) and skips spinning when they come later than its budget: a worker then
sleeps at once instead of burning a core the trainer needs.

Each idea of the wire is one C header beside this file, its functions
``static inline``:

- ``_wire.h``: atomics with every memory ordering spelled out, the futex, the clock;
- ``_control.h``: the control region's map (header lines, per-worker blocks),
  the commands and the counters in it;
- ``_waiting.h``: spin, yield, then futex (or the semaphore handshake); the
  waker's half; the adaptive policy's learnt gap;
- ``_rings.h``: claims, request rings, completion rings and their tickets;
- ``_scan.h``: the status scan of a batch, and its info masks' summary;
- ``_worker_reset.h``: a dead worker's block made ready for its replacement.

This file is the Python-facing layer: argument checks and the errors they
raise, the buffer export, the posix semaphores (Python objects, the bed where
there is no futex) and ``WaitPolicy``.

Why headers rather than .pxi files or one cdef class per idea: Cython cannot
``include`` a .pxi into a cdef class body, and module-level functions in .pxi
files would spread one class's state over files that each edit it; per-idea
cdef classes held by the Wire would put an object hop and a vtable call on
every step.  A header's ``static inline`` functions compile into this one
extension, ``shmpool._core``, and the C compiler inlines them into the methods
that call them, as Cython's own cdef functions were before: the hot path does
the same loads, stores and syscalls, and each idea reads as one file of C with
its orderings in sight (EnvPool's ``envpool/core`` is split the same way, one
idea per header).
"""
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int32_t, int64_t
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from cpython.mem cimport PyMem_Malloc, PyMem_Free

cdef extern from "_wire.h" nogil:
    uint32_t shm_load_acquire(const uint32_t *p)
    void shm_store_release(uint32_t *p, uint32_t v)
    void shm_store_seqcst(uint32_t *p, uint32_t v)
    uint32_t shm_add_fetch(uint32_t *p, uint32_t v)
    int shm_cas(uint32_t *p, uint32_t expected, uint32_t desired)
    int shm_reached(uint32_t value, uint32_t target)
    int64_t shm_now_ns()
    int shm_have_futex()
    int shm_set_pdeathsig(int sig)

cdef extern from "_control.h" nogil:
    enum:
        SHM_LINE
        SHM_MAX_WORKERS
        SHM_SIG_SYNC
        SHM_SIG_PUB
        SHM_CMD_STEP
        SHM_CMD_ASYNC
        SHM_CMD_MESSAGE
        SHM_CMD_EXIT
    int shm_command_signal(int worker)
    int shm_done_signal(int worker)
    int shm_signal_count(int num_workers)
    int64_t shm_rings_offset(int num_workers)
    uint32_t *shm_signal(uint8_t *base, int sid)
    void shm_init_header(uint8_t *base, uint32_t num_workers, uint32_t num_envs, uint32_t sync_start)
    int shm_header_matches(const uint8_t *base, uint32_t num_workers, uint32_t num_envs)
    uint32_t shm_post(uint8_t *base, int worker, uint32_t cmd)
    uint32_t shm_command(uint8_t *base, int worker, uint32_t *cmd)
    int64_t shm_post_stamp(uint8_t *base, int worker)

cdef extern from "_waiting.h" nogil:
    enum:
        SHM_WAIT_REACHED
        SHM_WAIT_SEMAPHORE
    int shm_wait_word(uint32_t *word, uint32_t target, int64_t spin_ns, int64_t yield_ns,
                      int64_t timeout_ns, int futex)
    int shm_wake(uint32_t *word, int futex)
    int shm_sem_prepare(uint32_t *word, uint32_t target)
    int shm_sem_finish(uint32_t *word, uint32_t target)
    int64_t shm_learn_gap(int64_t gap_ns, int64_t observed_ns, int64_t budget_ns)
    int64_t shm_gap_after_silence(int64_t budget_ns)

cdef extern from "_rings.h" nogil:
    uint32_t SHM_REQ_RESET
    uint32_t SHM_REQ_ENV_MASK
    ctypedef struct shm_rings:
        uint8_t *base
    int64_t shm_worker_rings_bytes(int64_t slots)
    void shm_rings_map(shm_rings *r, uint8_t *base, const uint32_t *shard_sizes, int num_workers)
    int shm_claim(const int64_t *ids, Py_ssize_t n, uint8_t *in_flight, Py_ssize_t num_envs)
    void shm_push_requests(shm_rings *r, const int64_t *ids, Py_ssize_t n, const int32_t *owner,
                           uint32_t flag, uint64_t *counts)
    int64_t shm_pop_request(shm_rings *r, int worker)
    void shm_publish(shm_rings *r, uint32_t env_id)
    Py_ssize_t shm_take_ready(shm_rings *r, uint32_t *out, Py_ssize_t start, Py_ssize_t n)
    uint32_t shm_doorbell_target(const shm_rings *r, uint32_t seen, uint64_t more)
    uint32_t shm_ring_slots(const shm_rings *r, int worker)

cdef extern from "_scan.h" nogil:
    enum:
        SHM_SCAN_SIDE_MESSAGE
        SHM_SCAN_NUMERIC_INFO
    int shm_scan_all(const uint8_t *status, const uint64_t *info_masks, Py_ssize_t num_envs)
    int shm_scan_ids(const uint8_t *status, const uint64_t *info_masks, Py_ssize_t num_envs,
                     const int32_t *ids, Py_ssize_t n, Py_ssize_t *bad)
    Py_ssize_t shm_mask_summary(const uint64_t *masks, Py_ssize_t n, uint64_t *any, uint64_t *every)

cdef extern from "_worker_reset.h" nogil:
    Py_ssize_t shm_reset_worker(shm_rings *r, int worker, uint32_t *out)

# Control-region geometry: ``layout.py`` aligns every array of the region to a LINE.
LINE = SHM_LINE

# Commands a worker executes (what each does: _control.h).
CMD_STEP = SHM_CMD_STEP
CMD_ASYNC = SHM_CMD_ASYNC
CMD_MESSAGE = SHM_CMD_MESSAGE
CMD_EXIT = SHM_CMD_EXIT

# Request flag: reset this env instead of stepping it.
REQ_RESET = SHM_REQ_RESET
REQ_ENV_MASK = SHM_REQ_ENV_MASK  # a request word without its flag: the env id

# Bits of Wire.scan's answer.
SCAN_SIDE_MESSAGE = SHM_SCAN_SIDE_MESSAGE  # some env of the batch has a side-channel message (error or extra infos)
SCAN_NUMERIC_INFO = SHM_SCAN_NUMERIC_INFO  # some env of the batch has numeric infos in shared memory


def control_size(int num_envs, shard_sizes):
    """Bytes the control region needs for these shards: header, one block per
    worker, then per worker a request ring and a completion ring (one slot per env:
    an env is requested, and published, at most once before the parent takes it),
    and beside each completion ring the tickets that order completions across workers."""
    cdef int64_t n = shm_rings_offset(len(shard_sizes))
    for s in shard_sizes:
        n += shm_worker_rings_bytes(s)
    return n


def have_futex():
    """True when this build sleeps on Linux futexes."""
    return bool(shm_have_futex())


def set_parent_death_signal(int sig):
    """Ask the kernel to send ``sig`` to this process when its parent thread dies."""
    if shm_set_pdeathsig(sig) != 0:
        raise OSError("prctl(PR_SET_PDEATHSIG) is not available")


cdef inline bint _claim(const int64_t[::1] ids, uint8_t[::1] in_flight) noexcept:
    return shm_claim(&ids[0], ids.shape[0], &in_flight[0], in_flight.shape[0])


def claim_ids(const int64_t[::1] ids, uint8_t[::1] in_flight):
    """Mark ``ids`` in flight (``in_flight``: one byte per env, 1 = in flight); False, with
    nothing marked, if one is outside ``[0, len(in_flight))``, repeated, or already in flight.
    One C pass over the ids: the numpy checks that word the error cost ~10 µs hot, several
    times that beside busy workers, on every async ``send``.  The caller words the error."""
    return _claim(ids, in_flight)


cdef class WaitPolicy:
    """How long a waiter spins and yields before it sleeps (nanoseconds).

    ``adaptive``: for command waits (workers), spin and yield only while the
    commands of late came within ``spin_ns + yield_ns`` of the wait's start;
    otherwise sleep at once.  ``gap_ns`` is that learnt gap (a moving average,
    per process: each worker has its own copy of the policy)."""
    cdef public int64_t spin_ns
    cdef public int64_t yield_ns
    cdef public str name
    cdef public bint adaptive
    cdef public int64_t gap_ns

    def __init__(self, str name, int64_t spin_ns, int64_t yield_ns, bint adaptive=False):
        self.name = name
        self.spin_ns = spin_ns
        self.yield_ns = yield_ns
        self.adaptive = adaptive
        self.gap_ns = 0

    def __repr__(self):
        extra = ", adaptive=True" if self.adaptive else ""
        return f"WaitPolicy({self.name!r}, spin_ns={self.spin_ns}, yield_ns={self.yield_ns}{extra})"

    def __reduce__(self):
        return (WaitPolicy, (self.name, self.spin_ns, self.yield_ns, self.adaptive))


cdef class Wire:
    """Typed access to a control region mapped in this process.

    ``shard_sizes[w]`` is the number of envs worker ``w`` owns.  ``sems``,
    when given, is a list of posix_ipc semaphores (one per signal word, see
    ``signal_count``) used to sleep instead of futexes."""
    cdef Py_buffer view
    cdef bint has_view
    cdef uint8_t *base
    cdef readonly int num_workers
    cdef readonly int num_envs
    cdef shm_rings rings
    cdef uint8_t *status
    cdef uint64_t *info_masks
    cdef list sems
    cdef bint futex
    cdef public int64_t slice_ns

    def __cinit__(self):
        self.has_view = False

    def __init__(self, buffer, shard_sizes, *, int num_envs, list sems=None, int64_t slice_ns=50_000_000):
        cdef uint32_t sizes[SHM_MAX_WORKERS]
        cdef uint32_t total = 0
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE | PyBUF_SIMPLE)
        self.has_view = True
        if len(shard_sizes) > SHM_MAX_WORKERS:
            raise ValueError(f"at most {SHM_MAX_WORKERS} workers per pool")
        if self.view.len < control_size(num_envs, shard_sizes):
            raise ValueError("buffer too small for the control region")
        self.base = <uint8_t *>self.view.buf
        self.num_workers = len(shard_sizes)
        self.num_envs = num_envs
        for w, s in enumerate(shard_sizes):
            if s < 1:
                raise ValueError("every shard needs an env")
            sizes[w] = s
            total += s
        if total != num_envs:
            raise ValueError(f"shard sizes add up to {total}, not num_envs={num_envs}")
        shm_rings_map(&self.rings, self.base, sizes, self.num_workers)
        self.status = NULL
        self.info_masks = NULL
        self.sems = sems
        self.futex = bool(shm_have_futex()) and sems is None
        self.slice_ns = slice_ns

    def bind_results(self, Py_ssize_t status_offset, Py_ssize_t info_mask_offset):
        """Where the per-env status bytes and info masks live, for ``scan``."""
        if (status_offset < 0 or status_offset + self.num_envs > self.view.len
                or info_mask_offset < 0 or info_mask_offset % 8
                or info_mask_offset + 8 * self.num_envs > self.view.len):
            raise ValueError("result arrays lie outside the region")
        self.status = self.base + status_offset
        self.info_masks = <uint64_t *>(self.base + info_mask_offset)

    def scan(self, const int32_t[::1] ids=None):
        """Whether a batch needs more than its arrays: bit 1 if any env has a
        side-channel message (error or extra info), bit 2 if any has numeric infos.

        ``ids`` None scans every env.  One C loop instead of two numpy reductions."""
        cdef int flags
        cdef Py_ssize_t bad = 0
        if self.status == NULL:
            raise RuntimeError("bind_results() first")
        if ids is None:
            return shm_scan_all(self.status, self.info_masks, self.num_envs)
        flags = shm_scan_ids(self.status, self.info_masks, self.num_envs, &ids[0], ids.shape[0], &bad)
        if flags < 0:
            raise IndexError(f"env id {ids[bad]} out of range")
        return flags

    def release(self):
        """Drop the buffer export so the mmap can be closed."""
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False
            self.base = NULL
            self.rings.base = NULL

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)

    @staticmethod
    def signal_count(int num_workers):
        """Signal words of a pool of ``num_workers`` (one semaphore each where there is no futex)."""
        return shm_signal_count(num_workers)

    def init_header(self, uint32_t sync_start=0):
        """Written once by the parent before any worker maps the region.
        ``sync_start``: where the sync counter starts (tests start it near 2**32 to
        drive a real pool across the wrap)."""
        shm_init_header(self.base, self.num_workers, self.num_envs, sync_start)

    def check_header(self):
        if not shm_header_matches(self.base, self.num_workers, self.num_envs):
            raise RuntimeError("shared region does not hold this pool's control block")

    # --- waking and waiting (_waiting.h) ------------------------------------

    cdef inline void _wake(self, int sid, uint32_t *word):
        if shm_wake(word, self.futex):
            self.sems[sid].release()

    cdef bint _wait(self, int sid, uint32_t target, WaitPolicy policy, int64_t timeout_ns,
                    bint busy=True) except -1:
        """``busy`` False: skip the spin and yield phases, sleep at once."""
        cdef uint32_t *word = shm_signal(self.base, sid)
        cdef int r
        cdef int64_t spin = policy.spin_ns if busy else 0, yld = policy.yield_ns if busy else 0
        cdef bint futex = self.futex
        with nogil:
            r = shm_wait_word(word, target, spin, yld, timeout_ns, futex)
        if r != SHM_WAIT_SEMAPHORE:
            return r == SHM_WAIT_REACHED
        # Semaphore fallback: same flag handshake, the semaphore is the bed.
        if shm_sem_prepare(word, target):
            return True
        try:
            self.sems[sid].acquire(max(timeout_ns - spin - yld, 1_000_000) / 1e9)
        except Exception:  # posix_ipc.BusyError: the slice ran out
            pass
        return shm_sem_finish(word, target)

    # --- parent side --------------------------------------------------------

    cdef uint32_t _post(self, int worker, uint32_t cmd) except? 0:
        cdef uint32_t n = shm_post(self.base, worker, cmd)
        cdef int sid = shm_command_signal(worker)
        self._wake(sid, shm_signal(self.base, sid))
        return n

    def post(self, int worker, uint32_t cmd):
        """Give ``worker`` a command; returns the command's sequence number."""
        if worker < 0 or worker >= self.num_workers:
            raise IndexError(f"no worker {worker}")
        return self._post(worker, cmd)

    def post_all(self, uint32_t cmd):
        """Give every worker the same command."""
        cdef int w
        for w in range(self.num_workers):
            self._post(w, cmd)

    def wait_sync(self, uint32_t target, WaitPolicy policy, int64_t timeout_ns):
        """Wait (one slice at most) until ``target`` shards have finished."""
        return self._wait(SHM_SIG_SYNC, target, policy, timeout_ns)

    def done_seq(self, int worker):
        return shm_load_acquire(shm_signal(self.base, shm_done_signal(worker)))

    def cmd_seq(self, int worker):
        return shm_load_acquire(shm_signal(self.base, shm_command_signal(worker)))

    def claim(self, const int64_t[::1] ids, uint8_t[::1] in_flight):
        """Mark ``ids`` in flight; False (nothing marked) if one is out of
        range, repeated, or already in flight.  The caller words the error."""
        if in_flight.shape[0] != self.num_envs:
            raise ValueError("in_flight must have one byte per env")
        return _claim(ids, in_flight)

    def dispatch(self, const int64_t[::1] ids, const int32_t[::1] owner, bint reset):
        """Append claimed env ids to their workers' request rings and post
        each worker that got one (``reset``: reset instead of step)."""
        cdef uint64_t counts[SHM_MAX_WORKERS]
        cdef int w
        shm_push_requests(&self.rings, &ids[0], ids.shape[0], &owner[0], SHM_REQ_RESET if reset else 0, counts)
        for w in range(self.num_workers):
            if counts[w]:
                self._post(w, SHM_CMD_ASYNC)

    def take_ready(self, uint32_t[::1] out, Py_ssize_t start, Py_ssize_t n):
        """``take`` without waiting: what is published now, at most ``n``."""
        if out.shape[0] < start + n:
            raise ValueError("out is too short")
        return shm_take_ready(&self.rings, &out[0], start, n)

    def take(self, uint32_t[::1] out, Py_ssize_t start, Py_ssize_t n,
             WaitPolicy policy, int64_t timeout_ns):
        """Move up to ``n`` finished env ids into ``out[start:]``, in the order
        they finished (across workers, by completion ticket).

        Waits at most one slice; returns how many were taken."""
        cdef uint32_t *pub = shm_signal(self.base, SHM_SIG_PUB)
        cdef Py_ssize_t got = 0
        cdef uint32_t seen
        if out.shape[0] < start + n:
            raise ValueError("out is too short")
        while True:
            got += shm_take_ready(&self.rings, &out[0], start + got, n - got)
            if got >= n:
                break
            # A worker stores its head before it rings the doorbell, so once
            # ``seen`` is read every publication it counts is in the rings.
            seen = shm_load_acquire(pub)
            got += shm_take_ready(&self.rings, &out[0], start + got, n - got)
            if got >= n:
                break
            # Sleep until the rest of the request was published (or, when the
            # doorbell runs ahead after a restart, until any publication).
            if not self._wait(SHM_SIG_PUB, shm_doorbell_target(&self.rings, seen, n - got), policy, timeout_ns):
                break
        return got

    def wait_done(self, int worker, uint32_t target, WaitPolicy policy, int64_t timeout_ns):
        """Wait (one slice at most) until ``worker`` has handled command ``target``."""
        if worker < 0 or worker >= self.num_workers:
            raise IndexError(f"no worker {worker}")
        return self._wait(shm_done_signal(worker), target, policy, timeout_ns)

    def sync_count(self):
        """Shards of sync steps/resets finished so far (the counter ``wait_sync`` waits on)."""
        return shm_load_acquire(shm_signal(self.base, SHM_SIG_SYNC))

    def reset_worker(self, int worker):
        """Clear a *dead* worker's control block for its replacement.

        Returns the env ids it published that the parent had not taken yet
        (valid results, in the order it finished them).  Its request ring is
        emptied; the parent knows which envs it still owed."""
        cdef uint32_t *published
        cdef Py_ssize_t n, i
        if worker < 0 or worker >= self.num_workers:
            raise IndexError(f"no worker {worker}")
        published = <uint32_t *>PyMem_Malloc(shm_ring_slots(&self.rings, worker) * sizeof(uint32_t))
        if published == NULL:
            raise MemoryError()
        try:
            n = shm_reset_worker(&self.rings, worker, published)
            if n < 0:
                raise RuntimeError(f"worker {worker}'s completion ring is corrupt")
            return [published[i] for i in range(n)]
        finally:
            PyMem_Free(published)

    # --- worker side --------------------------------------------------------

    def wait_command(self, int worker, uint32_t seen, WaitPolicy policy, int64_t timeout_ns):
        """Wait (one slice at most) for a command newer than ``seen``.

        An adaptive ``policy`` spins only while commands have come within its
        budget of late, and learns from this one's post stamp how long it took."""
        cdef int sid = shm_command_signal(worker)
        cdef int64_t budget, start
        if not policy.adaptive:
            return self._wait(sid, seen + 1, policy, timeout_ns)
        budget = policy.spin_ns + policy.yield_ns
        if shm_reached(shm_load_acquire(shm_signal(self.base, sid)), seen + 1):
            policy.gap_ns = shm_learn_gap(policy.gap_ns, 0, budget)
            return True
        start = shm_now_ns()
        if not self._wait(sid, seen + 1, policy, timeout_ns, policy.gap_ns <= budget):
            # A whole slice without a command: the trainer is busy elsewhere.
            policy.gap_ns = shm_gap_after_silence(budget)
            return False
        # The acquire that saw the new sequence makes its stamp visible.
        policy.gap_ns = shm_learn_gap(policy.gap_ns, shm_post_stamp(self.base, worker) - start, budget)
        return True

    def command(self, int worker):
        """(sequence, command) of the newest command posted to ``worker``."""
        cdef uint32_t cmd
        cdef uint32_t seq = shm_command(self.base, worker, &cmd)
        return seq, cmd

    def finish(self, int worker, uint32_t seq):
        """Mark commands up to ``seq`` as handled."""
        cdef int sid = shm_done_signal(worker)
        cdef uint32_t *done = shm_signal(self.base, sid)
        shm_store_seqcst(done, seq)
        self._wake(sid, done)

    def finish_shard(self):
        """One shard of a sync step or reset is complete."""
        cdef uint32_t *word = shm_signal(self.base, SHM_SIG_SYNC)
        shm_add_fetch(word, 1)
        self._wake(SHM_SIG_SYNC, word)

    def pop_request(self, int worker):
        """Next env id requested from ``worker`` (with flags), or -1."""
        return shm_pop_request(&self.rings, worker)

    def publish(self, uint32_t env_id):
        """Append a finished env to its worker's completion ring (results already written)."""
        if env_id >= <uint32_t>self.num_envs:
            raise IndexError(f"env id {env_id} out of range")
        shm_publish(&self.rings, env_id)
        self._wake(SHM_SIG_PUB, shm_signal(self.base, SHM_SIG_PUB))


# --- generic words in any writable buffer (info registry, benchmarks) --------

cdef uint32_t *_word(object buf, Py_ssize_t offset) except NULL:
    cdef Py_buffer v
    PyObject_GetBuffer(buf, &v, PyBUF_WRITABLE | PyBUF_SIMPLE)
    cdef uint8_t *p = <uint8_t *>v.buf
    cdef Py_ssize_t n = v.len
    PyBuffer_Release(&v)  # the caller keeps the buffer alive
    if offset < 0 or offset + 4 > n or offset % 4:
        raise ValueError("word offset out of range or unaligned")
    return <uint32_t *>(p + offset)


def load_word(buf, Py_ssize_t offset):
    """Acquire-load the uint32 at ``offset`` of a writable buffer."""
    return shm_load_acquire(_word(buf, offset))


def store_word(buf, Py_ssize_t offset, uint32_t value):
    """Release-store a uint32 at ``offset`` of a writable buffer."""
    shm_store_release(_word(buf, offset), value)


def cas_word(buf, Py_ssize_t offset, uint32_t expected, uint32_t desired):
    """Compare-and-swap a uint32; True if it was ``expected`` and is now ``desired``."""
    return bool(shm_cas(_word(buf, offset), expected, desired))


def mask_summary(const uint64_t[::1] masks, Py_ssize_t limit):
    """``(union, intersection, reporting)`` of a batch's info masks: their OR and AND, and ``(position,
    mask)`` of each nonzero one in order (None past ``limit`` of them); one C loop, not three numpy calls."""
    cdef Py_ssize_t i, n = masks.shape[0], count
    cdef uint64_t union, common
    count = shm_mask_summary(&masks[0], n, &union, &common)
    if count > limit:
        return union, common, None
    reporting = []
    if count:
        for i in range(n):
            if masks[i]:
                reporting.append((i, masks[i]))
    return union, common, reporting
