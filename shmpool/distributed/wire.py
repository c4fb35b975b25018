"""The frames of a RayPool's direct connections: one format, one send path (:func:`send_parts` of
:func:`encode`'s parts), one read path (:class:`FrameReader`).  Ray-free.

A frame is a :data:`HEADER` (pickle bytes, buffer count, body bytes, first buffer's bytes) and a body: each
out-of-band buffer's size (``<u8``), the message's pickle (protocol 5), then the buffers, each at a multiple of
:data:`ALIGN` in the body (zero bytes between).  A message is pickled with ``buffer_callback``, so numpy arrays (and
anything else that gives a ``PickleBuffer``) leave their bytes out of the pickle: they are sent from where they lie
(an actor's shared region) by one ``sendmsg``, and received into one fresh block per frame whose views the unpickled
arrays become (writable, aligned, owned by nobody else).

A reader may be handed a :class:`Landing` for the last frame it awaits: the layout of a frame read before
(:class:`FrameShape`: its header, buffer sizes and pickle) and a place for each of its buffers (a step answer's rows
in the driver's next batch: :class:`~.batches.StepOutput`).  Header and body are then read in one read, each buffer
straight into its place; when the header, buffer sizes and pickle are that frame's (byte comparisons) the message is
known without unpickling (the landing's ``message``); otherwise the bytes read are put back together as the frame's
body and decoded as any other.  Whatever plain pickle refuses (a lambda in an info
dict) is pickled by cloudpickle, which Ray would use too.
"""
from __future__ import annotations

import copyreg
import functools
import io
import itertools
import os
import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

# pickle bytes, buffer count, body bytes (buffer sizes, pickle, aligned buffers), the first buffer's bytes (0: none)
HEADER = struct.Struct("<IIQQ")
SIZE = struct.Struct("<Q")
ALIGN = 16            # each buffer's offset in a body: numpy's widest usual alignment
MAX_BODY = 2**30      # a header announcing more is no frame of ours: the connection is dropped
IOV_MAX = 512         # parts per sendmsg (Linux allows 1024)


class ChannelClosedError(ConnectionError):
    """The connection to an actor ended: its process exited or was killed, or its node went away."""


class ChannelProtocolError(ChannelClosedError):
    """What came on a connection is no frame (a header announcing an impossible length): the stream cannot be
    read on, so the connection is dropped."""


def _padded(n: int) -> int:
    return -n % ALIGN


def reduce_array(a: np.ndarray) -> tuple:
    """How a frame pickles an array: a contiguous one of a numeric dtype as ``np.ndarray(shape, dtype string,
    buffer)`` with its buffer out of band, so the other end builds it over the frame's memory in one call; any
    other as numpy pickles it.  Numpy's own reduction names the dtype as an object and rebuilds through a Python
    wrapper: 1.5x the pickle's cost both ways for a step's answer of a dozen small arrays.

    A numeric dtype's string names it fully (byte order included) unless metadata is attached.  ``isbuiltin`` is no
    test of that: a dtype that was unpickled (an action space's, come from an actor) is a fresh instance with
    ``isbuiltin == 0``, and every action took numpy's slower reduction, in band."""
    dtype = a.dtype
    if dtype.kind in NUMERIC and dtype.metadata is None and a.flags.c_contiguous and type(a) is np.ndarray:
        return np.ndarray, (a.shape, dtype.str, pickle.PickleBuffer(a))
    return a.__reduce_ex__(5)


NUMERIC = frozenset("biufc")   # bool, integers, floats, complex: what a dtype string names fully
DISPATCH = {**copyreg.dispatch_table, np.ndarray: reduce_array}


def _pickled(message: Any, buffers: list) -> bytes:
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
    pickler.dispatch_table = DISPATCH
    pickler.dump(message)
    return out.getvalue()


