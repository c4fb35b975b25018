# cython: language_level=3, boundscheck=False, wraparound=False
"""A RayPool's common sync step on its direct connections in two C calls: :meth:`StepIO.send` (the batch checked,
each pool's request written from its head and the batch's own rows) and :meth:`StepIO.collect` (once the first
answer comes, each reply aimed at its pool's rows of a fresh output; the answers read into place, the other columns
joined).  The pieces are
step_frames.py's heads, step_targets.py's plan and _inbox.pyx's reads; here no Python runs between them.

Why in C: the driver shares its core with one pool's actor, and that pool's worker starts only once the driver
blocks in its read.  Everything the driver ran from the step's entry to that read (~130 µs of cold Python here)
came before that pool's start, every step (issue 34: its actor read its request ~80 µs after the other's); and
the join's Python after the last answer (~70 µs) came before the step's return.

Anything off the common path (a batch the C check does not pass, a channel replaced or busy, a write the socket's
buffer cuts, an answer of another layout, a pool not done within the slice) goes back to the Python path as it
was: nothing is sent, or the replies are made and settled as :func:`~.step_targets.read_step` leaves them."""
import numpy as np

cimport numpy as cnp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.errno cimport EINTR, errno
from libc.math cimport ceil
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from .._batch_check cimport BatchCheck

from .._batch_check import PASSED
from ._inbox import ReadTarget, read_round, readable
from .channel import Answer, FrameReader, read_ended

cnp.import_array()

cdef int C_PASSED = PASSED

cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t writev(int fd, const iovec* iov, int iovcnt)


cdef double _now() noexcept:
    cdef timespec t
    clock_gettime(CLOCK_MONOTONIC, &t)
    return t.tv_sec + t.tv_nsec * 1e-9


cdef class StepIO:
    """A sync step's requests and answers on ``channels`` (one :class:`~.channel.Channel` per pool, in pool order),
    made for one action layout and one answer plan.

    ``heads[k]``: the bytes of pool ``k``'s step request before its actions (:class:`~.step_frames.StepFrames`);
    ``check``: the batch's :class:`~shmpool._batch_check.BatchCheck`; ``rows[k]``: pool ``k``'s rows of the batch
    (slices, in order); ``plan``, ``joiner`` and ``keys``: what :class:`~.step_targets.StepTargets` learnt of the
    pools' answers (the output's dtype, shape and each pool's answer form; how the other columns join; the info
    keys)."""

    cdef readonly list channels, heads
    cdef list fds, inboxes, rows, forms
    cdef BatchCheck check
    cdef readonly object plan, joiner
    cdef cnp.dtype obs_dtype
    cdef tuple obs_shape, keys
    # The output and targets collect aimed the pending step's replies at, until they are joined (the Python path's
    # join needs them when collect hands the step back)
    cdef readonly object obs
    cdef readonly list targets

    def __init__(self, list channels, list heads, BatchCheck check, list rows, tuple plan, object joiner, tuple keys):
        if not len(channels) == len(heads) == len(rows) == len(plan[2]):
            raise ValueError("one channel, head, row range and answer form per pool")
        self.channels = list(channels)
        self.fds = [c.fd for c in channels]
        self.inboxes = [c.reader.inbox for c in channels]
        self.heads = list(heads)
        self.check = check
        self.rows = [(r.start, r.stop) for r in rows]
        self.obs_dtype, self.obs_shape = plan[0], plan[1]
        self.forms = [(form.prefix, form.at, r) for form, r in plan[2]]
        self.plan, self.joiner, self.keys = plan, joiner, keys
        self.obs = self.targets = None

    def send(self, object actions, list channels):
        """Each pool's :class:`~.channel.Reply` to its rows of ``actions``, sent (not aimed yet: :meth:`collect` aims
        them); None, with nothing sent, unless ``actions`` is a whole batch that passes the check in C,
        C-contiguous, and ``channels`` are this one's, open, with no reply pending.

        A write the socket takes only in part (its buffer full) leaves the rest of that request, and the requests
        after it, to :meth:`~.channel.Channel.send_frame`, which waits as the socket's timeout says or loses the
        connection, as for any request."""
        cdef Py_ssize_t n = len(self.channels), k, j, start, stop, row_bytes
        cdef cnp.ndarray a
        cdef iovec iov[2]
        cdef ssize_t wrote, total
        cdef int err, fd
        cdef bytes head
        cdef char* data
        if self.check.whole(actions) != C_PASSED:
            return None
        a = <cnp.ndarray>actions
        if not cnp.PyArray_ISCARRAY_RO(a) or cnp.PyArray_DIM(a, 0) == 0 or len(channels) != n:
            return None
        for k in range(n):
            c = channels[k]
            if c is not self.channels[k] or c.lost is not None or c.pending:
                return None
        data = <char*>cnp.PyArray_DATA(a)
        row_bytes = cnp.PyArray_NBYTES(a) // cnp.PyArray_DIM(a, 0)
        replies = []
        for k in range(n):
            head = <bytes>self.heads[k]
            start, stop = self.rows[k]
            iov[0].iov_base = PyBytes_AS_STRING(head)
            iov[0].iov_len = PyBytes_GET_SIZE(head)
            iov[1].iov_base = data + start * row_bytes
            iov[1].iov_len = (stop - start) * row_bytes
            total = iov[0].iov_len + iov[1].iov_len
            fd = self.fds[k]
            while True:   # the socket is non-blocking (it has a timeout): this never waits
                wrote = writev(fd, iov, 2)
                err = errno
                if wrote >= 0 or err != EINTR:
                    break
            if wrote == total:
                replies.append(self.channels[k].sent())
                continue
            for j in range(k, n):   # cut: this request's rest and the others' through the channel, as any request
                start, stop = self.rows[j]
                frame = self.heads[j] + PyBytes_FromStringAndSize(data + start * row_bytes, (stop - start) * row_bytes)
                replies.append(self.channels[j].send_frame((frame[wrote:] if j == k and wrote > 0 else frame,)))
            break
        self.obs = self.targets = None   # aimed by collect, once the driver has waited
        return replies

    def collect(self, list replies, double timeout):
        """``(obs, rewards, terminated, truncated, infos)`` of the step last sent when, within ``timeout`` seconds,
        each of its ``replies`` (:meth:`send`'s) got its answer whole into its rows of a fresh output and the other
        columns joined by the plan; its replies are then settled.  Otherwise None: at once when a reply is not this
        step's, alone on its connection and not aimed; else every answer that came has settled its reply as
        :meth:`~.channel.Channel.read_available` settles it, and the caller waits on as usual.  A signal's
        handler that raises during the wait leaves the replies settled the same way.

        The output and the replies' targets are made once the first answer's bytes are there (or the slice is
        over): until the driver blocks, the pool whose actor shares its core cannot start its step."""
        cdef Py_ssize_t n = len(self.channels), k
        cdef double deadline
        if len(replies) != n:
            return None
        for k in range(n):
            r = replies[k]
            c = r.channel
            if (c is not self.channels[k] or r.target is not None or c.lost is not None
                    or len(c.pending) != 1 or c.pending[0] is not r):
                return None
        deadline = _now() + timeout
        readable(self.fds, max(0, <Py_ssize_t>ceil(timeout * 1000)))   # a signal's handler may raise: nothing read
        obs = np.empty(self.obs_shape, self.obs_dtype)
        targets = []
        for k in range(n):
            prefix, at, rows = self.forms[k]
            target = ReadTarget(prefix, at, obs[rows])
            (<object>replies[k]).target = target
            targets.append(target)
        self.obs, self.targets = obs, targets
        result = read_joined(self.channels, self.fds, self.inboxes, targets, deadline, self._step_of)
        if result is not None:
            self.obs = self.targets = None   # handed out: the next step's output is a fresh array
        return result

    def _step_of(self, list bodies):
        """The step's tuple from the answers' bodies (their observations in ``obs`` already)."""
        cols = self.joiner.join(bodies)
        return self.obs, cols[2], cols[3], cols[4], dict(zip(self.keys, cols[5:]))


