"""Type stubs for the reads off a direct connection, the driver's and the actor's (see _inbox.pyx)."""
import numpy as np

ENDED_BY_PEER: int

class FrameInbox:
    @property
    def partial(self) -> bool: ...
    def read(self, fd: int) -> tuple[list[tuple[np.ndarray, int, int]], int]: ...

def readable(fds: list[int], timeout_ms: int) -> list[int]: ...
