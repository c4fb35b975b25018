"""The frames of a RayPool's direct connections: one format, one send path (:func:`send_parts` of
:func:`encode`'s parts), one read path (:class:`FrameReader`).  Ray-free.

A frame is a :data:`HEADER` (pickle bytes, buffer count, body bytes, first buffer's bytes) and a body: each
out-of-band buffer's size (``<u8``), the message's pickle (protocol 5), then the buffers, each at a multiple of
:data:`ALIGN` in the body (zero bytes between).  A message is pickled with ``buffer_callback``, so numpy arrays (and
anything else that gives a ``PickleBuffer``) leave their bytes out of the pickle: they are sent from where they lie
(an actor's shared region) by one ``sendmsg``, and received into one fresh block per frame whose views the unpickled
arrays become (writable, aligned, owned by nobody else).  A reader may be handed a target for a frame's first buffer:
when that buffer is exactly the target's size (the header says so) its bytes are read straight into the target (a
step answer's observations into the driver's batch: :class:`~.batches.StepOutput`), in the same read as the rest of
the body.  Whatever plain pickle refuses (a lambda in an info dict) is pickled by cloudpickle, which Ray would use
too.
"""
from __future__ import annotations

import copyreg
import functools
import io
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
    """One whole frame read: its pickle and its out-of-band buffers (views of the frame's own memory, or, for the
    first, the target it was read into)."""

    meta: memoryview
    buffers: list

    def decode(self) -> Any:
        """The message; an error here (a class this process cannot import) concerns this frame alone."""
        return pickle.loads(self.meta, buffers=self.buffers)


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

    A frame is read in two reads, its header and then its whole body (around the target when the first buffer fits
    it); a read that comes up short ends the call, the rest is read when the connection is readable again."""

    def __init__(self) -> None:
        self.header = bytearray(HEADER.size)
        self.whole_header = [memoryview(self.header)]
        self._start()

    def _start(self) -> None:
        self.todo: list[memoryview] = self.whole_header.copy()
        self.body: np.ndarray | None = None   # once the header is read
        self.count = self.meta_len = self.first_len = 0
        self.target: memoryview | None = None

    @property
    def partial(self) -> bool:
        """Whether a frame has started and is not whole yet."""
        return self.body is not None or self.todo[0].nbytes != HEADER.size

    def read(self, fd: int, targets: list | None = None, want: int | None = None
             ) -> tuple[list[Frame], BaseException | None]:
        """The frames completed by what ``fd`` (non-blocking) holds now, and how the connection ended if it did
        (after those frames: a last answer still counts).  ``targets[j]``: where the ``j``-th frame completed by
        this read may put its first buffer (a writable byte memoryview, or None).  ``want``: the frames the caller
        awaits; once that many are read, the read ends without asking the connection for more (one system call
        fewer per answer)."""
        frames: list[Frame] = []
        while True:
            todo = self.todo
            try:
                got = os.readv(fd, todo)
            except (BlockingIOError, InterruptedError):
                return frames, None
            except OSError as exc:
                return frames, exc
            if got == 0:
                return frames, ChannelClosedError("the connection was closed by the other side")
            while todo and got >= todo[0].nbytes:
                got -= todo.pop(0).nbytes
            if todo:   # short: nothing more has come (the caller waits for the connection to be readable again)
                todo[0] = todo[0][got:]
                return frames, None
            try:
                if self.body is None:
                    n = len(frames)
                    frame = self._open(targets[n] if targets is not None and n < len(targets) else None)
                else:
                    frame = self._finish()
            except ChannelProtocolError as exc:
                return frames, exc
            if frame is not None:
                frames.append(frame)
                if len(frames) == want:
                    return frames, None

    def _open(self, target: memoryview | None) -> Frame | None:
        """The header is whole: the body's reads (into ``target`` when the first buffer is its size), or the frame
        when the body is empty."""
        self.meta_len, self.count, body_len, self.first_len = HEADER.unpack(self.header)
        check_header(self.meta_len, self.count, body_len, self.first_len)
        self.body = body = np.empty(body_len, np.uint8)
        if target is not None and self.count and self.first_len == target.nbytes:
            first = SIZE.size * self.count + self.meta_len
            first += -first % ALIGN
            self.target = target
            view = memoryview(body)
            self.todo = [view[:first], target] if first + self.first_len == body_len else \
                [view[:first], target, view[first + self.first_len:]]
        elif body_len:
            self.todo = [memoryview(body)]
        else:
            return self._finish()
        return None

    def _finish(self) -> Frame:
        """The body is whole: the frame (:class:`ChannelProtocolError` when its buffers do not add up to it)."""
        body = memoryview(self.body)
        count = self.count
        at = SIZE.size * count
        meta = body[at:at + self.meta_len]
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
        if self.target is not None:
            buffers[0] = self.target
        frame = Frame(meta, buffers)
        self._start()
        return frame


@functools.lru_cache(maxsize=64)
def sizes_of(count: int) -> struct.Struct:
    """The layout of a frame's ``count`` buffer sizes."""
    return struct.Struct(f"<{count}Q")
