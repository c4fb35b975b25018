"""A direct connection between a RayPool's driver and one of its actors, for the calls of every step.

An ordinary Ray actor call goes through Ray's scheduler and object store: on a 2-core machine ~2.7 ms
empty and ~7.7 ms with 8 Pong observations (issue 34).  Ray's compiled graphs would avoid that, but in
Ray 2.60 a two-node graph hung on its first get and its teardown crashed the raylet and the driver
(issue 34's notes), so the hot calls (``reset``, ``step``, ``send``/``recv``) take a plain TCP
connection instead.  Ray still places, describes, restarts and kills the actors, and carries the rare
calls.

Each actor listens on one port of its node's address (the one Ray itself uses) and serves one driver,
which must first present the RayPool's random token.  A frame is a pickle of a named message
(:class:`Request`, :class:`Answer`) in which every contiguous array is only named (dtype, shape): its
bytes follow the pickle as they are, sent straight from the actor's shared region (the small ones copied
together into one part) and received into memory that the returned arrays own (the last answer's, once
nothing holds its arrays: ``_inbox``).  Every step's request and answer (plain arrays, flat infos) go in
short form: a pickle of their layout alone, written and read once per layout (:class:`Layouts`), the arrays'
views made in C (``_frames``).  Calls on one connection are answered in order, one at a time, by the actor's
serving thread.  Nothing here needs Ray.

What the token protects, and what it does not: it is a random secret (:data:`TOKEN_BYTES` bytes) that Ray
carries to the actor in its constructor's arguments, and the actor serves only the connection that presents
it, so other users and processes that can reach the port (on the node or the network) cannot drive the pool.
Nothing more: there is no TLS, no encryption and no integrity check, and the token crosses in clear, so a peer
that can read or alter the traffic can read the observations and actions, replay the token or change the
bytes.  It sits inside Ray's trust boundary (whoever reaches the cluster's Ray can read the token and run any
code on the nodes anyway): a RayPool belongs on a network trusted as Ray itself is.  Callers are let in by one
poll, each with :data:`AUTH_S` for its whole token; a frame header no frame can have (:data:`MAX_BODY`) drops
its connection (:class:`ChannelProtocolError`).
"""
from __future__ import annotations

import collections
import functools
import hmac
import io
import math
import os
import pickle
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

from ._frames import RowsFramer, arrays_at, check_length, frame_meta, frame_parts, is_plain, layout_end, plain_layout
from ._inbox import ENDED_BY_PEER, MALFORMED, MAX_BODY, FrameInbox, ReadTarget, readable
from .batches import FramedRows, Rows, masks_are_bool

HEADER = struct.Struct("<IIQ")   # pickle bytes, arrays, body bytes (array sizes, pickle, aligned arrays)
ALIGN = 16            # each array's offset in a frame's body: numpy's widest usual alignment
TOKEN_BYTES = 16
STALL_S = 60.0        # a frame (or a send) that stops half-way for this long: the connection is treated as lost
AUTH_S = 5.0          # a caller that has not sent its whole token by then is hung up on (the driver sends it at once)
KNOCKING = 64         # callers awaiting their token's end at once; the oldest is hung up on to make room
ACCEPT_POLL_S = 1.0   # with no caller knocking, how often the accepting thread looks whether the server closed
IOV_MAX = 512         # parts per sendmsg (Linux allows 1024)
JOIN_BYTES = 64 * 1024   # a frame up to this size is joined and sent at once (cheaper than sendmsg of parts)
# Socket buffers big enough for a whole answer: with the defaults a 221 KiB answer crossed in many
# wake-ups, a round trip of 919 µs on loopback here against 489 µs with these (the kernel caps them
# at net.core.{r,w}mem_max).
BUFFER_BYTES = 4 * 2**20
# Between calls the actor's thread keeps polling, yielding its core, while the driver's calls come within this of
# its last answer: waking a sleeping process costs dearly here (a sync Pong step over RayPool: p50 10.9 ms
# sleeping, 10.2 ms with this window, in alternated blocks; 5 ms gave no more).
SPIN_S = 0.002


