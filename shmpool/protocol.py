"""Every message between the parent and a worker: named types, one encoder and one
decoder per direction, and the codes both sides write into shared memory.

Two paths carry them.  The hot path is shared memory (``shmpool._core``): a command
word per worker (``CMD_*``), request words in a ring (env id, ``REQ_RESET`` flag) and
one status byte per env result (``STATUS_*``).  The side channel is each worker's
pipe, for the rare things: start-up, tracebacks, non-numeric infos, resets with
seeds or options, ``call``/``get_attr``/``set_attr``/``apply`` and closing.  Its
messages are the frozen dataclasses below, pickled (start-up spaces cloudpickled,
since a space may be defined in ``__main__``); nothing reads a message by position.

Every message is plain data, so it always encodes and decodes: what an env or the caller
gives (call arguments, answers, reset options, non-numeric infos) rides inside as a blob of
its own (``pack``/``unpack``), so a value one side cannot rebuild is that env's error, not a
broken channel.  Message commands carry a call number and their answers repeat it, so an
answer left over from an abandoned call is dropped, never taken for the next call's.

Parent to worker: :class:`MapRegion` (then the region's fd), :class:`Abort`,
:class:`Reset`, :class:`Restart`, :class:`EnvCall`, :class:`PickledActions` (actions of leaves that
cannot live in shared memory, sent after their step is dispatched: ``shmpool.pickled``), and
:class:`Continued` before a message too large to wait in the pipe (``send``).
Worker to parent: :class:`Spaces`, :class:`Ready`, :class:`Failure` (an env or the
worker raised; unasked), :class:`CallFailed` (the answer to a message that failed),
:class:`Extra` (non-numeric infos and pickled observation leaves of a published result), :class:`Reply`,
:class:`Closed`.
"""
from __future__ import annotations

import hashlib
import pickle
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle

from ._core import (  # noqa: F401 - re-exported: the one place both sides take them from
    CMD_ASYNC,
    CMD_EXIT,
    CMD_MESSAGE,
    CMD_STEP,
    REQ_ENV_MASK,
    REQ_RESET,
    SCAN_NUMERIC_INFO,
    SCAN_SIDE_MESSAGE,
)

# Per-env status byte the worker writes with each result (``Wire.scan`` reads it too).
STATUS_OK = 0
STATUS_ERROR = 1      # the env raised: a Failure for it is on the side channel
STATUS_EXTRA = 2      # non-numeric infos: an Extra for it is on the side channel

_PICKLE = pickle.HIGHEST_PROTOCOL


class ProtocolError(RuntimeError):
    """A side-channel message of a type its reader does not know (a bug, never an env's fault)."""


# --- parent to worker ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MapRegion:
    """Start-up, second half: map the region whose fd follows on the pipe, then answer Ready."""

    layout: Any                   # shmpool.layout.Layout
    policy: Any                   # the workers' _core.WaitPolicy
    slice_ns: int
    semaphores: list[str] | None  # posix semaphore names when futexes are not used
    autoreset_mode: str
    strict: bool = True           # refuse non-finite rewards and observations that need a cast


@dataclass(frozen=True, slots=True)
class Abort:
    """Start-up failed elsewhere: exit without building anything more."""


@dataclass(frozen=True, slots=True)
class Reset:
    """Call ``call``: reset the worker's envs (local order): one seed each, ``options`` one
    ``pack``ed blob shared by all or a list of one blob each, ``mask`` the envs to reset
    (None: all)."""

    call: int
    seeds: list
    options: bytes | list[bytes]
    mask: list[bool] | None


@dataclass(frozen=True, slots=True)
class Restart:
    """Call ``call``: this worker replaces a dead one: reset unseeded and mark each env's next
    result restarted."""

    call: int


CALL, GET_ATTR, SET_ATTR, APPLY = "call", "get_attr", "set_attr", "apply"


@dataclass(frozen=True, slots=True)
class EnvCall:
    """Call ``call``: ``op`` (CALL, GET_ATTR, SET_ATTR, APPLY) of attribute ``name`` on local
    envs ``envs``, one cloudpickled payload each (see ``pack``): CALL ``(args, kwargs)``,
    SET_ATTR the value, APPLY ``(fn, args, kwargs)``, GET_ATTR None."""

    call: int
    op: str
    name: str
    envs: list[int]
    payloads: list[bytes]


@dataclass(frozen=True, slots=True)
class PickledActions:
    """Actions of the leaves that travel pickled: env ``env_ids[k]`` (global id) gets
    ``values[k]`` (one value per slow leaf) for its step numbered ``versions[k]``
    (the env's version word in shared memory once that step is dispatched)."""

    env_ids: list[int]
    versions: list[int]
    values: list[tuple]


