"""Type stubs for the reads off a direct connection, the driver's and the actor's (see _inbox.pyx)."""
import numpy as np

ENDED_BY_PEER: int
MALFORMED: int
MAX_BODY: int

class ReadTarget:
    prefix: bytes
    at: int
    into: np.ndarray
    filled: bool
    def __init__(self, prefix: bytes, at: int, into: np.ndarray) -> None: ...

class FrameInbox:
    malformed: str | None
    @property
    def partial(self) -> bool: ...
    def read(self, fd: int, targets: list[ReadTarget | None] | None = None
             ) -> tuple[list[tuple[np.ndarray, int, int]], int]: ...

def readable(fds: list[int], timeout_ms: int) -> list[int]: ...
def read_round(fds: list[int], inboxes: list[FrameInbox], targets: list[list[ReadTarget | None] | None],
               frames: list[list[tuple[np.ndarray, int, int]]], statuses: list[int], timeout_ms: int) -> int: ...
