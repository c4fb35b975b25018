"""What one env step costs, and whether envs that cheap earn a worker process beside a trainer.

Handing a shard to a worker costs a post, a wake-up of a sleeping core and a wait for it: beside
a trainer whose torch threads hold the other core, that hand-off cost more than stepping 32
CartPoles here (CleanRL's ppo.py on 2 cores: the default layout 0.80-0.90x SyncVectorEnv, every
env in this process 0.95-0.98x; docs/performance.md).  Envs whose whole batch costs less than
``IN_PROCESS_BELOW_S`` per step are then stepped in this process; heavier ones (Ant-v5: 187 us an
env) keep their workers, which win there.

The cost is measured by a *probe*: a process forked from this one builds an env from the pool's
last constructor (scripts give env 0 the extras: video, rendering), steps it with random actions,
writes one number on a pipe and exits.  Everything it touches is its own copy of the trainer's
memory, as in one of ``AsyncVectorEnv``'s forked workers: a captured tensor, config or live env
(``lambda: env``) and the global RNGs (numpy's, Python's, torch's) of this process are never
advanced, an env allowed once per process is built in another process, and the pool's own envs
are built later from their own copies, so trajectories are untouched.  The probe is bounded as a
whole (``PROBE_DEADLINE_S``: a constructor that is slow or a first step that blocks costs at most
that, and the default layout is kept); an env or constructor that raises gives no cost either (the
pool's own start-up reports it).  ``repr(pool)`` says what the probe measured.
"""
from __future__ import annotations

import math
import os
import select
import signal
import struct
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .workers.inherited import set_aside_trainer_objects
from .workerset import collection_paused

# Below this much env work per step (all envs), a trainer's process steps them itself.
IN_PROCESS_BELOW_S = 1e-3
PROBE_STEPS = 100          # steps timed on the probe env (the first, cold one is not counted)
PROBE_BUDGET_S = 0.05      # at most this long stepping it
# The probe process as a whole (fork, constructor, steps, close): past this it is killed and the
# default layout kept.  CartPole's whole probe takes ~60 ms here; a constructor that loads a model or
# a ROM for seconds is not the cheap env the in-process layout is for.
PROBE_DEADLINE_S = 2.0

_ANSWER = struct.Struct("<d")   # seconds of one step; NaN: the env or its constructor raised


@dataclass(frozen=True)
class StepCost:
    """What the probe found: ``seconds`` of one env step, or None with ``why_not``."""

    seconds: float | None
    why_not: str = ""

    def describe(self) -> str:
        """The probe's finding, as ``repr(pool)`` says it."""
        if self.seconds is None:
            return f"one env's step not measured ({self.why_not})"
        return f"one env's step measured in a probe process: {self.seconds * 1e6:.0f} µs"


def time_steps(make_env: Callable[[], Any], steps: int = PROBE_STEPS, budget_s: float = PROBE_BUDGET_S) -> float | None:
    """Seconds of one ``step`` of an env built by ``make_env`` (random actions, reset when an
    episode ends), in *this* process: the lower quartile of the steps timed, what a step costs
    when nothing else runs.  The median of the first 24 steps swung 13-28 us for CartPole in
    CleanRL's script on a 2-vCPU VM, and 32 of them sit near ``IN_PROCESS_BELOW_S``: the layout
    flipped from run to run (a worker at 0.66x SyncVectorEnv).  The lower quartile of 100 steps
    stayed 10-16 us.  None when the constructor or the env raised.  It runs the constructor and
    the env here: the pool calls it only inside the probe process (``step_cost``)."""
    env = None
    try:
        env = make_env()
        env.action_space.seed(0)
        env.reset(seed=0)
        times = []
        deadline = time.perf_counter() + budget_s
        for k in range(steps + 1):
            action = env.action_space.sample()
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(action)
            if k:   # the first step pays one-off checks (gymnasium's env checker)
                times.append(time.perf_counter() - start)
            if terminated or truncated:
                env.reset()
            if time.perf_counter() > deadline:
                break
        if not times:
            return None
        times.sort()
        return times[len(times) // 4]
    except Exception:
        return None
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass


def step_cost(make_env: Callable[[], Any], steps: int = PROBE_STEPS, budget_s: float = PROBE_BUDGET_S,
              deadline_s: float = PROBE_DEADLINE_S) -> StepCost:
    """What one step of an env built by ``make_env`` costs, measured in a forked probe process
    (``time_steps`` there), so nothing of this process is run, advanced or drawn from; the whole
    probe takes at most ``deadline_s``."""
    read_end, write_end = os.pipe()
    try:
        # Collection off across the fork, so nothing of the trainer's is collected in the child
        # before it sets the trainer's objects aside (as for the workers).  Python 3.12+ warns of a
        # fork beside threads: the child takes no lock a trainer's thread could hold (a constructor
        # that does is cut off by the deadline).
        with collection_paused(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        return StepCost(None, f"no probe process: {exc.strerror or exc}")
    if pid == 0:   # the probe process: never returns
        _probe(read_end, write_end, make_env, steps, budget_s, deadline_s)
    os.close(write_end)
    try:
        answer = _read_within(read_end, _ANSWER.size, deadline_s)
    finally:
        os.close(read_end)
        _end(pid)
    if answer is None:
        return StepCost(None, f"the probe process took longer than {deadline_s:g} s")
    (seconds,) = _ANSWER.unpack(answer)
    if math.isnan(seconds):
        return StepCost(None, "the probe env or its constructor raised")
    return StepCost(seconds)


def _probe(read_end: int, write_end: int, make_env: Callable[[], Any], steps: int, budget_s: float,
           deadline_s: float) -> None:
    """The probe process's whole life: time the steps, write the answer, exit without running any
    of the trainer's exit handlers or finalizers."""
    code = 1
    try:
        os.close(read_end)
        set_aside_trainer_objects()
        # Ends by itself should the trainer stop waiting (killed, or stuck past the deadline).
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(math.ceil(deadline_s) + 1)
        seconds = time_steps(make_env, steps, budget_s)
        os.write(write_end, _ANSWER.pack(math.nan if seconds is None else seconds))
        code = 0
    finally:
        os._exit(code)


def _read_within(fd: int, size: int, timeout_s: float) -> bytes | None:
    """``size`` bytes from ``fd`` within ``timeout_s``; None when they do not come in time."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while len(data) < size:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, size - len(data))
        if not chunk:   # the probe exited without an answer (killed, or os._exit elsewhere)
            return None
        data += chunk
    return data


def _end(pid: int) -> None:
    """Kill the probe process unless it has exited, and reap it."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if not done:
            # It wrote its answer and is closing its env, or it is stuck: 0.5 s, then it is killed.
            deadline = time.monotonic() + 0.5
            while not done and time.monotonic() < deadline:
                time.sleep(0.005)
                done, _ = os.waitpid(pid, os.WNOHANG)
            if not done:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    except ChildProcessError:   # reaped by someone else's SIGCHLD handler
        pass


def cheap_enough(cost: float | None, num_envs: int) -> bool:
    """Whether ``num_envs`` envs of ``cost`` seconds a step are stepped faster here than handed out."""
    return cost is not None and cost * num_envs < IN_PROCESS_BELOW_S