@dataclass(frozen=True, slots=True)
class Continued:
    """The message is the next record on the pipe (``size`` bytes): too large to wait in the pipe's
    buffer, it is written by a thread of the parent while the parent posts its command and waits."""

    size: int


ToWorker = MapRegion | Abort | Reset | Restart | EnvCall | PickledActions


# --- worker to parent ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spaces:
    """Start-up, first half: the envs are built; their spaces and what the pool reports."""

    observation_space: Any
    action_space: Any
    metadata: dict
    render_mode: str | None
    spec: Any
    hosting: dict | None = None   # a batched env's capabilities (shmpool.batched.hosting_info)
    observation_spaces: list | None = None   # each env's, when they differ (in bounds only)


@dataclass(frozen=True, slots=True)
class Ready:
    """Start-up done: the region is mapped and the worker serves commands."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Env ``env_id`` (None: the worker itself) raised in ``phase``.  ``exception`` is the
    exception pickled, or None when it cannot be."""

    env_id: int | None
    phase: str
    remote_type: str
    traceback: str
    exception: bytes | None = None

    @classmethod
    def of(cls, env_id: int | None, phase: str, exc: BaseException) -> Failure:
        """Built inside the ``except`` that caught ``exc``."""
        try:
            blob = pickle.dumps(exc, _PICKLE)
        except Exception:
            blob = None
        return cls(env_id, phase, type(exc).__name__, "".join(traceback.format_exception(exc)), blob)

    @property
    def last_line(self) -> str:
        """The traceback's last line (``ValueError: bad``), or the type name."""
        lines = self.traceback.strip().splitlines()
        return lines[-1] if lines else self.remote_type

    def original(self) -> BaseException | None:
        """The env's own exception, when its class can be rebuilt here."""
        if self.exception is None:
            return None
        try:
            exc = pickle.loads(self.exception)
        except Exception:
            return None
        return exc if isinstance(exc, BaseException) else None


@dataclass(frozen=True, slots=True)
class CallFailed(Failure):
    """The answer to message command ``call`` (Reset, Restart, EnvCall) that failed."""

    call: int = 0

    @classmethod
    def of_call(cls, call: int, env_id: int | None, phase: str, exc: BaseException) -> CallFailed:
        f = Failure.of(env_id, phase, exc)
        return cls(f.env_id, f.phase, f.remote_type, f.traceback, f.exception, call)


