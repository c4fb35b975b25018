"""One pool call running in a thread, so that a ``*_wait(timeout)`` can stop waiting while it goes on.

The pool answers ``reset`` and ``call`` synchronously; gymnasium's ``reset_async``/``call_async``
return at once and their ``*_wait(timeout)`` may give up.  A :class:`BackgroundCall` gives the
VectorEnv both: the call starts at ``*_async`` and ``wait(timeout)`` says whether it is done.
The pool's entry lock keeps every other call out until it is, and a ``close()`` meanwhile ends it
(the pool checks for a close between its wait slices).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class BackgroundCall:
    """``fn(*args)`` started in a daemon thread; :meth:`wait` for it, :meth:`result` to collect it."""

    def __init__(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args), name=f"shmpool-{name}", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # handed to whoever collects the result
            self._error = exc

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: until done); True once the call has finished."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def result(self) -> Any:
        """The call's value, or its exception raised here (only after :meth:`wait` returned True)."""
        if self._error is not None:
            error, self._error = self._error, None   # no reference cycle through the traceback
            raise error
        return self._value