def _tuned_socket(host: str, port: int) -> tuple[socket.socket, Any]:
    """A TCP socket for ``host`` and its address to bind or connect; its buffers are set before either, so
    the window is negotiated with them."""
    family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    return sock, where


class ChannelClosedError(ConnectionError):
    """The connection to an actor ended: its process exited or was killed, or its node went away."""


class ChannelProtocolError(ChannelClosedError):
    """What came on a connection is no frame (a header announcing an impossible length): the stream cannot be
    read on, so the connection is dropped."""


@dataclass(frozen=True)
class Request:
    """Driver to actor: call ``method(*args)`` on the actor's pool."""

    method: str
    args: tuple


@dataclass(frozen=True)
class Answer:
    """Actor to driver: what the call returned, or the exception it raised (``failed``)."""

    value: Any = None
    error: BaseException | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


def _raw_array(obj: Any, arrays: list) -> tuple | None:
    """A plain array (``is_plain``) leaves the pickle as ``(dtype, shape)``; its bytes go beside it."""
    if is_plain(obj):
        arrays.append(obj)
        return obj.dtype.str, obj.shape
    return None


STR_ONLY = frozenset((str,))


@dataclass(frozen=True)
class PlainRows:
    """What the pickle says of a :class:`Rows` answer whose arrays are all plain and whose infos are flat (a
    homogeneous pool's step or recv): the info keys and each array's dtype and shape, in the order ids, obs,
    rew, term, trunc, infos.  The actor writes such an answer every step; its pickle is made once per layout
    (:class:`Layouts`)."""

    keys: tuple
    specs: tuple

    def __reduce__(self) -> tuple:
        return PlainRows, (self.keys, self.specs)

    @staticmethod
    def split(message: Any) -> tuple[tuple, list] | None:
        """The info keys and the arrays of ``message`` when it is a :class:`Rows` answer with flat infos (whether
        the arrays are plain is checked after); None when it is anything else."""
        if type(message) is not Answer or message.error is not None or type(message.value) is not Rows:
            return None
        return PlainRows.split_rows(message.value)

    @staticmethod
    def split_rows(rows: Rows) -> tuple[tuple, list] | None:
        """:meth:`split` of an answer whose value is ``rows``."""
        if not set(map(type, rows.infos)) <= STR_ONLY:   # no generator: this runs for every answer
            return None
        return tuple(rows.infos), [rows.ids, rows.obs, rows.rew, rows.term, rows.trunc, *rows.infos.values()]

    @functools.cached_property
    def bool_masks(self) -> bool:
        return masks_are_bool(self.keys, [np.dtype(d) for d, _ in self.specs[5:]])

    def from_frame(self, body: np.ndarray, start: int, layout: tuple, target: ReadTarget | None = None) -> Answer:
        """The answer, its rows left in the frame until read (:class:`~.batches.FramedRows`); ``target``: the target
        its observations were read into instead of ``body``."""
        return Answer(value=FramedRows(body, start, layout, self.keys, self.bool_masks, target))


@dataclass(frozen=True)
class PlainCall:
    """What the pickle says of a :class:`Request` whose arguments are all plain arrays (``step``, ``send``,
    ``recv``: every step's calls): the method and each array's dtype and shape."""

    method: str
    specs: tuple

    def __reduce__(self) -> tuple:
        return PlainCall, (self.method, self.specs)

    @staticmethod
    def split(message: Any) -> tuple[str, list] | None:
        """The method and the arguments of ``message`` when it is a :class:`Request`; None otherwise."""
        if type(message) is not Request:
            return None
        return message.method, list(message.args)

    def from_frame(self, body: np.ndarray, start: int, layout: tuple) -> Request:
        return Request(self.method, tuple(arrays_at(body, start, layout)))


SHORT_FORM_OF = {Answer: PlainRows, Request: PlainCall}   # the one short form a message of each type may take
SHORT_FORMS = tuple(SHORT_FORM_OF.values())


