# cython: language_level=3, boundscheck=False, wraparound=False
"""Reading a direct connection in C, at both ends: whole frames taken off a socket from what has arrived,
never waiting for the rest (the driver's answers, the actor's requests), and the driver's waits on several
sockets: for any of them (``readable``), or for one frame from each, read as it comes (``read_round``, a sync
step's answers).

In Python, every answer cost a poll object, two ``recv`` calls through the socket module, a header
parse, a zeroed ``bytearray`` of the body and a poll to see whether more had come.  Here the reads
stop at the first ``EAGAIN`` instead of polling, and the body's memory is reused once nothing holds
it (the driver's join copies every column out of a multi-pool answer, so the same pages come back hot
and need no zeroing).  Measured in alternated blocks inside one RayPool of two pools: 17–21 µs less
driver CPU a call with empty envs, 31–72 µs with Pong (bench/results/LOG.md, 2026-11-27 "later").
A frame's big array can be read straight into a caller's memory (:class:`ReadTarget`) when its layout is
the one expected: a sync step's observations go into the step's output (step_targets.py).
The frame's format is channel.py's.
"""
import numpy as np

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING
from cpython.exc cimport PyErr_CheckSignals
from cpython.ref cimport Py_REFCNT
from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcmp

cnp.import_array()

cdef extern from "sys/socket.h" nogil:
    ssize_t recv(int fd, void* buf, size_t n, int flags)
    enum: MSG_DONTWAIT

cdef extern from "errno.h":
    enum: EWOULDBLOCK

cdef extern from "poll.h" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd* fds, unsigned long nfds, int timeout)
    enum: POLLIN

cdef enum:
    HEAD = 16          # channel.HEADER: pickle bytes (u32), arrays (u32), body bytes (u64), little-endian
    MAX_FDS = 1024

cdef int WOULD_BLOCK = EWOULDBLOCK   # a variable: it equals EAGAIN on Linux, a duplicate case as a switch
ENDED_BY_PEER = -1     # ``FrameInbox.read``'s status when the other side closed the connection
MALFORMED = -2         # ``FrameInbox.read``'s status when a frame's header cannot be one (:data:`MAX_BODY`)
# The longest body a frame may announce: a header past it (or one whose pickle and array sizes do not fit its
# body) is a broken stream, not a frame, and must not become an allocation of whatever its bytes say (a
# length of 2**64 - 1 read as -1 was a ValueError, 2**40 a MemoryError, either one killing the reader).
# 1 GiB: ~10x a reset of 1024 Atari frames in colour; the sender refuses a bigger frame as that call's error.
MAX_BODY = 1 << 30


cdef class ReadTarget:
    """Where one frame's big array is to be read to: straight into ``into`` (a C-contiguous array of its byte
    length), which lies at ``at`` in the frame's body, when the body starts with ``prefix`` (array sizes and
    pickle: the layout the caller expects).  ``filled`` is set once a frame was read so.

    Without it, a sync step's observations were read into each answer's body and then copied into the step's
    output, the join's biggest copy (~45 µs for two Pong answers here, issue 34)."""

    cdef readonly bytes prefix
    cdef readonly Py_ssize_t at
    cdef readonly cnp.ndarray into
    cdef readonly bint filled

    def __cinit__(self, bytes prefix, Py_ssize_t at, cnp.ndarray into):
        if not cnp.PyArray_IS_C_CONTIGUOUS(into) or not cnp.PyArray_ISWRITEABLE(into):
            raise ValueError("a target's array must be C-contiguous and writable")
        if at < len(prefix):
            raise ValueError(f"a target at {at} overlaps its prefix of {len(prefix)} bytes")
        self.prefix = prefix
        self.at = at
        self.into = into
        self.filled = False


cdef enum:
    WHOLE = 0       # the frame's body is read into its body, all of it
    CHECKING = 1    # read up to the target's range, then compared with its prefix
    DIVERTING = 2   # the prefix matched: the target's range goes to its array


