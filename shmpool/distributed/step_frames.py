"""A sync step's requests, one per pool, framed as :func:`~.channel.encode` frames them but from a head made once
per action layout: only the actions' bytes are new each step."""
from __future__ import annotations

from typing import Any

import numpy as np

from .channel import LAYOUTS, Request


class StepFrames:
    """Each pool's ``step`` request for a batch of actions, framed from a head kept per action layout: the bytes
    :func:`~.channel.encode` puts before a pool's actions, then the actions' own bytes.  ``rows[k]``: pool ``k``'s
    rows of the batch.  Beside busy workers, encoding every request anew (``Request``, its short form, its parts)
    was part of what a sync step cost the driver (issue 34)."""

    def __init__(self, rows: list[slice]) -> None:
        self.rows = rows
        self.key: tuple | None = None       # (dtype, shape) of the batch the heads were made for
        self.heads: list[bytes] | None = None

    def frames(self, actions: Any) -> list[bytes] | None:
        """One frame per pool (bytes), or None when ``actions`` is not a plain array (then :func:`~.channel.encode`)."""
        if type(actions) is not np.ndarray:
            return None
        key = (actions.dtype, actions.shape)
        if key != self.key:
            self.key, self.heads = key, self._heads(actions)
        if self.heads is None:
            return None
        return [head + actions[rows].tobytes() for head, rows in zip(self.heads, self.rows)]

    def _heads(self, actions: np.ndarray) -> list[bytes] | None:
        heads = []
        for rows in self.rows:
            part = np.ascontiguousarray(actions[rows])
            parts = LAYOUTS.frame(Request("step", (part,)))
            if parts is None:
                return None
            frame = b"".join(bytes(p) for p in parts)   # the actions are its last bytes
            heads.append(frame[:len(frame) - part.nbytes])
        return heads