class Layouts:
    """The fixed parts of short-form frames, by layout, on both ends of every connection in this process.

    A connection's calls and answers keep one layout (the same arrays' dtypes and shapes) from step to step,
    so the pickle naming them is written once per layout when sending (kept with the dtypes its key names by
    identity), and read once per distinct pickle when receiving.  Each map is emptied when it reaches ``limit``
    entries: a caller whose shapes never repeat pays what an uncached frame costs, nothing more."""

    def __init__(self, limit: int = 256) -> None:
        self.limit = limit
        self.sent: dict[tuple, tuple[bytes, tuple, tuple]] = {}
        self.received: dict[bytes, tuple[Any, tuple]] = {}
        self.last_rows = RowsFramer()   # the last rows answer's layout, checked before the map

    def frame(self, message: Any) -> list | None:
        """The parts of ``message``'s frame in short form; None when it has none (then it is pickled whole)."""
        form = SHORT_FORM_OF.get(type(message))
        split = None if form is None else form.split(message)
        return None if split is None else self._short(form, *split)

    def rows_frame(self, rows: Rows) -> list | None:
        """The parts of ``Answer(value=rows)``'s frame in short form (:meth:`frame`'s, without the answer); None
        when it has none.  The actor's answer to every step: in the last one's layout, framed in C."""
        parts = self.last_rows.parts(rows)
        if parts is not None:
            return parts
        split = PlainRows.split_rows(rows)
        if split is None:
            return None
        keys, arrays = split
        known = self._fixed(PlainRows, keys, arrays)
        if known is None:
            return None
        layout, fixed = known
        self.last_rows.remember(keys, layout, *fixed)
        return frame_parts(fixed[0], fixed[1], arrays)

    def _short(self, form: type, name: Any, arrays: list) -> list | None:
        known = self._fixed(form, name, arrays)
        return None if known is None else frame_parts(known[1][0], known[1][1], arrays)

    def _fixed(self, form: type, name: Any, arrays: list) -> tuple[tuple, tuple[bytes, tuple, tuple]] | None:
        """The arrays' layout key and the fixed parts of their frame in ``form`` (made once per layout)."""
        layout = plain_layout(arrays)
        if layout is None:
            return None
        key = (form, name, layout)
        fixed = self.sent.get(key)
        if fixed is None:
            if len(self.sent) >= self.limit:
                self.sent.clear()
            fixed = self.sent[key] = _fixed_parts(form(name, tuple((a.dtype.str, a.shape) for a in arrays)), arrays)
        return layout, fixed

    def known(self, meta: bytes) -> tuple[Any, tuple, int] | None:
        """The short form a frame's pickle ``meta`` was read as before, its arrays' layout and its body's length."""
        return self.received.get(meta)

    def learn(self, meta: bytes, form: Any) -> tuple[Any, tuple, int]:
        """Remember that pickle ``meta`` reads as the short form ``form``; its layout with the dtypes made, and
        the length of a body of that layout (array sizes, ``meta``, the aligned arrays)."""
        if len(self.received) >= self.limit:
            self.received.clear()
        layout = tuple((np.dtype(d), tuple(s)) for d, s in form.specs)
        known = self.received[meta] = form, layout, layout_end(8 * len(layout) + len(meta), layout)
        return known


def _fixed_parts(form: Any, arrays: list[np.ndarray]) -> tuple[bytes, tuple, tuple]:
    """A short form's frame prefix and pads (:func:`_frame_prefix`), and the arrays' dtypes (kept alive, since the
    layout key names them by identity)."""
    return *_frame_prefix(pickle.dumps(form, protocol=5), arrays), tuple(a.dtype for a in arrays)


def _frame_prefix(meta: bytes | memoryview, arrays: list[np.ndarray]) -> tuple[bytes, tuple]:
    """A frame's bytes before its arrays (header, array sizes, the pickle ``meta``) and the zero bytes before
    each array, which starts at a multiple of ALIGN in the body."""
    sizes = struct.pack(f"<{len(arrays)}Q", *(a.nbytes for a in arrays))
    body = len(sizes) + len(meta)
    pads = []
    for a in arrays:
        pads.append(_padded(body))
        body += pads[-1] + a.nbytes
    if body > MAX_BODY:   # the other end would drop the connection on its header: this message's error instead
        raise ValueError(f"a message of {body} bytes is more than one frame carries ({MAX_BODY} bytes)")
    return HEADER.pack(len(meta), len(arrays), body) + sizes + bytes(meta), tuple(pads)


