"""A direct connection between a RayPool's driver and one of its actors, for the calls of every step.

An ordinary Ray actor call goes through Ray's scheduler and object store: on a 2-core machine ~2.7 ms
empty and ~7.7 ms with 8 Pong observations (issue 34).  So the pool calls (``reset``, ``step``,
``send``/``recv``, the per-env calls) take a plain TCP connection instead; Ray still places, describes,
restarts and kills the actors, and carries the calls of a pool it cannot be reached directly.

Each actor listens on one port of its node's address (the one Ray itself uses) and serves one driver,
which must first present the RayPool's random token.  Calls and answers are named messages
(:class:`Request`, :class:`Answer`) in :mod:`.wire`'s frames (pickle protocol 5, arrays as out-of-band
buffers); calls on one connection are answered in order, one at a time, by the actor's serving thread, which
calls the actor's handlers (the local Pool's own calls).  Nothing here needs Ray.

What the token protects, and what it does not: it is a random secret (:data:`TOKEN_BYTES` bytes) that Ray
carries to the actor in its constructor's arguments, and the actor serves only the connection that presents
it, so other users and processes that can reach the port (on the node or the network) cannot drive the pool.
Nothing more: there is no TLS, no encryption and no integrity check, and the token crosses in clear, so a peer
that can read or alter the traffic can read the observations and actions, replay the token or change the
bytes.  It sits inside Ray's trust boundary (whoever reaches the cluster's Ray can read the token and run any
code on the nodes anyway): a RayPool belongs on a network trusted as Ray itself is.  Callers are let in by one
poll, each with :data:`AUTH_S` for its whole token; a frame header no frame can have (:data:`~.wire.MAX_BODY`)
drops its connection (:class:`~.wire.ChannelProtocolError`).
"""
from __future__ import annotations

import collections
import hmac
import math
import pickle
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .wire import (
    NUMERIC,
    ChannelClosedError,
    ChannelProtocolError,
    Frame,
    FrameReader,
    FrameShape,
    Landing,
    encode,
    send_parts,
)

__all__ = ["AUTH_S", "Answer", "Channel", "ChannelClosedError", "ChannelProtocolError", "ChannelServer", "Reply",
           "Request", "Route", "TOKEN_BYTES", "wait"]

TOKEN_BYTES = 16
STALL_S = 60.0        # a frame (or a send) that stops half-way for this long: the connection is treated as lost
AUTH_S = 5.0          # a caller that has not sent its whole token by then is hung up on (the driver sends it at once)
KNOCKING = 64         # callers awaiting their token's end at once; past it, room is made (ChannelServer._make_room)
ACCEPT_POLL_S = 1.0   # with no caller knocking, how often the accepting thread looks whether the server closed
# Socket buffers big enough for a whole answer: with the defaults a 221 KiB answer crossed in many
# wake-ups, a round trip of 919 µs on loopback here against 489 µs with these (the kernel caps them
# at net.core.{r,w}mem_max).
BUFFER_BYTES = 4 * 2**20


def tuned_socket(host: str, port: int, make: Callable[..., socket.socket] = socket.socket
                 ) -> tuple[socket.socket, Any]:
    """A TCP socket for ``host`` (made by ``make(family, type, proto)``) and its address to bind or connect; its
    buffers are set before either, so the window is negotiated with them."""
    family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = make(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER_BYTES)
    return sock, where


@dataclass(frozen=True)
class Route:
    """Where a RayPool's direct connections run when not on each node's own address with plain sockets (a harness's
    link: the bench runs them across two network namespaces).  Each actor listens on ``host`` with a socket made by
    ``listen_socket``, the driver connects with one made by ``connect_socket`` (both ``socket.socket``'s signature,
    and picklable: the actor's travels to it with its constructor's arguments)."""

    host: str
    listen_socket: Callable[..., socket.socket] = socket.socket
    connect_socket: Callable[..., socket.socket] = socket.socket


@dataclass(frozen=True)
class Request:
    """Driver to actor: call ``method(*args)`` on the actor's pool."""

    method: str
    args: tuple

    def __reduce__(self) -> tuple:   # rebuilt by one call, not pickle's generic object path (the driver's every call)
        return Request, (self.method, self.args)


@dataclass(frozen=True)
class Answer:
    """Actor to driver: what the call returned, or the exception it raised (``failed``)."""

    value: Any = None
    error: BaseException | None = None

    def __reduce__(self) -> tuple:   # as Request's
        return Answer, (self.value, self.error)

    @property
    def failed(self) -> bool:
        return self.error is not None


REQUEST_HEADS = 64   # layouts of calls kept (a pool's calls use a handful)
_request_heads: dict[tuple, tuple[list, list[int]]] = {}


