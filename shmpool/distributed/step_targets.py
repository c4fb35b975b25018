"""A sync step's observations read off the connections straight into the step's output.

Each pool answers a step with the same layout step after step (its rows' dtypes and shapes, its info keys), so
once one answer of a pool has been read, the next one's body is known up to the bytes: where its observations
lie and what precedes them.  The driver then allocates the step's ``(num_envs, *obs_shape)`` output before the
answers come, and each pool's observations are read into its rows of it (:class:`~._inbox.ReadTarget`); an
answer of another layout (its info keys changed, an error) is read whole, as before, and joined by copying.
Without this, the join copied every observation once more after the last answer arrived: ~45 µs of a Pong step
on the driver's critical path (issue 34).  The answers' other columns are joined by a plan made once per layout
(:class:`~._frames.JoinPlan`), straight from the bodies :func:`read_step` reads in C."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._frames import JoinPlan, array_offsets
from ._inbox import ReadTarget
from ._step_io import read_joined
from .batches import FramedRows, Rows
from .channel import Reply, wait


@dataclass(frozen=True)
class AnswerForm:
    """How a pool's step answer is laid out: its body's bytes before the arrays (``prefix``: array sizes and
    pickle), where its observations start in the body (``at``), their dtype and shape (rows first)."""

    prefix: bytes
    at: int
    dtype: np.dtype
    shape: tuple

    @staticmethod
    def of(rows: Any, num_rows: int) -> AnswerForm | None:
        """The form of a pool's answer ``rows`` when it is a frame (:class:`FramedRows`, read or not: its bytes are
        the frame's) of ``num_rows`` plain, non-empty observations; None otherwise."""
        if type(rows) is not FramedRows:
            return None
        body, start, layout = rows.frame
        dtype, shape = layout[1]   # the observations (the frame's order: ids, obs, rew, ...)
        # Observations of any size but none are read into place: a small target costs two more recv calls than a
        # copy, but only answers with targets take the step in C (StepIO, whose head and join in C are worth far
        # more), and a target's prefix check is what proves an answer is in its learnt layout.  A 4 KiB floor here
        # kept CartPole's steps out of C: lifting it took 26 µs off a CartPole N=16 step over RayPool (p50, lower in
        # 13 of 16 alternated blocks) and 31 µs off the driver's CPU (16 of 16).
        if not shape or shape[0] != num_rows or not dtype.itemsize * math.prod(shape):
            return None
        return AnswerForm(body[:start].tobytes(), array_offsets(start, layout)[1], dtype, tuple(shape))


