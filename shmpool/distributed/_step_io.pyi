"""Type stubs for a RayPool's sync step in C on its direct connections (see _step_io.pyx)."""
from collections.abc import Callable
from typing import Any

import numpy as np

from .._batch_check import BatchCheck
from ._frames import JoinPlan
from ._inbox import FrameInbox, ReadTarget
from .channel import Channel, Reply

class StepIO:
    channels: list[Channel]
    heads: list[bytes]
    plan: tuple
    joiner: JoinPlan
    obs: np.ndarray | None
    targets: list[ReadTarget] | None
    def __init__(self, channels: list[Channel], heads: list[bytes], check: BatchCheck, rows: list[slice],
                 plan: tuple, joiner: JoinPlan, keys: tuple) -> None: ...
    def send(self, actions: Any, channels: list[Channel | None]) -> list[Reply] | None: ...
    def collect(self, replies: list[Reply], timeout: float) -> tuple | None: ...

def read_joined(channels: list[Channel], fds: list[int], inboxes: list[FrameInbox], targets: list[ReadTarget],
                deadline: float, join: Callable[[list[np.ndarray]], Any]) -> Any | None: ...