def request_parts(method: str, args: tuple) -> list:
    """``encode(Request(method, args))``.  A call whose arguments are all plain arrays (a step's actions) has a frame
    whose bytes other than the arrays' own (header, buffer sizes, pickle, pads) depend only on the method and the
    arrays' shapes and dtypes: those are kept from the first such call and the arrays' bytes put among them, no
    pickling (tens of microseconds a call on the driver's every step)."""
    key = [method]
    for a in args:
        if type(a) is not np.ndarray or a.dtype.metadata is not None:
            return encode(Request(method, args))
        key.append((a.shape, a.strides, a.dtype.str))   # strides: C order or not, without asking numpy's flags
    known = _request_heads.get(key := tuple(key))
    if known is None:
        parts = encode(Request(method, args))
        if not all(a.dtype.kind in NUMERIC and a.flags.c_contiguous for a in args):
            return parts
        at = [i for i, part in enumerate(parts) if type(part) is memoryview]   # the arrays' (pads are bytes)
        if len(at) == len(args):
            if len(_request_heads) >= REQUEST_HEADS:
                _request_heads.clear()
            _request_heads[key] = [part if type(part) is bytes else None for part in parts], at
        return parts
    template, at = known
    parts = template.copy()
    for i, a in zip(at, args):
        parts[i] = pickle.PickleBuffer(a).raw()
    return parts


def portable_answer(exc: BaseException) -> list:
    """The frame of a failed call; an exception that does not pickle is sent as its type and text."""
    try:
        return encode(Answer(error=exc))
    except Exception:
        return encode(Answer(error=RuntimeError(f"{type(exc).__name__}: {exc}"[:2000])))


def next_frames(fd: int, reader: FrameReader, ready: select.poll) -> list[Frame]:
    """The whole frames ``fd`` holds, at least one: the wait for a frame to start is unbounded (the driver may pause
    between calls as long as it likes), each wait for the rest of one is bounded by :data:`STALL_S`
    (then :class:`~.wire.ChannelClosedError`)."""
    while True:
        if not ready.poll(STALL_S * 1000 if reader.partial else None):
            raise ChannelClosedError(f"a frame stopped half-way for {STALL_S} s")
        frames, ended = reader.read(fd)
        if frames:
            return frames   # an end or error after them is met by the next read
        if ended is not None:
            raise ended


class Knock:
    """A caller accepted and not yet let in: the token bytes it has sent, and when it is hung up on."""

    __slots__ = ("conn", "got", "deadline", "heard")

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn = conn
        self.got = bytearray()
        self.deadline = deadline
        self.heard = False   # its whole token was read (while making room): it is let in next