def encode(message: Any) -> list:
    """``message``'s frame as parts (1-D byte buffers): header, buffer sizes and pickle in one part, then each
    out-of-band buffer as it lies in memory (a pad of zero bytes before it where it needs one).

    ValueError when the frame would be longer than :data:`MAX_BODY` (the other end would drop the connection)."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        meta = _pickled(message, buffers)
    except Exception:   # what plain pickle refuses (a local class, a lambda), cloudpickle takes, as Ray would
        buffers = []
        meta = cloudpickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    count = len(buffers)
    body = count * SIZE.size + len(meta)
    parts: list = [None]
    sizes = []
    for buffer in buffers:
        view = buffer.raw()
        pad = -body % ALIGN
        if pad:
            parts.append(ZEROS[:pad])
        parts.append(view)
        sizes.append(view.nbytes)
        body += pad + view.nbytes
    if body > MAX_BODY:
        raise ValueError(f"a message of {body} bytes is more than one frame carries ({MAX_BODY} bytes)")
    parts[0] = b"".join((HEADER.pack(len(meta), count, body, sizes[0] if count else 0),
                         struct.pack(f"<{count}Q", *sizes), meta))
    return parts


ZEROS = bytes(ALIGN)


def send_parts(sock: socket.socket, parts: list) -> None:
    """Send every byte of ``parts`` (flat byte buffers: bytes, or byte memoryviews as :func:`encode` makes them) in
    order, waiting as ``sock``'s timeout says (a stalled peer: ``TimeoutError``)."""
    sent = 0
    if len(parts) <= IOV_MAX:   # the common case: one call
        sent = sock.sendmsg(parts)
        if sent == sum(map(len, parts)):
            return
    left = list(parts)
    while True:   # a partial send: the parts sent are dropped, the one it stopped in is cut, the rest follows
        while left and sent >= len(left[0]):
            sent -= len(left.pop(0))
        if not left:
            return
        if sent:
            left[0] = memoryview(left[0]).cast("B")[sent:]
        sent = sock.sendmsg(left[:IOV_MAX])


@dataclass(slots=True)
class Frame:
    """One whole frame read: its pickle and its out-of-band buffers (views of the frame's own memory, or the places
    its :class:`Landing` gave them), its header and its head (buffer sizes and pickle; None when it landed)."""

    meta: memoryview | None
    buffers: list
    header: bytes = b""
    head: memoryview | None = None
    landing: Landing | None = None

    def decode(self) -> Any:
        """The message; an error here (a class this process cannot import) concerns this frame alone."""
        if self.landing is not None:   # the same layout as the frame it was aimed by: nothing to unpickle
            return self.landing.message
        return pickle.loads(self.meta, buffers=self.buffers)

    def shape(self) -> FrameShape:
        """This frame's layout, to aim a later frame by."""
        return self.landing.shape if self.landing is not None else FrameShape(self.header, bytes(self.head))


class FrameShape:
    """The layout of a frame read: its header and head (buffer sizes and pickle) bytes, where each buffer lies in its
    body, and scratch places for the head and the pads of a later frame read by it (:class:`Landing`)."""

    __slots__ = ("header", "head", "sizes", "offsets", "body_len", "scratch", "lead", "gaps")

    def __init__(self, header: bytes, head: bytes) -> None:
        _, count, self.body_len, _ = HEADER.unpack(header)
        self.header, self.head = header, head
        self.sizes = sizes_of(count).unpack_from(head)
        self.offsets = []
        ends = [len(head)]
        for n in self.sizes:
            self.offsets.append(ends[-1] + -ends[-1] % ALIGN)
            ends.append(self.offsets[-1] + n)
        self.scratch = bytearray(len(head))
        # The pads (zero bytes) before each buffer and after the last are read to bytes of their own (never looked at
        # unless a frame of another layout is put back together from what was read)
        gaps = [start - end for start, end in zip(self.offsets + [self.body_len], ends)]
        pads = memoryview(bytearray(sum(gaps)))
        cut = list(itertools.accumulate(gaps, initial=0))
        views = [pads[a:b] for a, b in zip(cut, cut[1:])]
        self.lead = [memoryview(self.scratch), views[0]]   # the head, the pad before the first buffer
        self.gaps = views[1:]                              # the pad after each buffer (most empty)


