"""Type stubs for the driver's reads off a direct connection (see _inbox.pyx)."""
import numpy as np

ENDED_BY_PEER: int

class FrameInbox:
    def read(self, fd: int) -> tuple[list[tuple[np.ndarray, int, int]], int]: ...

def readable(fds: list[int], timeout_ms: int) -> list[int]: ...