class StepTargets:
    """Per pool, the form of its last step answer; per step, the output the answers are read into.

    ``rows[k]``: pool ``k``'s rows of the batch (consecutive, in pool order).  :meth:`targets` is called as the
    step's requests leave, :meth:`join` with the pools' answers in pool order."""

    def __init__(self, rows: list[slice]) -> None:
        self.rows = rows
        self.forms: list[AnswerForm | None] = [None] * len(rows)
        self.layouts: list[tuple | None] = [None] * len(rows)   # the layout each form was learnt from
        # (info keys, bool masks, where the arrays start) of the answer each form was learnt from
        self.learnt: list[tuple[tuple, bool, int] | None] = [None] * len(rows)
        self.plan: tuple[np.dtype, tuple, list[tuple[AnswerForm, slice]]] | None = None
        # How the other columns of answers in the learnt layouts join (their observations are in the output already)
        self.joiner: JoinPlan | None = None
        self.obs: np.ndarray | None = None         # the pending step's output
        self.pending: list[ReadTarget] | None = None

    def targets(self) -> list[ReadTarget | None]:
        """One target per pool for the step about to be sent, into a fresh output; all None until every pool's
        answer form is known and the pools' observations agree in dtype and row shape."""
        if self.plan is None:
            self.obs = self.pending = None
            return [None] * len(self.rows)
        dtype, shape, parts = self.plan
        obs = self.obs = np.empty(shape, dtype)
        self.pending = [ReadTarget(form.prefix, form.at, obs[rows]) for form, rows in parts]
        return self.pending

    def collect(self, replies: list[Reply], timeout: float) -> Rows | None:
        """The step's rows when every pool's answer (``replies``, pool order, each over a direct connection) is a
        value within ``timeout``: read in C and joined from their bodies when each came in its learnt layout
        (:func:`read_step`), else decoded and joined (:meth:`join`).  None when one is not (not done,
        lost, an error): the replies are then the caller's to watch."""
        deadline = time.monotonic() + timeout
        rows = None if self.joiner is None else read_step(replies, timeout, self.join_read)
        if rows is not None:
            return rows
        wait(replies, len(replies), max(0.0, deadline - time.monotonic()))   # what read_step waited counts
        values = Reply.values(replies)
        return None if values is None else self.join(values)

    def join(self, answers: list, aimed: tuple[np.ndarray, list[ReadTarget]] | None = None) -> Rows:
        """The step's rows from every pool's answer (pool order): as read into the output when every answer was,
        else joined by copying (and the forms of the answers not read in place learnt for the next step).
        ``aimed``: the step's output and targets when they were made elsewhere (:class:`~._step_io.StepIO`), not by
        :meth:`targets`."""
        obs, pending = aimed or (self.obs, self.pending)
        self.obs = self.pending = None
        if pending is not None and self.joiner is not None:
            bodies = self._bodies(answers, pending)
            if bodies is not None:
                return self._joined(bodies, obs)
        self._learn(answers)
        return Rows.join(answers)

    def join_read(self, bodies: list[np.ndarray]) -> Rows | None:
        """The step's rows from the bodies of the pools' answers (pool order), each read into its target (so in the
        layout its pool's form was learnt from); None when those layouts do not join that way (then :meth:`join`
        joins the decoded answers).  ValueError when a body is not as long as its layout says."""
        if self.joiner is None or self.obs is None:
            return None
        rows = self._joined(bodies, self.obs)
        self.obs = self.pending = None
        return rows

    def _joined(self, bodies: list[np.ndarray], obs: np.ndarray) -> Rows:
        cols = self.joiner.join(bodies)
        return Rows(cols[0], obs, cols[2], cols[3], cols[4], dict(zip(self.learnt[0][0], cols[5:])))

    def _bodies(self, answers: list, pending: list[ReadTarget]) -> list[np.ndarray] | None:
        """The answers' bodies when each is in the layout its pool's form was learnt from, unread, with its
        observations read into its target; else None."""
        bodies = []
        for k, answer in enumerate(answers):   # a loop, not all() over a generator: every Python call is paid cold
            if (type(answer) is not FramedRows or answer.target is not pending[k] or not answer.target.filled
                    or answer.frame[2] is not self.layouts[k] or not answer.unread):
                return None
            bodies.append(answer.frame[0])
        return bodies

    def _learn(self, answers: list) -> None:
        changed = False
        for k, answer in enumerate(answers):
            # A layout is one object per distinct pickle (channel.Layouts), so the same object means the same
            # prefix: a pool whose answers are never read into place (small observations) is not learnt again.
            if type(answer) is FramedRows and answer.target is None and answer.frame[2] is not self.layouts[k]:
                self.layouts[k] = answer.frame[2]
                self.forms[k] = AnswerForm.of(answer, self.rows[k].stop - self.rows[k].start)
                self.learnt[k] = answer.keys, answer.bool_masks, answer.frame[1]
                changed = True
        if changed:
            self.plan = self._plan()
            self.joiner = None if self.plan is None else self._joiner()

    def _joiner(self) -> JoinPlan | None:
        """How answers in the learnt layouts join around their observations: when they have the same info keys and
        bool ``_key`` masks (what :func:`~.batches.merge_infos` joins by plain concatenation) and their other
        columns agree (:class:`~._frames.JoinPlan`).  Otherwise their observations are still read into place, and
        the rest joined the general way (:meth:`~.batches.Rows.join`)."""
        keys = self.learnt[0][0]
        for learnt in self.learnt:
            if learnt[0] != keys or not learnt[1]:
                return None
        return JoinPlan.of([(learnt[2], layout) for learnt, layout in zip(self.learnt, self.layouts)], 1)

    def _plan(self) -> tuple[np.dtype, tuple, list[tuple[AnswerForm, slice]]] | None:
        first = self.forms[0]
        if first is None:
            return None
        for form in self.forms:
            if form is None or form.dtype != first.dtype or form.shape[1:] != first.shape[1:]:
                return None
        return first.dtype, (self.rows[-1].stop, *first.shape[1:]), list(zip(self.forms, self.rows))


def read_step(replies: list[Reply], timeout: float, join: Callable[[list[np.ndarray]], Any]) -> Any | None:
    """A sync step's answers read in C and joined from their bodies alone: ``join(bodies)`` when, within
    ``timeout``, each reply's answer came whole into its target (the layout the driver expects; ``join`` may
    return None or raise ValueError when it cannot join them); each reply must be the only one pending on its
    connection.  The replies are then settled with that result.

    Otherwise None, at once when a reply is not alone or has no target; every answer that came has then settled
    its reply as :meth:`~.channel.Channel.read_available` settles it, and the caller waits on as usual
    (:func:`~.channel.wait`).
    Decoding each answer, settling it and joining the answers' rows cost the driver ~100 µs of a Pong step, its
    caches cold beside the busy workers (issue 34)."""
    channels = []
    for r in replies:
        channel = r.channel
        if r.target is None or channel.lost is not None or len(channel.pending) != 1 or channel.pending[0] is not r:
            return None
        channels.append(channel)
    return read_joined(channels, [c.fd for c in channels], [c.reader.inbox for c in channels],
                       [r.target for r in replies], time.monotonic() + timeout, join)