LAYOUTS = Layouts()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, arrays: Iterable[memoryview]) -> None:
        super().__init__(file)
        self.arrays = iter(arrays)

    def persistent_load(self, pid: tuple) -> np.ndarray:
        dtype, shape = pid
        return np.frombuffer(next(self.arrays), dtype).reshape(shape)


def _padded(n: int) -> int:
    return -n % ALIGN


def _pickled(message: Any, pickler: type) -> tuple[memoryview, list[np.ndarray]]:
    """The pickle of ``message`` with its arrays only named, and those arrays in order."""
    arrays: list[np.ndarray] = []
    out = io.BytesIO()
    dumper = pickler(out, protocol=5)
    dumper.persistent_id = functools.partial(_raw_array, arrays=arrays)
    dumper.dump(message)
    return out.getbuffer(), arrays


def encode(message: Any) -> list:
    """``message`` as frame parts (each a 1-D buffer of bytes): header, array sizes, pickle, then each array's
    bytes (aligned).

    Arrays are not pickled: the pickle names their dtype and shape, and their memory is sent as it is."""
    short = LAYOUTS.frame(message)
    if short is not None:
        return short
    try:
        meta, arrays = _pickled(message, pickle.Pickler)
    except Exception:   # what plain pickle refuses (a lambda in an info dict), cloudpickle takes, as Ray would
        meta, arrays = _pickled(message, cloudpickle.Pickler)
    return frame_parts(*_frame_prefix(meta, arrays), arrays)


def send_parts(sock: socket.socket, parts: Iterable[Any]) -> None:
    """Send every byte of ``parts`` (1-D buffers of bytes), in order: joined when small, else as they are.

    The first try is one ``writev`` on the socket's descriptor, which a connection's buffer (BUFFER_BYTES) nearly
    always takes whole: a socket with a timeout is non-blocking underneath, and Python's own send polls it before
    every call, one more system call on each end of a step's serial path (issue 34).  What it leaves is sent
    through the socket, waiting as its timeout says."""
    views = [p for p in parts if len(p)]
    if sum(map(len, views)) <= JOIN_BYTES:
        views = [b"".join(views)]
    try:
        sent = os.writev(sock.fileno(), views[:IOV_MAX])
    except BlockingIOError:
        sent = 0
    while True:
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if not views:
            return
        if sent:
            views[0] = memoryview(views[0])[sent:]
        sent = sock.sendmsg(views[:IOV_MAX])


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes into fresh memory; :class:`ChannelClosedError` if the peer closed first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ChannelClosedError("the connection was closed by the other side")
        got += k
    return buf


def recv_frame(sock: socket.socket) -> tuple[bytearray, int, int]:
    """One whole frame: its body, pickle length and array count (:func:`decode_body` makes the message)."""
    meta_len, count, body_len = HEADER.unpack(recv_exact(sock, HEADER.size))
    if body_len > MAX_BODY or 8 * count + meta_len > body_len:   # as FrameInbox judges a header
        raise ChannelProtocolError(f"what came is no frame: a frame header announcing {body_len} bytes (at most "
                                   f"{MAX_BODY}) for {count} arrays and a pickle of {meta_len} bytes")
    return recv_exact(sock, body_len), meta_len, count


def recv_message(sock: socket.socket) -> Any:
    """One frame, unpickled; its arrays share one fresh block of memory, which they own."""
    return decode_body(*recv_frame(sock))


def decode_body(body: bytearray | np.ndarray, meta_len: int, count: int, target: ReadTarget | None = None) -> Any:
    """A frame's message from its body (array sizes, pickle, aligned arrays); ``target``: the filled target its
    observations were read into (only a Rows answer's can be)."""
    view = memoryview(body)
    at = 8 * count
    meta = bytes(view[at:at + meta_len])
    known = LAYOUTS.known(meta)
    if known is None:
        sizes = struct.unpack_from(f"<{count}Q", view)
        arrays = []
        offset = at + meta_len
        for n in sizes:
            offset += _padded(offset)
            arrays.append(view[offset:offset + n])
            offset += n
        message = _Unpickler(io.BytesIO(meta), arrays).load()
        if type(message) not in SHORT_FORMS:
            return message
        known = LAYOUTS.learn(meta, message)
    form, layout, size = known
    check_length(len(body), size)   # here, so that rows read later from the frame cannot fail
    if type(body) is not np.ndarray:
        body = np.frombuffer(body, np.uint8)
    if target is None:
        return form.from_frame(body, at + meta_len, layout)
    if type(form) is not PlainRows:
        raise ValueError(f"a frame read into place is a {type(form).__name__}, not a Rows answer")
    return form.from_frame(body, at + meta_len, layout, target)