cdef inline uint64_t _le(const uint8_t* p, int n) noexcept:
    cdef uint64_t v = 0
    cdef int i
    for i in range(n - 1, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef class FrameInbox:
    """One connection's frames as they arrive: :meth:`read` returns those completed by what the socket holds
    now and keeps a partial one for the next call.  A frame is ``(body, meta_len, count)``: its body (a 1-D
    uint8 array of the header's length, channel.py's layout) and the header's pickle length and array count.

    A body is fresh memory unless the last one handed out is held by nothing else any more (every array made
    from it gone), in which case its memory is read into again."""

    cdef uint8_t head[HEAD]
    cdef Py_ssize_t head_got
    cdef cnp.ndarray body       # the frame being read (None between frames)
    cdef Py_ssize_t got
    cdef cnp.ndarray spare      # the last body handed out
    cdef ReadTarget target      # the frame being read's target (None: none)
    cdef int mode               # WHOLE, CHECKING or DIVERTING
    cdef readonly object malformed   # what was wrong with the header that broke the stream (None: nothing)

    def __cinit__(self):
        self.head_got = 0
        self.got = 0

    cdef cnp.ndarray _new_body(self, cnp.npy_intp n):
        cdef cnp.ndarray spare = self.spare
        if spare is not None and Py_REFCNT(spare) == 2 and cnp.PyArray_DIM(spare, 0) == n:
            return spare   # 2: this attribute and the local name; nothing outside holds it
        return cnp.PyArray_EMPTY(1, &n, cnp.NPY_UINT8, 0)

    @property
    def partial(self) -> bool:
        """Whether part of a frame has been read and the rest has not come yet."""
        return self.head_got > 0 or self.body is not None

    cdef int _start_body(self, list targets, Py_ssize_t index) except -1:
        """The header is in: the body's memory, and whether ``targets[index]`` may take part of it; 1 (nothing
        started, :attr:`malformed` said why) when the header cannot be a frame's."""
        cdef uint64_t length = _le(self.head + 8, 8)
        cdef uint64_t before = 8 * _le(self.head + 4, 4) + _le(self.head, 4)   # array sizes and pickle
        if length > MAX_BODY or before > length:
            self.malformed = (f"a frame header announcing {length} bytes (at most {MAX_BODY}) for "
                              f"{_le(self.head + 4, 4)} arrays and a pickle of {_le(self.head, 4)} bytes")
            return 1
        cdef cnp.npy_intp n = <cnp.npy_intp>length
        self.body = self._new_body(n)
        self.got = 0
        self.target = None
        self.mode = WHOLE
        if targets is None or index >= len(targets) or targets[index] is None:
            return 0
        cdef ReadTarget target = <ReadTarget?>targets[index]
        if target.at + cnp.PyArray_NBYTES(target.into) <= n:
            self.target = target
            self.mode = CHECKING
        return 0

    cdef char* _next_span(self, size_t* want):
        """Where the next bytes of the body go, and (``want``) how many may go there."""
        cdef Py_ssize_t n = cnp.PyArray_DIM(self.body, 0), at, end
        cdef uint8_t* body = <uint8_t*>cnp.PyArray_DATA(self.body)
        if self.mode != WHOLE:
            at = self.target.at
            end = at + cnp.PyArray_NBYTES(self.target.into)
            if self.mode == CHECKING and self.got == at:
                if memcmp(body, PyBytes_AS_STRING(self.target.prefix), len(self.target.prefix)) == 0:
                    self.mode = DIVERTING
                else:
                    self.mode = WHOLE
            if self.mode == CHECKING:
                want[0] = at - self.got
                return <char*>body + self.got
            if self.mode == DIVERTING and self.got < end:
                want[0] = end - self.got
                return <char*>cnp.PyArray_DATA(self.target.into) + (self.got - at)
        want[0] = n - self.got
        return <char*>body + self.got

    def read(self, int fd, list targets=None):
        """``(frames, status)``: the frames completed from what ``fd`` holds now, in order, and how reading
        stopped: 0 (nothing more has arrived), :data:`ENDED_BY_PEER`, :data:`MALFORMED` (a header no frame has:
        :attr:`malformed` says what it announced; nothing more is read, every later call says so again), or the
        ``errno`` of a failed read (the frames before it still count).

        ``targets``: a :class:`ReadTarget` (or None) for each frame to come, the one under way first: the ``j``-th
        frame this call returns was read by ``targets[j]`` when that target's ``filled`` is set.  The range it
        names is then left unwritten in the body."""
        cdef list frames = []
        cdef ssize_t k
        cdef int err = 0
        cdef char* at
        cdef size_t want
        if self.malformed is not None:
            return frames, MALFORMED
        while True:
            if self.body is None:
                with nogil:
                    k = recv(fd, self.head + self.head_got, HEAD - self.head_got, MSG_DONTWAIT)
                    err = errno
                if k > 0:
                    self.head_got += k
                    if self.head_got == HEAD:
                        if self._start_body(targets, len(frames)):
                            return frames, MALFORMED
                    else:
                        continue
            else:   # a body still short of its length (a complete one, even empty, was handed out below)
                at = self._next_span(&want)
                with nogil:
                    k = recv(fd, at, want, MSG_DONTWAIT)
                    err = errno
                if k > 0:
                    self.got += k
            if k == 0:
                return frames, ENDED_BY_PEER
            if k < 0:
                if err == EINTR:
                    continue
                return frames, (0 if err == EAGAIN or err == WOULD_BLOCK else err)
            if self.body is not None and self.got == cnp.PyArray_DIM(self.body, 0):
                if self.mode == DIVERTING:
                    self.target.filled = True
                self.target = None
                self.mode = WHOLE
                frames.append((self.body, <long>_le(self.head, 4), <long>_le(self.head + 4, 4)))
                self.spare = self.body
                self.body = None
                self.head_got = 0


cdef int _poll(pollfd* polled, Py_ssize_t n, int timeout_ms) except -2:
    """``poll`` of ``n`` fds for reading, without the GIL: how many are ready, or -1 when a signal came (its Python
    handler has run then: Ctrl-C raises here, not after the timeout)."""
    cdef int ready, err
    with nogil:
        ready = poll(polled, n, timeout_ms)
        err = errno
    if ready < 0:
        if err != EINTR:
            raise OSError(err, "poll failed")
        PyErr_CheckSignals()
        return -1
    return ready


cdef inline void _watch(pollfd* slot, int fd) noexcept:
    slot.fd = fd
    slot.events = POLLIN
    slot.revents = 0


def readable(list fds, int timeout_ms):
    """The fds of ``fds`` with something to read (or whose connection ended), once one has or ``timeout_ms``
    passed (0: at once, -1: no limit), or a signal came (then none, after its handler ran: what the handler
    raises is raised here); the wait releases the GIL."""
    cdef Py_ssize_t n = len(fds), i
    if n > MAX_FDS:
        raise ValueError(f"{n} connections in one wait (at most {MAX_FDS})")
    cdef pollfd polled[MAX_FDS]
    for i in range(n):
        _watch(&polled[i], fds[i])
    if _poll(polled, n, timeout_ms) < 0:
        return []   # the caller, which loops until its deadline, sees an early return with nothing ready
    return [polled[i].fd for i in range(n) if polled[i].revents]


def read_round(list fds, list inboxes, list targets, list frames, list statuses, int timeout_ms):
    """One round of a wait for one frame on each of several connections: poll the fds ``k`` whose ``frames[k]``
    is still empty and whose ``statuses[k]`` is 0, until one is readable or ``timeout_ms`` passed (0: at once, -1:
    no limit); then read each readable one with ``inboxes[k].read(fds[k], targets[k])``, adding its frames to
    ``frames[k]`` and setting ``statuses[k]`` to its status.  Returns how many fds still wait (no frame, open).

    A signal during the poll runs its handler here, before anything is read (what the handler raises is raised,
    and nothing read is lost); the round then ends with nothing read."""
    cdef Py_ssize_t n = len(fds), i, k, m = 0
    if n > MAX_FDS:
        raise ValueError(f"{n} connections in one wait (at most {MAX_FDS})")
    cdef pollfd polled[MAX_FDS]
    cdef Py_ssize_t index[MAX_FDS]
    for k in range(n):
        if not frames[k] and statuses[k] == 0:
            _watch(&polled[m], fds[k])
            index[m] = k
            m += 1
    if m == 0:
        return 0
    if _poll(polled, m, timeout_ms) < 0:
        return m
    cdef list got
    cdef Py_ssize_t waiting = 0
    for i in range(m):
        k = index[i]
        if polled[i].revents:
            got, status = (<FrameInbox?>inboxes[k]).read(fds[k], targets[k])
            (<list>frames[k]).extend(got)
            statuses[k] = status
        if not frames[k] and statuses[k] == 0:
            waiting += 1
    return waiting