def read_joined(list channels, list fds, list inboxes, list targets, double deadline, object join):
    """One answer per connection, each read into its target, then joined: ``channels[k]`` (its ``fds[k]`` and reader's
    ``inboxes[k]``) has exactly one reply pending, whose answer's big array is to go into ``targets[k]``
    (:class:`~._inbox.ReadTarget`).  When every answer came whole into its target before ``deadline`` (on
    ``time.monotonic``'s clock), ``join(bodies)``; its result settles every reply and is returned.  Otherwise (or when
    ``join`` returns None or raises ValueError: a body not as long as its layout) None, every answer that came having
    settled its reply as :meth:`~.channel.Channel.read_available` settles it; a signal's handler that raises during
    the wait leaves them settled the same way.  The reads of :meth:`StepIO.collect` and
    :func:`~.step_targets.read_step`."""
    cdef Py_ssize_t n = len(channels), k, left_ms
    cdef bint whole
    aimed = [[t] for t in targets]
    frames = [[] for _ in range(n)]
    statuses = [0] * n
    result = None
    try:
        while True:
            left_ms = max(0, <Py_ssize_t>ceil((deadline - _now()) * 1000))
            if not read_round(fds, inboxes, aimed, frames, statuses, left_ms) or left_ms == 0:
                break
        whole = True
        for k in range(n):
            whole = whole and len(frames[k]) == 1 and statuses[k] == 0 and (<object>targets[k]).filled
        if whole:
            try:
                result = join([frames[k][0][0] for k in range(n)])
            except ValueError:   # a body not as long as its layout: decoded below, that call's error
                result = None
    finally:
        if result is None:   # not joined, or a signal's handler raised: every answer read settles its reply
            for k in range(n):
                channels[k].settle(FrameReader.answers(frames[k], aimed[k]), read_ended(statuses[k], inboxes[k]))
    if result is None:
        return None
    answer = Answer(value=result)
    for k in range(n):
        channels[k].settle([answer], None)
    return result