def plain_call(body: np.ndarray, meta_len: int, count: int) -> tuple[str, list] | None:
    """The method and arguments of a request in a short form read before (every step's), without building the
    :class:`Request` :func:`decode_body` would; None for any other frame."""
    known = LAYOUTS.known(frame_meta(body, count, meta_len))
    if known is None or type(known[0]) is not PlainCall:
        return None
    return known[0].method, arrays_at(body, 8 * count + meta_len, known[1])


def answer_parts(value: Any) -> list:
    """The frame of a call's answer ``value``: rows in short form straight from them, anything else :func:`encode`'s."""
    parts = LAYOUTS.rows_frame(value) if type(value) is Rows else None
    return encode(Answer(value=value)) if parts is None else parts


def read_ended(status: int, inbox: FrameInbox | None = None) -> BaseException | None:
    """How a connection ended, from :meth:`~._inbox.FrameInbox.read`'s status (``inbox``: the one that read it):
    None while it is open."""
    if status == ENDED_BY_PEER:
        return ChannelClosedError("the connection was closed by the other side")
    if status == MALFORMED:
        said = "" if inbox is None else f": {inbox.malformed}"
        return ChannelProtocolError(f"what came is no frame{said}; the connection was dropped")
    return OSError(status, os.strerror(status)) if status else None


class FrameReader:
    """The driver's answers put together from what has arrived, never waiting for the rest: a peer that stops
    half-way through a frame must not hold the driver past its wait's slice (its timeout, the liveness watch).
    The reads are C's (:class:`~._inbox.FrameInbox`)."""

    def __init__(self) -> None:
        self.inbox = FrameInbox()

    def read_available(self, sock: socket.socket, targets: list[ReadTarget | None] | None = None
                       ) -> tuple[list, BaseException | None]:
        """The messages completed by what ``sock`` holds now (it was seen readable), and how the connection
        ended if it did (after those messages: an actor's last answer still counts).  ``targets``: a target
        (or None) for each message to come, in order (:meth:`~._inbox.FrameInbox.read`)."""
        frames, status = self.inbox.read(sock.fileno(), targets)
        return FrameReader.answers(frames, targets), read_ended(status, self.inbox)

    @staticmethod
    def answers(frames: list[tuple[np.ndarray, int, int]], targets: list[ReadTarget | None] | None) -> list:
        """The messages of ``frames`` read with ``targets``; one that does not decode is its call's error."""
        out: list = []
        for j, (body, meta_len, count) in enumerate(frames):
            target = targets[j] if targets is not None and j < len(targets) else None
            filled = target if target is not None and target.filled else None
            try:
                out.append(decode_body(body, meta_len, count, filled))
            except Exception as exc:   # e.g. an info of a class this process cannot import: that
                out.append(Answer(error=exc))   # call's error; the frame was read whole, the stream is fine
        return out