class Landing:
    """Where a frame of ``shape``'s layout is read: its ``j``-th buffer into ``buffers[j]`` (writable byte
    memoryviews of those sizes); ``message``: what the frame is then (its caller built it over those places)."""

    __slots__ = ("shape", "buffers", "message", "pieces")

    def __init__(self, shape: FrameShape, buffers: list, message: Any) -> None:
        self.shape, self.buffers, self.message = shape, buffers, message
        pieces: list = [None] * (2 * len(buffers))
        pieces[0::2] = buffers
        pieces[1::2] = shape.gaps
        self.pieces = shape.lead + pieces   # in body order (empty pads among them: readv skips them)


def malformed(detail: str) -> ChannelProtocolError:
    return ChannelProtocolError(f"what came is no frame: {detail}; the connection was dropped")


def check_header(meta_len: int, count: int, body_len: int, first_len: int) -> None:
    """:class:`ChannelProtocolError` for a header no frame has: more than :data:`MAX_BODY` bytes, fewer than its own
    buffer sizes and pickle take, or a first buffer that does not fit after them (or without any buffer)."""
    head = SIZE.size * count + meta_len
    if body_len > MAX_BODY or head > body_len:
        raise malformed(f"a frame header announcing {body_len} bytes (at most {MAX_BODY}) for {count} arrays and a "
                        f"pickle of {meta_len} bytes")
    if first_len and (not count or head + _padded(head) + first_len > body_len):
        raise malformed(f"a frame header announcing a first array of {first_len} bytes in a body of {body_len} "
                        f"bytes for {count} arrays and a pickle of {meta_len} bytes")