@dataclass(frozen=True, slots=True)
class Extra:
    """Non-numeric infos of env ``env_id``'s published result (status STATUS_EXTRA), and the
    values of its observation leaves that travel pickled (``shmpool.pickled``), if any: each
    a pickled blob (``pack``), so that a value the parent cannot rebuild is that env's error
    and never a message the parent cannot read."""

    env_id: int
    infos: bytes
    pickled_obs: bytes | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to message command ``call``: None, or one pickled value per env asked (``pack``)."""

    call: int
    values: list[bytes] | None


@dataclass(frozen=True, slots=True)
class Closed:
    """The worker closed its envs and exits; ``failures`` of their ``close()``."""

    failures: list[Failure]


ToParent = Spaces | Ready | Failure | Extra | Reply | Closed


# --- encoders and decoders ---------------------------------------------------------------


def encode_for_worker(msg: ToWorker) -> bytes:
    return pickle.dumps(msg, _PICKLE)


def decode_from_parent(data: bytes) -> ToWorker | Continued:
    return _checked(pickle.loads(data), (MapRegion, Abort, Reset, Restart, EnvCall, PickledActions, Continued))


def encode_for_parent(msg: ToParent) -> bytes:
    """Pickled; spaces cloudpickled (classes from ``__main__``).  Every other message is
    plain data (values ride inside as ``pack``ed blobs), so it always encodes."""
    if type(msg) is Spaces:
        return cloudpickle.dumps(msg)
    return pickle.dumps(msg, _PICKLE)


def decode_from_worker(data: bytes) -> ToParent:
    return _checked(pickle.loads(data), (Spaces, Ready, Failure, Extra, Reply, Closed))


class DecodedOnce:
    """Start-up's decoder for the workers' ``Spaces``: messages equal byte for byte decode to one
    object.  Every worker describes the same spaces, and a ``Box`` of N elements carries 4N bytes
    of bounds (low, high and two masks); decoding each worker's copy, then comparing them with
    ``allclose``, held and scanned that many times over in the trainer before the region's size
    could be checked.  Equal bytes are judged by a digest, so only the first copy is kept; spaces
    that differ in bytes (a custom class cloudpickled by value, a seeded RNG) are decoded and
    compared as before.  Kept by the worker set for the pool's life: a replacement worker whose
    message is the same gets the same spaces, compared by identity."""

    def __init__(self) -> None:
        self._decoded: dict[bytes, ToParent] = {}

    def decode(self, data: bytes) -> ToParent:
        if len(data) <= PIPE_SAFE:   # small: decoding costs less than remembering
            return decode_from_worker(data)
        key = hashlib.blake2b(data, digest_size=32).digest()
        msg = self._decoded.get(key)
        if msg is None:
            msg = decode_from_worker(data)
            if type(msg) is Spaces:
                self._decoded[key] = msg
        return msg


def pack(value: Any) -> bytes:
    """A value that rides inside a message as its own blob: pickled, or cloudpickled when plain
    pickle refuses it (lambdas, classes of ``__main__``, as SB3's and gymnasium's workers send
    them).  Raises what cloudpickle raises when neither can."""
    try:
        return pickle.dumps(value, _PICKLE)
    except Exception:
        return cloudpickle.dumps(value, _PICKLE)


def unpack(blob: bytes) -> Any:
    """The value of a ``pack``ed blob (raises whatever rebuilding it raises)."""
    return pickle.loads(blob)


def first_unpicklable(items: dict) -> tuple[Any, BaseException] | None:
    """The first key of ``items`` that cannot be packed, or whose value cannot, with the error;
    None when every one can (names the culprit when a whole dict was refused)."""
    for key, value in items.items():
        try:
            pack(key)
        except Exception as exc:
            return key, exc
        try:
            pack(value)
        except Exception as exc:
            return key, exc
    return None


def _checked(msg: Any, types: tuple[type, ...]):
    if not isinstance(msg, types):
        raise ProtocolError(f"unexpected side-channel message {type(msg).__name__}")
    return msg


# A message this small always fits the pipe's buffer (a socketpair holds ~200 KiB): sent inline.
# A larger one would block the parent until the worker reads it, and a worker reads its message
# only once the parent has posted the command that follows the send: a deadlock.
PIPE_SAFE = 64 * 1024
_SENDERS: dict[int, threading.Thread] = {}   # id(conn) -> the thread still writing a large message


def send(conn, msg: ToWorker) -> None:
    """Parent: one message to a worker's pipe.  A large one is announced inline (``Continued``) and
    written by a thread, so the parent never waits for a reader that waits for the parent."""
    data = encode_for_worker(msg)
    earlier = _SENDERS.pop(id(conn), None)
    if earlier is not None:   # messages stay in order on one pipe
        earlier.join()
    if len(data) <= PIPE_SAFE or getattr(conn, "never_blocks", False):
        conn.send_bytes(data)
        return
    conn.send_bytes(encode_for_worker(Continued(len(data))))
    writer = threading.Thread(target=_write_quietly, args=(conn, data), name="shmpool-send", daemon=True)
    writer.start()
    _SENDERS[id(conn)] = writer


def _write_quietly(conn, data: bytes) -> None:
    try:
        conn.send_bytes(data)
    except (OSError, ValueError):   # the worker died or the pipe was closed: the liveness check says so
        pass


def receive(conn, decoder: DecodedOnce | None = None) -> ToParent:
    """Parent: the next message from a worker's pipe (blocks; EOFError once it is gone).  A shard
    stepped in this process hands its side messages over as objects (``handed_over``): nothing
    crosses a process, and the values inside are ``pack``ed blobs all the same.  ``decoder``:
    start-up's, which decodes a message equal to an earlier one only once."""
    data = conn.recv_bytes()
    if type(data) is bytes:
        return decode_from_worker(data) if decoder is None else decoder.decode(data)
    return _checked(data, (Extra, Failure))


def report(conn, msg: ToParent) -> None:
    """Worker: one message to the parent."""
    conn.send_bytes(encode_for_parent(msg))


def handed_over(msg: Extra | Failure) -> Extra | Failure:
    """A side message of a shard stepped in the parent's own process, as it goes into the pipe:
    unencoded.  Its values are already ``pack``ed, so the parent sees what a worker would send;
    only the envelope's pickling and its dataclass rebuild are skipped."""
    return msg


def next_command(conn) -> ToWorker:
    """Worker: the next message from the parent (a ``Continued`` one read whole)."""
    msg = decode_from_parent(conn.recv_bytes())
    if type(msg) is Continued:
        msg = decode_from_parent(conn.recv_bytes())
    return msg


def pack_each(items: list, ids: list[int], describe: Callable[[int], str]) -> list[bytes]:
    """``items`` (one per env of ``ids``) packed for the side channel, an object shared by many
    envs once; ``TypeError`` naming the env (``describe(env_id)``) when one cannot be."""
    blobs: list[bytes] = []
    memo: dict[int, bytes] = {}   # id of an item -> its blob (items stay referenced meanwhile)
    for env_id, item in zip(ids, items):
        blob = memo.get(id(item))
        if blob is None:
            try:
                blob = pack(item)
            except Exception as exc:
                raise TypeError(f"{describe(env_id)} cannot be pickled: {exc}") from exc
            memo[id(item)] = blob
        blobs.append(blob)
    return blobs