class CallGaps:
    """How soon the driver's calls come after the actor's answers, and so whether waiting for the next one
    should spin: only while the median of the last ``keep`` gaps is within ``spin_s``, so a trainer that
    computes between steps (a GPU update, an evaluation) finds the actor asleep, not burning its core."""

    def __init__(self, spin_s: float = SPIN_S, keep: int = 8) -> None:
        self.spin_s = spin_s
        self.gaps: collections.deque[float] = collections.deque(maxlen=keep)

    def record(self, gap_s: float) -> None:
        self.gaps.append(gap_s)

    def window(self) -> float:
        """Seconds to spin before sleeping (0: sleep at once)."""
        if not self.gaps or self.spin_s <= 0:
            return 0.0
        return self.spin_s if sorted(self.gaps)[len(self.gaps) // 2] <= self.spin_s else 0.0


def await_call(idle: select.poll, gaps: CallGaps) -> None:
    """Return once the connection polled by ``idle`` has something to read: spinning (and yielding the core to
    whatever else may run there) for ``gaps.window()``, then asleep as long as it takes."""
    start = time.perf_counter()
    end = start + gaps.window()
    while not idle.poll(0):
        if time.perf_counter() >= end:
            idle.poll()
            break
        os.sched_yield()
    gaps.record(time.perf_counter() - start)


def whole_frames(fd: int, inbox: FrameInbox, ready: select.poll) -> list:
    """The whole frames ``fd`` holds, at least one: once a frame has started (in ``inbox`` or on ``fd``), each wait
    for more of it is bounded by STALL_S (then :class:`ChannelClosedError`).  The reads are C's, as the driver's."""
    while True:
        frames, status = inbox.read(fd)
        if frames:
            return frames   # an end or error after them is met by the next read
        ended = read_ended(status, inbox)
        if ended is not None:
            raise ended
        if not ready.poll(STALL_S * 1000):
            raise ChannelClosedError(f"a frame stopped half-way for {STALL_S} s")


def _portable_answer(exc: BaseException) -> list:
    """The frame of a failed call; an exception that does not pickle is sent as its type and text."""
    try:
        return encode(Answer(error=exc))
    except Exception:
        return encode(Answer(error=RuntimeError(f"{type(exc).__name__}: {exc}"[:2000])))


class Knock:
    """A caller accepted and not yet let in: the token bytes it has sent, and when it is hung up on."""

    __slots__ = ("conn", "got", "deadline")

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn = conn
        self.got = bytearray()
        self.deadline = deadline


class ChannelServer:
    """The actor's end: listens on ``host`` (port chosen by the OS), accepts the driver that presents
    ``token`` and answers its :class:`Request` frames in one thread: ``handlers[method](*args)``.  A method
    ``handlers`` lacks is answered with a ValueError.  ``spin_s``: how long it may poll for the next call before
    sleeping (:class:`CallGaps`; 0: it always sleeps).

    Callers are let in one poll for all: each has AUTH_S for its whole token, and a silent or trickling one
    never delays another (read one after the other, two silent local peers queued before the driver held its
    first call 2 x AUTH_S, past a ``step_timeout``).  Once the driver that was let in hangs up, nobody else is;
    one whose stream breaks (:class:`ChannelProtocolError`) is dropped and the server accepts again."""

    def __init__(self, host: str, token: bytes, handlers: Mapping[str, Callable[..., Any]],
                 spin_s: float = SPIN_S) -> None:
        self.token = token
        self.spin_s = spin_s
        self.handlers = dict(handlers)
        self.closed = False
        self.listener, where = _tuned_socket(host, 0)
        self.listener.bind(where)
        self.listener.listen()
        self.listener.setblocking(False)   # accept() in the poll loop: a caller gone meanwhile must not block it
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.thread = threading.Thread(target=self._run, name="shmpool-channel", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            conn = self._let_in()
            if conn is None:   # closed
                return
            with conn:
                conn.settimeout(STALL_S)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                broken = self._serve(conn)
            if not broken:
                self.close()   # one driver per actor: once it hangs up, nobody else is let in
                return

    def _let_in(self) -> socket.socket | None:
        """The next caller that presents the token (non-blocking, its token read); None once the server closed."""
        knocking: dict[int, Knock] = {}   # by fd, oldest first
        polled = select.poll()
        listening = self.listener.fileno()
        polled.register(listening, select.POLLIN)
        try:
            while not self.closed:
                now = time.monotonic()
                for fd in [fd for fd, k in knocking.items() if k.deadline <= now]:
                    self._hang_up(knocking, polled, fd)
                wait_s = min([k.deadline - now for k in knocking.values()], default=ACCEPT_POLL_S)
                for fd, _ in polled.poll(max(0, math.ceil(min(wait_s, ACCEPT_POLL_S) * 1000))):
                    if fd == listening:
                        if not self._accept(knocking, polled):
                            return None
                        continue
                    if fd in knocking and self._hears(knocking, polled, fd):
                        conn = knocking.pop(fd).conn
                        polled.unregister(fd)
                        return conn
            return None
        finally:   # the driver is in (or the server closed): nobody else would be let in, so nobody waits
            for fd in list(knocking):
                self._hang_up(knocking, polled, fd)

    def _accept(self, knocking: dict[int, Knock], polled: select.poll) -> bool:
        """Accept every caller waiting; False once the listener is closed."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:   # closed
                return False
            conn.setblocking(False)
            if len(knocking) >= KNOCKING:
                self._hang_up(knocking, polled, next(iter(knocking)))
            knocking[conn.fileno()] = Knock(conn, time.monotonic() + AUTH_S)
            polled.register(conn.fileno(), select.POLLIN)

    def _hears(self, knocking: dict[int, Knock], polled: select.poll, fd: int) -> bool:
        """Read what caller ``fd`` sent of its token: True once it is the whole token; a wrong one, an end or an
        error hangs up on it."""
        knock = knocking[fd]
        try:
            got = knock.conn.recv(len(self.token) - len(knock.got))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            got = b""
        knock.got += got
        if got and len(knock.got) < len(self.token):
            return False
        if got and hmac.compare_digest(bytes(knock.got), self.token):
            return True
        self._hang_up(knocking, polled, fd)   # not our driver (or gone): hang up and keep listening
        return False

    @staticmethod
    def _hang_up(knocking: dict[int, Knock], polled: select.poll, fd: int) -> None:
        polled.unregister(fd)
        knocking.pop(fd).conn.close()

    def _serve(self, conn: socket.socket) -> bool:
        """Answer ``conn``'s calls until it ends; True when it ended on a broken stream."""
        idle = select.poll()
        idle.register(conn.fileno(), select.POLLIN)
        gaps = CallGaps(self.spin_s)
        inbox = FrameInbox()
        frames: collections.deque = collections.deque()   # requests read and not answered yet, in order
        while True:
            if not frames:
                try:
                    if not inbox.partial:   # between calls the driver may pause as long as it likes (an evaluation)
                        await_call(idle, gaps)
                    frames.extend(whole_frames(conn.fileno(), inbox, idle))
                except ChannelProtocolError:
                    return True
                except (OSError, ChannelClosedError):
                    return False
                # A driver on this core may still be sending a step's other requests: let it finish before this call's
                # pool takes the core, or it waits out a scheduler slice (1–4 ms) with those pools idle (issue 34).
                os.sched_yield()
            frame = frames.popleft()
            try:   # a request this process cannot unpickle (a driver-only class) is that call's error
                # Every step's request is in a short form: its arrays viewed in the frame, no Request made, and its
                # rows answered in short form straight from them (beside busy workers every Python call is paid
                # cold, and these are on the step's serial path: issue 34).
                call = plain_call(*frame)
                if call is None:
                    request = decode_body(*frame)
                    if not isinstance(request, Request):
                        raise ValueError(f"{request!r} is not a call this actor serves")
                    call = request.method, request.args
                method, args = call
                handler = self.handlers.get(method)
                if handler is None:
                    raise ValueError(f"{method!r} is not a call this actor serves")
                parts = answer_parts(handler(*args))
            except Exception as exc:
                parts = _portable_answer(exc)
            try:
                send_parts(conn, parts)
            except OSError:
                return False

    def close(self) -> None:
        self.closed = True
        self.listener.close()


class Reply:
    """A call's answer to come: ``done`` once it is read; then ``answer`` (an :class:`Answer`) or, when
    the connection ended first, ``lost`` (a :class:`ChannelClosedError`).  Settled once, by its channel."""

    __slots__ = ("channel", "target", "answer", "lost", "done")

    def __init__(self, channel: Channel, target: ReadTarget | None = None) -> None:
        self.channel = channel
        # Where the answer's observations are to be read, when it is rows of that layout; it may be set until the
        # answer is read (the channel reads the pending replies' targets then).
        self.target = target
        self.answer: Answer | None = None
        self.lost: ChannelClosedError | None = None
        self.done = False   # an attribute, not a property: the wait loop reads it several times a call

    def settle(self, answer: Answer | None = None, lost: ChannelClosedError | None = None) -> None:
        self.answer, self.lost, self.done = answer, lost, True

    @staticmethod
    def values(replies: list[Reply]) -> list | None:
        """The answers' values when every reply is done with a value; None when one is not done, lost or an error."""
        out = []
        for r in replies:   # a loop, not all() over a generator: the driver pays every Python call cold (issue 34)
            if not r.done or r.lost is not None or r.answer.error is not None:
                return None
            out.append(r.answer.value)
        return out


class Channel:
    """The driver's end of one actor's connection: :meth:`call` sends a request at once and returns
    its :class:`Reply`; :meth:`read_available` settles the oldest unanswered replies (:func:`wait` calls it)."""

    def __init__(self, sock: socket.socket, address: tuple[str, int]) -> None:
        self.sock = sock
        self.fd = sock.fileno()   # kept: a closed channel's replies are all settled, so nothing waits on it
        self.address = address
        self.pending: collections.deque[Reply] = collections.deque()
        self.reader = FrameReader()
        self.lost: ChannelClosedError | None = None

    @classmethod
    def connect(cls, address: tuple[str, int], token: bytes, timeout: float) -> Channel:
        sock, where = _tuned_socket(*address)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(token)
            sock.settimeout(STALL_S)
        except BaseException:
            sock.close()
            raise
        return cls(sock, address)

    def call(self, method: str, *args: Any) -> Reply:
        return self.send_frame(encode(Request(method, args)))

    def send_frame(self, parts: Iterable[Any], target: ReadTarget | None = None) -> Reply:
        """Send a request already framed (:func:`encode`'s parts, or a :class:`~.step_frames.StepFrames` frame) at
        once; its :class:`Reply`.  ``target``: where the answer's observations may be read
        (:class:`~._inbox.ReadTarget`)."""
        reply = self.sent(target)
        if self.lost is None:
            try:
                send_parts(self.sock, parts)
            except OSError as exc:
                self._lose(exc)
        else:
            self._lose(self.lost)
        return reply

    def sent(self, target: ReadTarget | None = None) -> Reply:
        """The :class:`Reply` to a request its caller has written (or is about to write) on this connection's
        descriptor itself (:class:`~._step_io.StepIO`): answered in order after the replies pending before it."""
        reply = Reply(self, target)
        self.pending.append(reply)
        return reply

    def read_available(self) -> None:
        """Read what has arrived (the caller saw the socket readable); each whole answer settles the oldest
        pending reply, in order."""
        self.settle(*self.reader.read_available(self.sock, [r.target for r in self.pending]))

    def settle(self, answers: list, ended: BaseException | None) -> None:
        """Settle the oldest pending replies with ``answers`` read off this connection, in order; then, when the
        connection ``ended``, every other one."""
        for answer in answers:
            if self.pending:
                self.pending.popleft().settle(answer=answer)
        if ended is not None:
            self._lose(ended)

    def _lose(self, exc: BaseException) -> None:
        if self.lost is None:
            if isinstance(exc, ChannelProtocolError):   # nothing more can be read: the actor is told at once
                try:   # shutdown, not close: the descriptor stays this channel's until close()
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            host, port = self.address
            self.lost = ChannelClosedError(f"its connection ({host}:{port}) ended: {str(exc) or type(exc).__name__}")
            self.lost.__cause__ = exc if exc is not self.lost else None
        while self.pending:
            self.pending.popleft().settle(lost=self.lost)

    def close(self) -> None:
        self.sock.close()
        self._lose(ChannelClosedError("closed by this side"))


def wait(replies: list[Reply], num_returns: int, timeout: float) -> list[Reply]:
    """The replies of ``replies`` that are done, once ``num_returns`` of them are or ``timeout`` s passed
    (``timeout=0``: those done now, after reading what has already arrived)."""
    deadline = time.monotonic() + timeout
    while True:
        done = [r for r in replies if r.done]
        if len(done) >= num_returns:
            return done
        left_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
        by_fd = {r.channel.fd: r.channel for r in replies if not r.done}
        ready = readable(list(by_fd), left_ms)
        for fd in ready:
            by_fd[fd].read_available()
        if not ready and left_ms == 0:
            return done
