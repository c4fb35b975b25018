"""A pool actor's large answers (observations) cut into parts small enough for Ray to return inline.

Ray returns an actor call's result inside the reply to the caller when it is at most
``max_direct_call_object_size`` (100 KiB by default); a larger one goes to the object store of the
actor's node and the driver fetches it from there, which on a local 2-node cluster cost 8.8 ms per
step for two actors answering 8 Pong observations each (221 KiB), against 2.7 ms for the same
answers pickled and returned as three parts of at most :data:`PART_BYTES` each
(``num_returns=3``; :func:`~.faults.call` makes such a call, :data:`~.faults.PENDING` waits for
it).  A call asks for as many parts as its rows' observations need
(:class:`Parts`); an answer larger than expected (big infos) still arrives whole, only through the
object store.  Ray's compiled graphs, the faster path on paper, failed RayPool's fault
requirements in Ray 2.60 (see the project's notes on issue 34).
"""
from __future__ import annotations

from typing import Any

import cloudpickle
import numpy as np

PART_BYTES = 90 * 1024   # under Ray's default inline limit (100 KiB), with room for Ray's own framing


def pack(answer: Any, parts: int) -> Any:
    """``answer`` pickled and cut into ``parts`` pieces (the actor method's ``num_returns``)."""
    blob = cloudpickle.dumps(answer, protocol=5)
    if parts == 1:
        return blob
    step = -(-len(blob) // parts)
    return tuple(blob[i * step:(i + 1) * step] for i in range(parts))


def unpack(pieces: list[bytes]) -> Any:
    """The answer :func:`pack` cut into ``pieces`` (its arrays are fresh, writable copies)."""
    return cloudpickle.loads(pieces[0] if len(pieces) == 1 else b"".join(pieces))


class Parts:
    """How many parts an answer of ``n`` rows needs, for observations of ``obs_bytes`` bytes per env."""

    def __init__(self, observation_space: Any) -> None:
        sample = observation_space.sample()
        leaves = (sample.values() if isinstance(sample, dict) else sample if isinstance(sample, tuple)
                  else [sample])
        self.row_bytes = sum(np.asarray(leaf).nbytes for leaf in leaves) + 64   # + reward, flags, id

    def of(self, rows: int) -> int:
        return max(1, -(-(rows * self.row_bytes + 4096) // PART_BYTES))