class ChannelServer:
    """The actor's end: listens on ``host`` (port chosen by the OS), accepts the driver that presents
    ``token`` and answers its :class:`Request` frames in one thread: ``handlers[method](*args)``.  A method
    ``handlers`` lacks is answered with a ValueError.  ``make_socket(family, type, proto)``: where its listening
    socket is made (:class:`Route`).

    Callers are let in one poll for all: each has AUTH_S for its whole token, and a silent or trickling one
    never delays another (read one after the other, two silent local peers queued before the driver held its
    first call 2 x AUTH_S, past a ``step_timeout``).  Once the driver that was let in hangs up, nobody else is;
    one whose stream breaks (:class:`ChannelProtocolError`) is dropped and the server accepts again."""

    def __init__(self, host: str, token: bytes, handlers: Mapping[str, Callable[..., Any]],
                 make_socket: Callable[..., socket.socket] = socket.socket) -> None:
        self.token = token
        self.handlers = dict(handlers)
        self.closed = False
        self.listener, where = tuned_socket(host, 0, make_socket)
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
                        heard = next((fd for fd, k in knocking.items() if k.heard), None)
                        if heard is not None:
                            polled.unregister(heard)
                            return knocking.pop(heard).conn
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
        """Accept every caller waiting, or until one is heard making room (:meth:`_make_room`); False once the
        listener is closed."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:   # closed
                return False
            conn.setblocking(False)
            heard = len(knocking) >= KNOCKING and not self._make_room(knocking, polled)
            knocking[conn.fileno()] = Knock(conn, time.monotonic() + AUTH_S)
            polled.register(conn.fileno(), select.POLLIN)
            if heard:
                return True   # a caller has presented the token: it is let in, the rest wait in the backlog

    def _make_room(self, knocking: dict[int, Knock], polled: select.poll) -> bool:
        """Room for one more caller: what every knocking caller has sent is read first, so one whose token is
        already here is let in (False: it is ``heard``) rather than pushed out; otherwise the oldest of those that
        sent the fewest bytes is hung up on (a driver's token split in two keeps its place against silent callers).
        (Made room for unread, the oldest was the driver under 104 silent local connections: issue 69.)"""
        for fd in list(knocking):
            if fd in knocking and self._hears(knocking, polled, fd):
                knocking[fd].heard = True
                return False
        if len(knocking) >= KNOCKING:
            self._hang_up(knocking, polled, min(knocking, key=lambda fd: len(knocking[fd].got)))
        return True

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
        ready = select.poll()
        ready.register(conn.fileno(), select.POLLIN)
        reader = FrameReader()
        frames: collections.deque[Frame] = collections.deque()   # requests read and not answered yet, in order
        while True:
            if not frames:
                try:
                    frames.extend(next_frames(conn.fileno(), reader, ready))
                except ChannelProtocolError:
                    return True
                except OSError:
                    return False
            try:   # a request this process cannot unpickle (a driver-only class) is that call's error
                request = frames.popleft().decode()
                if not isinstance(request, Request):
                    raise ValueError(f"{request!r} is not a call this actor serves")
                handler = self.handlers.get(request.method)
                if handler is None:
                    raise ValueError(f"{request.method!r} is not a call this actor serves")
                parts = encode(Answer(value=handler(*request.args)))
            except Exception as exc:
                parts = portable_answer(exc)
            try:
                send_parts(conn, parts)
            except OSError:
                return False

    def close(self) -> None:
        self.closed = True
        self.listener.close()


class Reply:
    """A call's answer to come: ``done`` once it is read; then ``answer`` (an :class:`Answer`) and the ``frame`` it
    came in or, when the connection ended first, ``lost`` (a :class:`ChannelClosedError`).  Settled once, by its
    channel.  ``target``: where its frame may land (:meth:`aim`; :class:`~.wire.Landing`)."""

    __slots__ = ("channel", "target", "answer", "frame", "lost", "done")

    def __init__(self, channel: Channel | None) -> None:
        self.channel = channel
        self.target: Landing | None = None
        self.answer: Answer | None = None
        self.frame: Frame | None = None
        self.lost: ChannelClosedError | None = None
        self.done = False

    def aim(self, shape: FrameShape, buffers: list, value: Any) -> None:
        """Let the answer land (until it is read): when its frame has ``shape``'s layout, its buffers are read into
        ``buffers`` (writable byte memoryviews) and its answer is ``value``, which the caller built over them."""
        self.target = Landing(shape, buffers, Answer(value))

    def landed(self) -> Any:
        """The value the answer was read into (:meth:`aim`), or None when it was not."""
        frame = self.frame
        return None if frame is None or frame.landing is None else frame.landing.message.value

    def settle(self, answer: Answer | None = None, lost: ChannelClosedError | None = None,
               frame: Frame | None = None) -> None:
        self.answer, self.lost, self.frame, self.done = answer, lost, frame, True


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
    def connect(cls, address: tuple[str, int], token: bytes, timeout: float,
                make_socket: Callable[..., socket.socket] = socket.socket) -> Channel:
        """Connect to an actor's server at ``address`` and present ``token``; ``make_socket`` as
        :class:`ChannelServer` takes it."""
        sock, where = tuned_socket(*address, make=make_socket)
        try:
            sock.settimeout(timeout)
            sock.connect(where)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(token)
            sock.settimeout(STALL_S)   # non-blocking underneath: the reader never waits, a send waits this long
        except BaseException:
            sock.close()
            raise
        return cls(sock, address)

    def call(self, method: str, *args: Any) -> Reply:
        """Send ``Request(method, args)`` at once; its :class:`Reply`."""
        reply = Reply(self)
        self.pending.append(reply)
        if self.lost is None:
            try:
                send_parts(self.sock, request_parts(method, args))
            except OSError as exc:
                self._lose(exc)
        else:
            self._lose(self.lost)
        return reply

    def read_available(self) -> None:
        """Read what has arrived (the caller saw the socket readable); each whole answer settles the oldest
        pending reply, in order; an answer that does not decode (a node-only class) is that call's error."""
        pending = self.pending
        frames, ended = self.reader.read(self.fd, [r.target for r in pending], len(pending) or None)
        for frame in frames:
            try:
                answer = frame.decode()
            except Exception as exc:   # the frame was read whole: the stream is fine
                answer = Answer(error=exc)
            if pending:
                pending.popleft().settle(answer, frame=frame)
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
    (``timeout=0``: those done now, after reading what has already arrived).  A signal's handler runs at once
    (Ctrl-C raises here, not at the timeout)."""
    done = [r for r in replies if r.done]
    if len(done) >= num_returns:
        return done
    deadline = time.monotonic() + timeout
    left_ms = math.ceil(timeout * 1000)
    ready = select.poll()   # one for the call: a channel leaves it once nothing more is awaited from it
    polled: dict[int, Channel] = {}
    for r in replies:
        if not r.done and r.channel.fd not in polled:
            polled[r.channel.fd] = r.channel
            ready.register(r.channel.fd, select.POLLIN)
    while True:
        events = ready.poll(left_ms)
        for fd, _ in events:
            channel = polled[fd]
            channel.read_available()
            if not channel.pending:   # all its calls answered (or lost): an ended one would wake every poll
                ready.unregister(fd)
                del polled[fd]
        done = [r for r in replies if r.done]
        if len(done) >= num_returns or (not events and left_ms == 0):
            return done
        left_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000))