class FrameReader:
    """Frames put together from whatever a connection holds, never waiting for more: a peer that stops half-way
    through a frame cannot hold the reader (its caller bounds the wait).  Both ends read with it.

    A frame is read in two reads, its header and then its whole body; a frame with a :class:`Landing` in one, its
    header and body straight into the places the landing's layout gives them, as a guess that is checked once the
    header is in (only the last frame the caller awaits is read so: nothing follows it, so no read takes a byte of
    the next frame).  A read that comes up short ends the call, the rest is read when the connection is readable
    again."""

    def __init__(self) -> None:
        self.header = bytearray(HEADER.size)
        self.whole_header = [memoryview(self.header)]
        self._start()

    def _start(self) -> None:
        self.todo: list[memoryview] = self.whole_header   # copied before a short read changes it
        self.left = HEADER.size                            # the bytes ``todo`` takes
        self.body: np.ndarray | None = None   # once the header is read (and the frame does not land)
        self.guess: Landing | None = None     # read by its landing's layout, its header not checked yet
        self.landing: Landing | None = None   # read by its landing's layout, its header checked
        self.count = self.meta_len = self.first_len = 0

    @property
    def partial(self) -> bool:
        """Whether a frame has started and is not whole yet."""
        return self.body is not None or self.landing is not None or self.left != self._expected()

    def _expected(self) -> int:
        return HEADER.size + (self.guess.shape.body_len if self.guess is not None else 0)

    def read(self, fd: int, landings: list | None = None, want: int | None = None
             ) -> tuple[list[Frame], BaseException | None]:
        """The frames completed by what ``fd`` (non-blocking) holds now, and how the connection ended if it did
        (after those frames: a last answer still counts).  ``want``: the frames the caller awaits; once that many
        are read, the read ends without asking the connection for more (one system call fewer per answer).
        ``landings[want - 1]``: where the last of them may land (a :class:`Landing`, or None)."""
        frames: list[Frame] = []
        while True:
            if (want is not None and len(frames) == want - 1 and landings is not None and len(landings) >= want
                    and self.todo is self.whole_header and self.guess is None):   # the last frame awaited, unstarted
                self._aim(landings[want - 1])
            todo = self.todo
            try:
                got = os.readv(fd, todo)
            except (BlockingIOError, InterruptedError):
                return frames, None
            except OSError as exc:
                return frames, exc
            if got == 0:
                return frames, ChannelClosedError("the connection was closed by the other side")
            try:
                if got < self.left:   # short: nothing more has come (the caller waits for it to be readable again)
                    self.left -= got
                    self.todo = todo = todo.copy()
                    while got >= todo[0].nbytes:
                        got -= todo.pop(0).nbytes
                    todo[0] = todo[0][got:]
                    frame = None
                    if self.guess is not None and self.left <= self.guess.shape.body_len:   # the header is in
                        frame = self._check_guess()
                    if frame is None:
                        return frames, None
                elif self.guess is not None:
                    self.left = 0
                    frame = self._check_guess()
                elif self.landing is not None:
                    frame = self._land()
                elif self.body is None:
                    frame = self._open()
                else:
                    frame = self._finish()
            except ChannelProtocolError as exc:
                return frames, exc
            if frame is not None:
                frames.append(frame)
                if len(frames) == want:
                    return frames, None

    def _aim(self, landing: Landing | None) -> None:
        """Read the next frame by ``landing``'s layout, header and body in one read."""
        if landing is not None and len(landing.pieces) < IOV_MAX:
            self.guess = landing
            self.todo = [self.whole_header[0], *landing.pieces]
            self.left = HEADER.size + landing.shape.body_len

    def _check_guess(self) -> Frame | None:
        """The header of a frame read by its landing's layout is in (and ``left`` bytes of that layout are not): on
        as the landing when the header is its layout's, else as any frame, the bytes read past the header (all this
        frame's: nothing follows it) moved into its body.  The frame when it is whole."""
        landing, self.guess = self.guess, None
        shape = landing.shape
        self.meta_len, self.count, body_len, self.first_len = HEADER.unpack(self.header)
        check_header(self.meta_len, self.count, body_len, self.first_len)
        if self.header == shape.header:
            self.landing = landing
            return None if self.left else self._land()
        extra = shape.body_len - self.left   # body bytes read into the layout's places
        if extra > body_len:
            raise malformed(f"{extra} bytes after a frame header announcing {body_len}, before any other call was "
                            "answered")
        self.body = body = np.empty(body_len, np.uint8)
        whole = memoryview(body)
        at = 0
        for piece in landing.pieces:
            if at == extra:
                break
            n = min(piece.nbytes, extra - at)
            whole[at:at + n] = piece[:n]
            at += n
        if extra == body_len:
            return self._finish()
        self.todo, self.left = [whole[extra:]], body_len - extra
        return None

    def _open(self) -> Frame | None:
        """The header is whole: the body's read, or the frame when the body is empty."""
        self.meta_len, self.count, body_len, self.first_len = HEADER.unpack(self.header)
        check_header(self.meta_len, self.count, body_len, self.first_len)
        self.body = body = np.empty(body_len, np.uint8)
        if not body_len:
            return self._finish()
        self.todo, self.left = [memoryview(body)], body_len
        return None

    def _land(self) -> Frame:
        """The body of a landing frame is whole: the landed frame when its head is the layout's, else the body put
        back together from the pieces read, as any frame."""
        landing = self.landing
        shape = landing.shape
        if shape.scratch == shape.head:
            frame = Frame(None, landing.buffers, shape.header, None, landing)
            self._start()
            return frame
        self.landing = None
        self.body = body = np.empty(shape.body_len, np.uint8)
        whole = memoryview(body)
        at = 0
        for piece in landing.pieces:
            whole[at:at + piece.nbytes] = piece
            at += piece.nbytes
        return self._finish()

    def _finish(self) -> Frame:
        """The body is whole: the frame (:class:`ChannelProtocolError` when its buffers do not add up to it)."""
        body = memoryview(self.body)
        count = self.count
        at = SIZE.size * count
        meta = body[at:at + self.meta_len]
        head = body[:at + self.meta_len]
        at += self.meta_len
        buffers = []
        for n in sizes_of(count).unpack_from(body):
            at += -at % ALIGN
            buffers.append(body[at:at + n])
            at += n
        if at != len(body):
            raise malformed(f"a frame of {len(body)} bytes whose buffers end at byte {at}")
        if count and len(buffers[0]) != self.first_len:
            raise malformed(f"a first array of {len(buffers[0])} bytes announced as {self.first_len} bytes")
        frame = Frame(meta, buffers, bytes(self.header), head)
        self._start()
        return frame


@functools.lru_cache(maxsize=64)
def sizes_of(count: int) -> struct.Struct:
    """The layout of a frame's ``count`` buffer sizes."""
    return struct.Struct(f"<{count}Q")
