"""The frames of a RayPool's direct connections: one format, one send path (:func:`send_parts` of
:func:`encode`'s parts), one read path (:class:`FrameReader`).  Ray-free.

A frame is a :data:`HEADER` (pickle bytes, buffer count, body bytes) and a body: each out-of-band buffer's size
(``<u8``), the message's pickle (protocol 5), then the buffers, each at a multiple of :data:`ALIGN` in the body
(zero bytes between).  A message is pickled with ``buffer_callback``, so numpy arrays (and anything else that
gives a ``PickleBuffer``) leave their bytes out of the pickle: they are sent from where they lie (an actor's
shared region) by one ``sendmsg``, and received into one fresh block per frame whose views the unpickled arrays
become (writable, aligned, owned by nobody else).  A reader may be handed a target for a frame's first buffer:
when that buffer is exactly the target's size its bytes are read straight into the target (a step answer's
observations into the driver's batch: :class:`~.batches.StepOutput`).  Whatever plain pickle refuses (a lambda in
an info dict) is pickled by cloudpickle, which Ray would use too.
"""
from __future__ import annotations

import copyreg
import io
import os
import pickle
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np

HEADER = struct.Struct("<IIQ")   # pickle bytes, buffer count, body bytes (buffer sizes, pickle, aligned buffers)
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


def array_from(buffer: Any, dtype: str, shape: tuple) -> np.ndarray:
    """An array of ``dtype`` and ``shape`` over ``buffer`` (the receiving end of :func:`reduce_array`)."""
    return np.frombuffer(buffer, dtype).reshape(shape)


def reduce_array(a: np.ndarray) -> tuple:
    """How a frame pickles an array: a contiguous one of a native numeric dtype as its buffer (out of band), dtype
    string and shape, read back by :func:`array_from`; any other as numpy pickles it.  Numpy's own reduction names
    the dtype as an object and rebuilds through a Python wrapper: 1.5x the pickle's cost both ways for a step's
    answer of a dozen small arrays."""
    if a.dtype.kind in NUMERIC and a.dtype.isbuiltin == 1 and a.flags.c_contiguous and type(a) is np.ndarray:
        return array_from, (pickle.PickleBuffer(a), a.dtype.str, a.shape)
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
    views = [b.raw() for b in buffers]
    body = len(views) * SIZE.size + len(meta)
    parts: list = []
    for view in views:
        pad = _padded(body)
        if pad:
            parts.append(bytes(pad))
        parts.append(view)
        body += pad + view.nbytes
    if body > MAX_BODY:
        raise ValueError(f"a message of {body} bytes is more than one frame carries ({MAX_BODY} bytes)")
    sizes = b"".join(SIZE.pack(v.nbytes) for v in views)
    return [HEADER.pack(len(meta), len(views), body) + sizes + meta, *parts]


