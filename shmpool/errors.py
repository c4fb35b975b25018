"""Exceptions raised by a pool. Each message names the env, worker and phase."""
from __future__ import annotations

from typing import Any


class ShmpoolError(RuntimeError):
    """Base class for failures of a pool's envs or workers.

    Pickles with its message and fields (a training function in a process pool or a
    Ray task re-raises it as it was), although the constructors take keywords."""

    def __reduce__(self):
        return rebuild_error, (type(self), self.args, self.__dict__)


def rebuild_error(cls: type, args: tuple, fields: dict) -> BaseException:
    """Unpickling: an exception of ``cls`` with ``args`` and attributes ``fields``,
    without calling its constructor."""
    if issubclass(cls, OSError):   # PoolResourceError: OSError's own new and init set errno and strerror
        exc = OSError.__new__(cls, *args)
        OSError.__init__(exc, *args)
    else:
        exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(fields)
    return exc


class EnvError(ShmpoolError):
    """An env raised inside a worker. ``remote_traceback`` holds the worker's traceback and
    ``remote_exception`` the exception object (None if it could not be pickled)."""

    def __init__(self, message: str, *, env_id: int | None, worker: int, phase: str,
                 remote_type: str, remote_traceback: str, remote_exception: BaseException | None = None) -> None:
        super().__init__(message)
        self.env_id = env_id
        self.worker = worker
        self.phase = phase
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
        self.remote_exception = remote_exception  # the env's exception itself, when it could be unpickled

    @classmethod
    def from_failure(cls, failure: Any, *, worker: int, who: str, then: str | None = None) -> EnvError:
        """The error of a worker's ``Failure`` (``shmpool.protocol``): ``who`` names the env and
        its process, ``then`` says what the caller must do (or what became of the pool)."""
        tail = f"; {then}" if then else ""
        return cls(with_traceback(f"{who} raised in {failure.phase}: {failure.last_line}{tail}", failure.traceback),
                   env_id=failure.env_id, worker=worker, phase=failure.phase, remote_type=failure.remote_type,
                   remote_traceback=failure.traceback, remote_exception=failure.original())

    def copy_as(self, cls: type[EnvError] | None = None, message: str | None = None) -> EnvError:
        """The same error (every field kept) as ``cls`` (a subclass that is also the env's builtin
        exception type) and with ``message`` when given."""
        return (cls or type(self))(str(self) if message is None else message, env_id=self.env_id,
                                   worker=self.worker, phase=self.phase, remote_type=self.remote_type,
                                   remote_traceback=self.remote_traceback, remote_exception=self.remote_exception)

    @property
    def head(self) -> str:
        """The message without the remote traceback."""
        return str(self).split(TRACEBACK_MARK, 1)[0]


TRACEBACK_MARK = "\n--- remote traceback ---\n"


def with_traceback(head: str, traceback: str) -> str:
    """An ``EnvError`` message: what happened, then the worker's traceback."""
    return f"{head}{TRACEBACK_MARK}{traceback}"


class WorkerDiedError(ShmpoolError):
    """A worker process exited while the pool needed it; the pool is closed."""

    def __init__(self, message: str, *, worker: int, pid: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.exitcode = exitcode


class WorkerRestartedError(ShmpoolError):
    """With ``on_worker_error="restart"``: a worker died while it owed the answer to a
    ``call``/``get_attr``/``set_attr``/``apply``.  It was replaced and the pool is still
    open, but the call was not repeated (it may have run in some envs already)."""

    def __init__(self, message: str, *, worker: int, pid: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.exitcode = exitcode


class PoolClosedError(ShmpoolError):
    """The pool was used after ``close()`` (or after a fatal error closed it)."""


class PoolResourceError(ShmpoolError, OSError):
    """The pool could not get a resource it needs (memory for its shared region, address space,
    file descriptors, processes).  The message names the resource, the size asked for, the limit
    when known, and what to change.  ``EnvError`` stays for errors raised by env code."""

    def __init__(self, message: str, *, errno_: int | None, resource: str, size: int | None,
                 limit: int | None) -> None:
        OSError.__init__(self, errno_, message)
        self.resource = resource
        self.size = size
        self.limit = limit

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class SpacesDifferError(ValueError):
    """The envs' observation spaces differ more than ``observation_mode`` allows.
    ``observation_spaces`` holds each env's space (a face judges them with its reference's errors)."""

    def __init__(self, message: str, observation_spaces: tuple) -> None:
        super().__init__(message)
        self.observation_spaces = observation_spaces

    def __reduce__(self):
        return type(self), (str(self), self.observation_spaces)

