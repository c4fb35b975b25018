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
"""
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int32_t, int64_t
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE

cdef extern from "_wire.h" nogil:
    uint32_t shm_load_acquire(const uint32_t *p)
    uint32_t shm_load_relaxed(const uint32_t *p)
    void shm_store_release(uint32_t *p, uint32_t v)
    void shm_store_relaxed(uint32_t *p, uint32_t v)
    void shm_store_seqcst(uint32_t *p, uint32_t v)
    uint32_t shm_load_seqcst(const uint32_t *p)
    uint32_t shm_add_fetch(uint32_t *p, uint32_t v)
    uint64_t shm_load_acquire64(const uint64_t *p)
    uint64_t shm_load_relaxed64(const uint64_t *p)
    void shm_store_release64(uint64_t *p, uint64_t v)
    uint64_t shm_fetch_add64(uint64_t *p, uint64_t v)
    int shm_cas(uint32_t *p, uint32_t expected, uint32_t desired)
    void shm_fence()
    void shm_cpu_relax()
    int shm_reached(uint32_t value, uint32_t target)
    int64_t shm_now_ns()
    int shm_have_futex()
    int shm_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns)
    void shm_futex_wake(uint32_t *word)
    int shm_set_pdeathsig(int sig)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

# Control-region geometry.  LINE is two cache lines so that adjacent-line
# prefetching cannot make two writers share a line.
LINE = 128
DEF _LINE = 128
DEF _HEADER_LINES = 4
DEF _MAGIC = 0x73686d70  # "shmp"

# Header lines.
DEF _OFF_META = 0
DEF _OFF_SYNC = 1 * _LINE      # signal: shards finished (sync step / reset)
DEF _OFF_ORDER = 2 * _LINE     # completion tickets: recv takes envs in the order they finished
DEF _OFF_PUB = 3 * _LINE       # signal: completions published, all workers (a doorbell for sleeping)

# Per-worker block: line A written by the parent, line B by the worker.
DEF _A_CMD_SEQ = 0             # signal (value, waiters, target)
DEF _A_CMD = 12
DEF _A_REQ_HEAD = 16           # uint64: requests pushed
DEF _A_POST_NS = 24            # int64: CLOCK_MONOTONIC time of the newest post (adaptive waiters learn from it)
DEF _B_DONE_SEQ = _LINE        # signal (value, waiters, target)
DEF _B_REQ_TAIL = _LINE + 16   # uint64: requests taken
DEF _B_COMP_HEAD = _LINE + 24  # uint64: completions published into this worker's ring
DEF _B_COMP_RUNG = _LINE + 32  # uint32: low bits of the head once its doorbell was rung
DEF _BLOCK = 2 * _LINE

# Commands a worker executes.
CMD_STEP = 1       # step the whole shard (sync), then bump the sync counter
DEF _CMD_ASYNC = 2
CMD_ASYNC = _CMD_ASYNC  # drain the worker's request ring, publishing each env
CMD_MESSAGE = 3    # read one message from the side channel and answer it
CMD_EXIT = 4

# Request flag: reset this env instead of stepping it.
DEF _REQ_RESET = 0x80000000
REQ_RESET = _REQ_RESET
REQ_ENV_MASK = 0x7FFFFFFF  # a request word without its flag: the env id

# Bits of Wire.scan's answer.
SCAN_SIDE_MESSAGE = 1  # some env of the batch has a side-channel message (error or extra infos)
SCAN_NUMERIC_INFO = 2  # some env of the batch has numeric infos in shared memory

def _align(n):
    return (n + _LINE - 1) // _LINE * _LINE


def control_size(int num_envs, shard_sizes):
    """Bytes the control region needs for these shards: header, one block per
    worker, then per worker a request ring and a completion ring (one slot per env:
    an env is requested, and published, at most once before the parent takes it),
    and beside each completion ring the tickets that order completions across workers."""
    cdef Py_ssize_t n = _HEADER_LINES * _LINE + len(shard_sizes) * _BLOCK
    for s in shard_sizes:
        n += 3 * _align(4 * s)
    return n


def have_futex():
    """True when this build sleeps on Linux futexes."""
    return bool(shm_have_futex())


def set_parent_death_signal(int sig):
    """Ask the kernel to send ``sig`` to this process when its parent thread dies."""
    if shm_set_pdeathsig(sig) != 0:
        raise OSError("prctl(PR_SET_PDEATHSIG) is not available")


cdef int _wait_word(uint32_t *word, uint32_t target, int64_t spin_ns,
                    int64_t yield_ns, int64_t timeout_ns, bint futex) nogil:
    """Spin, then yield, then sleep until ``*word`` reaches ``target``.

    A signal is three words: the value, the sleeper's flag and the value the
    sleeper waits for (so wakers only wake it when that is reached).
    Returns 1 when reached, 0 on timeout, 2 when the caller must sleep (no futex: it sleeps
    on a semaphore)."""
    cdef uint32_t *waiters = word + 1
    cdef uint32_t v
    cdef int i
    cdef int64_t start, now, deadline
    if shm_reached(shm_load_acquire(word), target):
        return 1
    start = shm_now_ns()
    deadline = start + timeout_ns
    if spin_ns > timeout_ns:
        spin_ns = timeout_ns
    # Busy phase: cheapest wake-up (~1 us), costs a whole core.
    while True:
        for i in range(64):
            shm_cpu_relax()
            if shm_reached(shm_load_acquire(word), target):
                return 1
        now = shm_now_ns()
        if now - start >= spin_ns:
            break
    # Yield phase: stays responsive while letting an oversubscribed core run
    # the process we are waiting for.
    while now - start < spin_ns + yield_ns and now < deadline:
        sched_yield()
        if shm_reached(shm_load_acquire(word), target):
            return 1
        now = shm_now_ns()
    if not futex:
        return 2 if now < deadline else 0
    # Sleep phase.  Raise the flag, then re-check: a waker stores the value
    # before it reads the flag (both seq_cst), so one of us sees the other.
    shm_store_relaxed(word + 2, target)
    while now < deadline:
        shm_store_seqcst(waiters, 1)
        v = shm_load_seqcst(word)
        if shm_reached(v, target):
            shm_store_relaxed(waiters, 0)
            return 1
        shm_futex_wait(word, v, deadline - now)
        shm_store_relaxed(waiters, 0)
        if shm_reached(shm_load_acquire(word), target):
            return 1
        now = shm_now_ns()
    return 0


cdef bint _claim(const int64_t[::1] ids, uint8_t[::1] in_flight) noexcept:
    cdef Py_ssize_t i, j, n = ids.shape[0], num_envs = in_flight.shape[0]
    cdef int64_t e
    for i in range(n):
        e = ids[i]
        if e < 0 or e >= num_envs or in_flight[e]:
            for j in range(i):
                in_flight[ids[j]] = 0
            return False
        in_flight[e] = 1
    return True


def claim_ids(const int64_t[::1] ids, uint8_t[::1] in_flight):
    """Mark ``ids`` in flight (``in_flight``: one byte per env); False, nothing marked, if one is
    out of range, repeated or in flight (the caller words it: numpy's checks cost ~10 µs hot)."""
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
    cdef uint32_t *req_rings[1024]
    cdef uint32_t req_caps[1024]
    cdef uint32_t *comp_rings[1024]
    cdef uint32_t *order_rings[1024]  # completion ticket of each comp_rings slot
    cdef uint64_t comp_tails[1024]   # parent only: completions taken from each ring
    cdef uint32_t starts[1025]       # first env of each shard, then num_envs
    cdef uint64_t taken              # parent only: completions taken in all (doorbell target)
    cdef int me                      # worker side: the shard publish() last wrote to
    cdef uint8_t *status
    cdef uint64_t *info_masks
    cdef list sems
    cdef bint futex
    cdef public int64_t slice_ns

    def __cinit__(self):
        self.has_view = False

    def __init__(self, buffer, shard_sizes, *, int num_envs, list sems=None, int64_t slice_ns=50_000_000):
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE | PyBUF_SIMPLE)
        self.has_view = True
        if len(shard_sizes) > 1024:
            raise ValueError("at most 1024 workers per pool")
        if self.view.len < control_size(num_envs, shard_sizes):
            raise ValueError("buffer too small for the control region")
        self.base = <uint8_t *>self.view.buf
        self.num_workers = len(shard_sizes)
        self.num_envs = num_envs
        cdef Py_ssize_t off = _HEADER_LINES * _LINE + self.num_workers * _BLOCK
        cdef uint32_t first = 0
        for w, s in enumerate(shard_sizes):
            if s < 1:
                raise ValueError("every shard needs an env")
            self.req_rings[w] = <uint32_t *>(self.base + off)
            self.req_caps[w] = s
            off += _align(4 * s)
            self.starts[w] = first
            first += s
        self.starts[self.num_workers] = first
        if first != num_envs:
            raise ValueError(f"shard sizes add up to {first}, not num_envs={num_envs}")
        for w in range(self.num_workers):
            self.comp_rings[w] = <uint32_t *>(self.base + off)
            self.comp_tails[w] = 0
            off += _align(4 * self.req_caps[w])
        for w in range(self.num_workers):
            self.order_rings[w] = <uint32_t *>(self.base + off)
            off += _align(4 * self.req_caps[w])
        self.taken = 0
        self.me = 0
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
        cdef int flags = 0
        cdef Py_ssize_t i, n
        cdef int32_t e
        if self.status == NULL:
            raise RuntimeError("bind_results() first")
        if ids is None:
            for i in range(self.num_envs):
                if self.status[i]:
                    flags |= 1
                if self.info_masks[i]:
                    flags |= 2
        else:
            n = ids.shape[0]
            for i in range(n):
                e = ids[i]
                if e < 0 or e >= self.num_envs:
                    raise IndexError(f"env id {e} out of range")
                if self.status[e]:
                    flags |= 1
                if self.info_masks[e]:
                    flags |= 2
        return flags

    def release(self):
        """Drop the buffer export so the mmap can be closed."""
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False
            self.base = NULL

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)

    @staticmethod
    def signal_count(int num_workers):
        return 2 + 2 * num_workers

    def init_header(self, uint32_t sync_start=0):
        """Written once by the parent before any worker maps the region.
        ``sync_start``: where the sync counter starts (tests start it near 2**32 to
        drive a real pool across the wrap)."""
        cdef uint32_t *meta = <uint32_t *>(self.base + _OFF_META)
        meta[0] = _MAGIC
        meta[1] = self.num_workers
        meta[2] = self.num_envs
        shm_store_seqcst(self._sig(0), sync_start)

    def check_header(self):
        cdef uint32_t *meta = <uint32_t *>(self.base + _OFF_META)
        if meta[0] != _MAGIC or meta[1] != self.num_workers or meta[2] != self.num_envs:
            raise RuntimeError("shared region does not hold this pool's control block")

    # --- signal words -------------------------------------------------------

    cdef inline uint32_t *_sig(self, int sid):
        if sid == 0:
            return <uint32_t *>(self.base + _OFF_SYNC)
        if sid == 1:
            return <uint32_t *>(self.base + _OFF_PUB)
        sid -= 2
        return <uint32_t *>(self.base + _HEADER_LINES * _LINE + (sid >> 1) * _BLOCK
                            + (_B_DONE_SEQ if sid & 1 else _A_CMD_SEQ))

    cdef inline void _wake(self, int sid, uint32_t *word):
        # The publishing store/add was seq_cst, so this load cannot pass it;
        # the sleeper wrote its target before raising the flag.
        if shm_load_seqcst(word + 1) and shm_reached(shm_load_relaxed(word), shm_load_acquire(word + 2)):
            if self.futex:
                shm_futex_wake(word)
            else:
                self.sems[sid].release()

    cdef bint _wait(self, int sid, uint32_t target, WaitPolicy policy, int64_t timeout_ns,
                    bint busy=True) except -1:
        """``busy`` False: skip the spin and yield phases, sleep at once."""
        cdef uint32_t *word = self._sig(sid)
        cdef int r
        cdef int64_t spin = policy.spin_ns if busy else 0, yld = policy.yield_ns if busy else 0
        cdef bint futex = self.futex
        with nogil:
            r = _wait_word(word, target, spin, yld, timeout_ns, futex)
        if r != 2:
            return r == 1
        # Semaphore fallback: same flag handshake, the semaphore is the bed.
        shm_store_relaxed(word + 2, target)
        shm_store_seqcst(word + 1, 1)
        if shm_reached(shm_load_seqcst(word), target):
            shm_store_relaxed(word + 1, 0)
            return True
        try:
            self.sems[sid].acquire(max(timeout_ns - spin - yld, 1_000_000) / 1e9)
        except Exception:  # posix_ipc.BusyError: the slice ran out
            pass
        shm_store_relaxed(word + 1, 0)
        return bool(shm_reached(shm_load_acquire(word), target))

    # --- parent side --------------------------------------------------------

    cdef uint32_t _post(self, int worker, uint32_t cmd) except? 0:
        cdef uint8_t *blk = self.base + _HEADER_LINES * _LINE + worker * _BLOCK
        cdef uint32_t *seq = <uint32_t *>(blk + _A_CMD_SEQ)
        shm_store_relaxed(<uint32_t *>(blk + _A_CMD), cmd)
        # The stamp is published by the seq_cst add below, like the command.
        shm_store_release64(<uint64_t *>(blk + _A_POST_NS), <uint64_t>shm_now_ns())
        cdef uint32_t n = shm_add_fetch(seq, 1)
        self._wake(2 + 2 * worker, seq)
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
        return self._wait(0, target, policy, timeout_ns)

    def done_seq(self, int worker):
        return shm_load_acquire(self._sig(3 + 2 * worker))

    def cmd_seq(self, int worker):
        return shm_load_acquire(self._sig(2 + 2 * worker))

    def claim(self, const int64_t[::1] ids, uint8_t[::1] in_flight):
        """:func:`claim_ids` for this wire's envs."""
        if in_flight.shape[0] != self.num_envs:
            raise ValueError("in_flight must have one byte per env")
        return _claim(ids, in_flight)

    def dispatch(self, const int64_t[::1] ids, const int32_t[::1] owner, bint reset):
        """Append claimed env ids to their workers' request rings and post
        each worker that got one (``reset``: reset instead of step)."""
        cdef uint64_t heads[1024]
        cdef uint64_t counts[1024]
        cdef Py_ssize_t i, n = ids.shape[0]
        cdef int w
        cdef int64_t e
        cdef uint32_t flag = _REQ_RESET if reset else 0
        cdef uint8_t *blk
        for w in range(self.num_workers):
            blk = self.base + _HEADER_LINES * _LINE + w * _BLOCK
            heads[w] = shm_load_relaxed64(<uint64_t *>(blk + _A_REQ_HEAD))
            counts[w] = 0
        for i in range(n):
            e = ids[i]
            w = owner[e]
            self.req_rings[w][(heads[w] + counts[w]) % self.req_caps[w]] = <uint32_t>e | flag
            counts[w] += 1
        for w in range(self.num_workers):
            if counts[w]:
                blk = self.base + _HEADER_LINES * _LINE + w * _BLOCK
                shm_store_release64(<uint64_t *>(blk + _A_REQ_HEAD), heads[w] + counts[w])
                self._post(w, _CMD_ASYNC)

    cdef inline uint64_t *_comp_head(self, int worker):
        return <uint64_t *>(self.base + _HEADER_LINES * _LINE + worker * _BLOCK + _B_COMP_HEAD)

    cdef Py_ssize_t _take_ready(self, uint32_t[::1] out, Py_ssize_t start, Py_ssize_t n):
        """Move what the completion rings hold (at most ``n``) into ``out[start:]``,
        oldest completion first across all workers (by ticket): an env that finished
        early is never passed over for one that finished later, whichever worker ran it."""
        cdef int nw = self.num_workers, w, best
        cdef Py_ssize_t got = 0
        cdef uint64_t heads[1024]
        cdef uint32_t o, best_o = 0
        for w in range(nw):
            heads[w] = shm_load_acquire64(self._comp_head(w))
        while got < n:
            best = -1
            for w in range(nw):
                if self.comp_tails[w] != heads[w]:
                    o = self.order_rings[w][self.comp_tails[w] % self.req_caps[w]]
                    if best < 0 or <int32_t>(o - best_o) < 0:
                        best, best_o = w, o
            if best < 0:
                break
            out[start + got] = self.comp_rings[best][self.comp_tails[best] % self.req_caps[best]]
            self.comp_tails[best] += 1
            got += 1
        self.taken += <uint64_t>got
        return got

    def take_ready(self, uint32_t[::1] out, Py_ssize_t start, Py_ssize_t n):
        """``take`` without waiting: what is published now, at most ``n``."""
        if out.shape[0] < start + n:
            raise ValueError("out is too short")
        return self._take_ready(out, start, n)

    def take(self, uint32_t[::1] out, Py_ssize_t start, Py_ssize_t n,
             WaitPolicy policy, int64_t timeout_ns):
        """Move up to ``n`` finished env ids into ``out[start:]``, in the order
        they finished (across workers, by completion ticket).

        Waits at most one slice; returns how many were taken."""
        cdef uint32_t *pub = self._sig(1)
        cdef Py_ssize_t got = 0
        cdef uint32_t seen, want
        if out.shape[0] < start + n:
            raise ValueError("out is too short")
        while True:
            got += self._take_ready(out, start + got, n - got)
            if got >= n:
                break
            # A worker stores its head before it rings the doorbell, so once
            # ``seen`` is read every publication it counts is in the rings.
            seen = shm_load_acquire(pub)
            got += self._take_ready(out, start + got, n - got)
            if got >= n:
                break
            # Sleep until the rest of the request was published.  The doorbell
            # can run ahead after a worker restart (a ring rung for a worker
            # killed mid-publish): then wait for any publication.
            want = <uint32_t>(self.taken + <uint64_t>(n - got))
            if shm_reached(seen, want):
                want = seen + 1
            if not self._wait(1, want, policy, timeout_ns):
                break
        return got

    def wait_done(self, int worker, uint32_t target, WaitPolicy policy, int64_t timeout_ns):
        """Wait (one slice at most) until ``worker`` has handled command ``target``."""
        if worker < 0 or worker >= self.num_workers:
            raise IndexError(f"no worker {worker}")
        return self._wait(3 + 2 * worker, target, policy, timeout_ns)

    def sync_count(self):
        """Shards of sync steps/resets finished so far (the counter ``wait_sync`` waits on)."""
        return shm_load_acquire(self._sig(0))

    def reset_worker(self, int worker):
        """Clear a *dead* worker's control block for its replacement.

        Returns the env ids it published that the parent had not taken yet
        (valid results, in the order it finished them).  Its request ring is
        emptied; the parent knows which envs it still owed."""
        if worker < 0 or worker >= self.num_workers:
            raise IndexError(f"no worker {worker}")
        cdef uint8_t *blk = self.base + _HEADER_LINES * _LINE + worker * _BLOCK
        cdef uint64_t *headp = self._comp_head(worker)
        cdef uint64_t t = self.comp_tails[worker], head = shm_load_acquire64(headp)
        cdef uint64_t cap = self.req_caps[worker]
        cdef uint32_t missed
        cdef list published = []
        if head - t > cap:
            raise RuntimeError(f"worker {worker}'s completion ring is corrupt")
        while t != head:
            published.append(self.comp_rings[worker][t % cap])
            t += 1
        self.taken += <uint64_t>len(published)
        # A worker killed between storing its head and ringing the doorbell
        # leaves the doorbell short by one: ring it for that publication.
        missed = <uint32_t>head - shm_load_acquire(<uint32_t *>(blk + _B_COMP_RUNG))
        if missed:
            shm_add_fetch(self._sig(1), missed)
        cdef int i
        for i in range(_BLOCK // 4):
            shm_store_relaxed(<uint32_t *>blk + i, 0)
        shm_fence()
        self.comp_tails[worker] = 0
        return published

    # --- worker side --------------------------------------------------------

    def wait_command(self, int worker, uint32_t seen, WaitPolicy policy, int64_t timeout_ns):
        """Wait (one slice at most) for a command newer than ``seen``.

        An adaptive ``policy`` spins only while commands have come within its
        budget of late, and learns from this one's post stamp how long it took."""
        cdef uint32_t *word = self._sig(2 + 2 * worker)
        cdef int64_t budget, start, gap
        cdef bint got
        if not policy.adaptive:
            return self._wait(2 + 2 * worker, seen + 1, policy, timeout_ns)
        if shm_reached(shm_load_acquire(word), seen + 1):
            gap = 0
            got = True
        else:
            budget = policy.spin_ns + policy.yield_ns
            start = shm_now_ns()
            got = self._wait(2 + 2 * worker, seen + 1, policy, timeout_ns, policy.gap_ns <= budget)
            if not got:
                # A whole slice without a command: the trainer is busy elsewhere.
                policy.gap_ns = 4 * budget
                return False
            # The acquire that saw the new sequence makes its stamp visible.
            gap = <int64_t>shm_load_acquire64(<uint64_t *>(self.base + _HEADER_LINES * _LINE
                                                           + worker * _BLOCK + _A_POST_NS)) - start
            if gap < 0:
                gap = 0
            if gap > 4 * budget:
                gap = 4 * budget  # one long pause (an update) must not outweigh many short gaps
        # Moving average over about four commands.
        policy.gap_ns += (gap - policy.gap_ns) // 4
        return got

    def command(self, int worker):
        """(sequence, command) of the newest command posted to ``worker``."""
        cdef uint8_t *blk = self.base + _HEADER_LINES * _LINE + worker * _BLOCK
        cdef uint32_t seq = shm_load_acquire(<uint32_t *>(blk + _A_CMD_SEQ))
        return seq, shm_load_relaxed(<uint32_t *>(blk + _A_CMD))

    def finish(self, int worker, uint32_t seq):
        """Mark commands up to ``seq`` as handled."""
        cdef uint32_t *done = self._sig(3 + 2 * worker)
        shm_store_seqcst(done, seq)
        self._wake(3 + 2 * worker, done)

    def finish_shard(self):
        """One shard of a sync step or reset is complete."""
        cdef uint32_t *word = self._sig(0)
        shm_add_fetch(word, 1)
        self._wake(0, word)

    def pop_request(self, int worker):
        """Next env id requested from ``worker`` (with flags), or -1."""
        cdef uint8_t *blk = self.base + _HEADER_LINES * _LINE + worker * _BLOCK
        cdef uint64_t *tail = <uint64_t *>(blk + _B_REQ_TAIL)
        cdef uint64_t t = shm_load_relaxed64(tail)
        if t == shm_load_acquire64(<uint64_t *>(blk + _A_REQ_HEAD)):
            return -1
        cdef uint32_t v = self.req_rings[worker][t % self.req_caps[worker]]
        shm_store_release64(tail, t + 1)
        return v

    def publish(self, uint32_t env_id):
        """Append a finished env to its worker's completion ring (results already written)."""
        cdef int w = self.me
        cdef int lo, hi, mid
        if env_id >= <uint32_t>self.num_envs:
            raise IndexError(f"env id {env_id} out of range")
        if not (self.starts[w] <= env_id < self.starts[w + 1]):
            lo, hi = 0, self.num_workers - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.starts[mid] <= env_id:
                    lo = mid
                else:
                    hi = mid - 1
            w = self.me = lo
        cdef uint8_t *blk = self.base + _HEADER_LINES * _LINE + w * _BLOCK
        cdef uint64_t *headp = <uint64_t *>(blk + _B_COMP_HEAD)
        cdef uint64_t h = shm_load_relaxed64(headp)
        cdef uint32_t *pub = self._sig(1)
        # The ticket orders this completion among all workers' (a wrap-safe count).
        cdef uint32_t ticket = shm_add_fetch(<uint32_t *>(self.base + _OFF_ORDER), 1)
        self.comp_rings[w][h % self.req_caps[w]] = env_id
        self.order_rings[w][h % self.req_caps[w]] = ticket
        shm_store_release64(headp, h + 1)
        shm_add_fetch(pub, 1)
        shm_store_release(<uint32_t *>(blk + _B_COMP_RUNG), <uint32_t>(h + 1))
        self._wake(1, pub)


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
    cdef Py_ssize_t i, n = masks.shape[0], count = 0
    cdef uint64_t union = 0, common = <uint64_t>-1 if n else 0, m
    for i in range(n):
        m = masks[i]
        union |= m
        common &= m
        if m:
            count += 1
    if count > limit:
        return union, common, None
    reporting = []
    if count:
        for i in range(n):
            if masks[i]:
                reporting.append((i, masks[i]))
    return union, common, reporting
