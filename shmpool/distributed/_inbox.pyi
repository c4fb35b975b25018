"""Type stubs for the reads off a direct connection, the driver's and the actor's (see _inbox.pyx)."""
import numpy as np

ENDED_BY_PEER: int

class ReadTarget:
    prefix: bytes
    at: int
    into: np.ndarray
    filled: bool
    def __init__(self, prefix: bytes, at: int, into: np.ndarray) -> None: ...

class FrameInbox:
    @property
    def partial(self) -> bool: ...
    def read(self, fd: int, targets: list[ReadTarget | None] | None = None
             ) -> tuple[list[tuple[np.ndarray, int, int]], int]: ...

def readable(fds: list[int], timeout_ms: int) -> list[int]: ...
