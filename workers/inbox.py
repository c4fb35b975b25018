"""A worker's pickled actions (``shmpool.pickled``): read from the pipe when a step needs them."""
from __future__ import annotations

import numpy as np

from shmpool import protocol as P


class PickledActionInbox:
    """The latest pickled action values of each env of this worker, by version.

    The parent bumps ``versions[i]`` (shared memory) before it dispatches a step of
    env ``i`` and sends the values after; :meth:`take` reads the pipe until it holds
    that version.  Only ``PickledActions`` can come before them on the pipe: anything
    else is sent later, after the parent has had its results."""

    def __init__(self, conn, versions: np.ndarray) -> None:
        self.conn = conn
        self.versions = versions
        self.held: dict[int, tuple[int, tuple]] = {}

    def absorb(self, msg: P.PickledActions) -> None:
        for env_id, version, values in zip(msg.env_ids, msg.versions, msg.values):
            self.held[env_id] = (version, values)

    def take(self, env_id: int) -> tuple:
        """The values of env ``env_id``'s step being served (one per pickled leaf)."""
        want = int(self.versions[env_id])
        while True:
            got = self.held.get(env_id)
            if got is not None and got[0] == want:
                return got[1]
            msg = P.next_command(self.conn)
            if type(msg) is not P.PickledActions:
                raise P.ProtocolError(f"expected the pickled actions of env {env_id}, got {type(msg).__name__}")
            self.absorb(msg)