def send_parts(sock: socket.socket, parts: Iterable[Any]) -> None:
    """Send every byte of ``parts`` in order, waiting as ``sock``'s timeout says (a stalled peer: ``TimeoutError``)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


@dataclass(frozen=True)
class Frame:
    """One whole frame read: its pickle and its out-of-band buffers (views of the frame's own memory, or, for the
    first, the target it was read into)."""

    meta: bytes
    buffers: list

    def decode(self) -> Any:
        """The message; an error here (a class this process cannot import) concerns this frame alone."""
        return pickle.loads(self.meta, buffers=self.buffers)


def malformed(detail: str) -> ChannelProtocolError:
    return ChannelProtocolError(f"what came is no frame: {detail}; the connection was dropped")


def check_header(meta_len: int, count: int, body_len: int) -> None:
    """:class:`ChannelProtocolError` for a header no frame has: more than :data:`MAX_BODY` bytes, or fewer than its
    own buffer sizes and pickle take."""
    if body_len > MAX_BODY or SIZE.size * count + meta_len > body_len:
        raise malformed(f"a frame header announcing {body_len} bytes (at most {MAX_BODY}) for {count} arrays and a "
                        f"pickle of {meta_len} bytes")


class FrameReader:
    """Frames put together from whatever a connection holds, never waiting for more: a peer that stops half-way
    through a frame cannot hold the reader (its caller bounds the wait).  Both ends read with it.

    A frame is read in at most three reads: its header; its buffer sizes and pickle (only when a target is given);
    the rest of its body, around the target when the first buffer fits it."""

    def __init__(self) -> None:
        self.header = bytearray(HEADER.size)
        self._start()

    def _start(self) -> None:
        self.stage = "header"
        self.todo: list[memoryview] = [memoryview(self.header)]
        self.body: np.ndarray | None = None
        self.meta_len = self.count = 0
        self.target: memoryview | None = None
        self.offsets: list[tuple[int, int]] | None = None   # each buffer's place and size, once the head is read

    @property
    def partial(self) -> bool:
        """Whether a frame has started and is not whole yet."""
        return self.stage != "header" or self.todo[0].nbytes != HEADER.size

    def read(self, fd: int, targets: list | None = None) -> tuple[list[Frame], BaseException | None]:
        """The frames completed by what ``fd`` (non-blocking) holds now, and how the connection ended if it did
        (after those frames: a last answer still counts).  ``targets[j]``: where the ``j``-th frame completed by
        this read may put its first buffer (a writable byte memoryview, or None)."""
        frames: list[Frame] = []
        while True:
            try:
                got = os.readv(fd, self.todo)
            except (BlockingIOError, InterruptedError):
                return frames, None
            except OSError as exc:
                return frames, exc
            if got == 0:
                return frames, ChannelClosedError("the connection was closed by the other side")
            while got and self.todo:
                step = min(got, self.todo[0].nbytes)
                self.todo[0] = self.todo[0][step:]
                got -= step
                if not self.todo[0].nbytes:
                    self.todo.pop(0)
            if self.todo:
                continue
            try:
                frame = self._advance(targets[len(frames)] if targets and len(frames) < len(targets) else None)
            except ChannelProtocolError as exc:
                return frames, exc
            if frame is not None:
                frames.append(frame)

    def _advance(self, target: memoryview | None) -> Frame | None:
        """The stage after the one just filled; the frame once its body is whole."""
        if self.stage == "header":
            self.meta_len, self.count, body_len = HEADER.unpack(self.header)
            check_header(self.meta_len, self.count, body_len)
            self.body = np.empty(body_len, np.uint8)
            head = SIZE.size * self.count + self.meta_len
            if target is not None and self.count:
                self.stage, self.todo, self.target = "head", [memoryview(self.body)[:head]], target
            else:
                self.stage, self.todo = "body", [memoryview(self.body)]
            return self._advance(None) if not self.body.nbytes else None
        if self.stage == "head":
            self.offsets = offsets = self._offsets()
            body = memoryview(self.body)
            head = SIZE.size * self.count + self.meta_len
            first, size = offsets[0]
            if size == self.target.nbytes:
                self.todo = [body[head:first], self.target, body[first + size:]]
            else:
                self.todo, self.target = [body[head:]], None
            self.todo = [v for v in self.todo if v.nbytes]
            self.stage = "body"
            return None if self.todo else self._advance(None)
        offsets = self._offsets() if self.offsets is None else self.offsets
        body = memoryview(self.body)
        head = SIZE.size * self.count
        buffers = [body[at:at + n] for at, n in offsets]
        if self.target is not None:
            buffers[0] = self.target
        frame = Frame(bytes(body[head:head + self.meta_len]), buffers)
        self._start()
        return frame

    def _offsets(self) -> list[tuple[int, int]]:
        """Where each buffer lies in the body, and its size; :class:`ChannelProtocolError` when they do not add up to
        the body's length."""
        sizes = struct.unpack_from(f"<{self.count}Q", self.body)
        at = SIZE.size * self.count + self.meta_len
        out = []
        for n in sizes:
            at += -at % ALIGN
            out.append((at, n))
            at += n
        if at != self.body.nbytes:
            raise malformed(f"a frame of {self.body.nbytes} bytes whose buffers end at byte {at}")
        return out
