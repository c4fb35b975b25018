"""A RayPool's step over its pools' direct connections: the requests framed from heads kept per action layout
(:class:`~.step_frames.StepFrames`), the answers read into the step's output (:class:`~.step_targets.StepTargets`),
and, once both are known, the common step in two C calls (:class:`~._step_io.StepIO`): the batch checked and sent;
the answers read and joined (issue 34)."""
from __future__ import annotations

import time
from typing import Any

from ._step_io import StepIO
from .action_check import ActionCheck
from .batches import Rows
from .channel import Channel, Reply, wait
from .step_frames import StepFrames
from .step_targets import StepTargets


class DirectStep:
    """The sync (and ``step_async``) step's requests and answers over direct connections.  ``rows[k]``: pool
    ``k``'s rows of the batch; ``check``: the RayPool's action check, whose C check :meth:`send_whole` uses."""

    def __init__(self, rows: list[slice], check: ActionCheck) -> None:
        self.frames = StepFrames(rows)
        self.targets = StepTargets(rows)
        self.check = check
        self.io: StepIO | None = None
        self.by_io = False   # whether the step pending was sent by ``io`` (its output and targets are io's)

    def send_whole(self, actions: Any, channels: list[Channel | None]) -> list[Reply] | None:
        """The step's replies when the common step went out in C: ``actions`` a whole batch that passes the C check,
        every channel this step knows, open and idle.  None, with nothing checked further or sent, otherwise: the
        caller checks ``actions`` and sends as usual (:meth:`send`, or Ray calls)."""
        io = self.io
        replies = None if io is None else io.send(actions, channels)
        if replies is not None:
            self.by_io = True
        return replies

    def send(self, actions: Any, channels: list[Channel]) -> list[Reply] | None:
        """The step's replies, each pool's request sent on its channel (``actions`` checked already, every pool
        direct); None, with nothing sent, when ``actions`` is not a plain array (then the caller encodes them)."""
        frames = self.frames.frames(actions)
        if frames is None:
            return None
        replies = [channel.send_frame((frame,)) for channel, frame in zip(channels, frames)]
        # Aimed once every request is out (nothing is read before): the last pool starts its step ~10 µs sooner
        for reply, target in zip(replies, self.targets.targets()):
            reply.target = target
        self.by_io = False
        self._rewire(channels)
        return replies

    def collect(self, refs: list, timeout: float) -> tuple | None:
        """``(obs, rewards, terminated, truncated, infos)`` when every pool answered the step (``refs``, pool order,
        each a :class:`~.channel.Reply`) with a value within ``timeout``; None when one did not (or a ref is a Ray
        call's): the refs are then the caller's to watch."""
        for ref in refs:   # a loop, not all() over a generator: every Python call is paid cold (issue 34)
            if type(ref) is not Reply:
                return None
        if not self.by_io:
            rows = self.targets.collect(refs, timeout)
            return None if rows is None else rows.as_step()
        deadline = time.monotonic() + timeout
        out = self.io.collect(refs, timeout)
        if out is not None:
            return out
        wait(refs, len(refs), max(0.0, deadline - time.monotonic()))   # what the read in C waited counts
        values = Reply.values(refs)
        return None if values is None else self.join(values)

    def join(self, parts: list[Rows]) -> tuple:
        """``(obs, rewards, terminated, truncated, infos)`` from every pool's rows (pool order), as
        :meth:`~.step_targets.StepTargets.join` joins them; a new answer layout learnt there retires ``io``."""
        aimed = (self.io.obs, self.io.targets) if self.by_io else None
        self.by_io = False
        plan = self.targets.plan
        out = self.targets.join(parts, aimed).as_step()
        if self.targets.plan is not plan:
            self.io = None   # made again by the next step sent from Python
        return out

    def _rewire(self, channels: list[Channel]) -> None:
        """Make ``io`` for these channels once the heads of the C check's action layout and the answers' plan and
        joiner are known (kept while they stay the same)."""
        targets, frames, check = self.targets, self.frames, self.check
        if targets.joiner is None or check.whole is None or frames.heads is None or frames.key != check.key:
            self.io = None
            return
        io = self.io
        if (io is not None and io.plan is targets.plan and io.joiner is targets.joiner
                and io.channels == channels and io.heads is frames.heads):
            return
        self.io = StepIO(channels, frames.heads, check.whole, frames.rows, targets.plan, targets.joiner,
                         targets.learnt[0][0])
