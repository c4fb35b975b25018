"""The fault matrix: every way an env, a worker or the parent can fail, in sync and async mode.

Each case builds a small pool (4 envs, 2 workers; env 3 on worker 1 is the faulty one unless
said otherwise), makes it fail, and returns an :class:`Outcome`: which exception came out,
its message, how long the failing call took and at which of the parent's looks between two wait
slices it learnt of the fault (tests/slices.py), and what state the pool is in afterwards
(probed, not assumed).  ``test_matrix.py`` asserts every cell against :data:`EXPECTED`;
``python tests/faults/matrix.py`` prints the table kept in ``tests/faults/README.md``.
"""
from __future__ import annotations

import functools
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: envs.py, conftest helpers

from envs import FaultyEnv  # noqa: E402
from slices import Looks, count_looks, looks_within  # noqa: E402

import shmpool  # noqa: E402
from shmpool import PoolClosedError  # noqa: E402
from shmpool.waiting import SLICE_S  # noqa: E402

ZEROS = np.zeros(4, dtype=np.int64)
MODES = ("sync", "async")
DEATH_MODES = (*MODES, "sync restart", "async restart")   # on_worker_error="raise" (default) / "restart"


# When the failing call learns of the fault, counted in the parent's looks between two wait slices
# (``Supervisor.between_slices``, tests/slices.py), not in seconds: a loaded machine stretches seconds,
# not the look at which a fault already there is seen.  Every fault here, undetected, blocks the failing
# call for good (a dead worker never finishes its step; a hung one sleeps 3600 s; Ctrl-C lands in a 3 s
# step), so a call that returns at all, with the error and state expected, shows the detection happened;
# the count says it happened at the right look, not at some later check:
RESULTS = "with the results"   # an env's error comes back with its step: no look raises or replaces
DEATH = "first look gone"      # a dead worker: at the first look that began with it exited (or sooner)
TIMEOUT = "look past timeout"  # a hang: at the look that found step_timeout passed
INTERRUPT = "slice of signal"  # Ctrl-C: in the slice it landed in, or its look
STEPS = "few looks"            # calls that must not wait on something that ends by itself later
NO_SLICE = "no slice here"     # nothing of this process waits (the parent killed): ``limit`` in seconds
# The env step a KeyboardInterrupt lands in (FaultyEnv's "sleep"); the call must end before it would.
SLOW_STEP_S = 3.0
# A forked child in env 3 ends itself this long after its fork (tests/envs.py): steps that waited for it
# would make a look per slice meanwhile.
CHILD_LIVES_S = 0.3


@dataclass
class Timing:
    """How long the failing call took, and the parent's looks between two slices during it."""

    seconds: float
    looks: Looks = field(default_factory=Looks)
    gone: int | None = None        # the pid of the faulty worker, watched for its exit
    signal_at: int | None = None   # looks made when Ctrl-C was sent

    @property
    def detected_at(self) -> int | None:
        """The first look that raised or replaced a worker (None: no look did)."""
        return min(self.looks.raised_at + self.looks.replaced_at, default=None)


@dataclass
class Outcome:
    error: str          # exception type name, or "none"
    message: str
    timing: Timing      # the call that failed (detection time)
    state: str          # what the pool does afterwards

    @property
    def seconds(self) -> float:
        return self.timing.seconds


@dataclass(frozen=True)
class Expected:
    error: str
    message: str        # regex searched in the message
    state: str
    detection: str = RESULTS   # at which look the failing call learnt of the fault (see RESULTS ...)
    at_least: float = 0.0      # seconds the failing call must have waited (a timeout did wait)
    looks: int = 0             # STEPS: the most looks the call may make
    limit: float | None = None  # seconds, only where no slice of this process waits (the parent killed)


def detected_in_time(want: Expected, timing: Timing) -> bool:
    """Whether the failing call learnt of the fault at the look ``want.detection`` says."""
    looks, at = timing.looks, timing.detected_at
    if want.detection == RESULTS:
        return at is None
    if want.detection == DEATH:   # or sooner: a broken pipe, read in a slice, is reported at that slice's look
        return at is not None and at <= looks.found_exited_at.get(timing.gone, at)
    if want.detection == TIMEOUT:   # each slice lasts its full 50 ms while the worker hangs, but the first,
        return at is not None and at <= looks_within(0.3) + 1   # which the other worker's results end early
    if want.detection == INTERRUPT:   # raised once the slice it landed in ends, before a second look
        return timing.signal_at is not None and looks.count - timing.signal_at <= 1
    if want.detection == STEPS:
        return at is None and looks.count <= want.looks
    if want.detection == NO_SLICE:
        return looks.count == 0 and want.limit is not None and timing.seconds < want.limit
    raise ValueError(f"unknown detection {want.detection!r}")


def faulty(fail_in: str = "never", at: int = 2, how: str = "raise"):
    return functools.partial(FaultyEnv, fail_in, at, how)


def pool_with(last, **kwargs) -> shmpool.Pool:
    """Envs 0-2 healthy, env 3 (worker 1) built by ``last``."""
    return shmpool.Pool([faulty()] * 3 + [last], num_workers=2, **kwargs)


def step_all(pool: shmpool.Pool, mode: str):
    if mode == "sync":
        return pool.step(ZEROS)
    pool.send(ZEROS)
    return pool.recv()


def timed(call: Callable[[], object], gone: int | None = None,
          before: Callable[[Timing], object] | None = None) -> tuple[BaseException | None, Timing, object]:
    """(the exception raised or None, the call's :class:`Timing`, what the call returned).  ``gone``:
    the pid of the worker that fails, watched for its exit; ``before(timing)`` runs just before the call."""
    with pytest.MonkeyPatch.context() as patch:
        timing = Timing(0.0, count_looks(patch), gone)
        if gone is not None:
            timing.looks.watch.add(gone)
        if before is not None:
            before(timing)
        t0 = time.monotonic()
        try:
            result = call()
        except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt is one of the cases
            timing.seconds = time.monotonic() - t0
            return exc, timing, None
        timing.seconds = time.monotonic() - t0
        return None, timing, result


def restart_kwargs(mode: str) -> dict:
    return {"on_worker_error": "restart"} if mode.endswith("restart") else {}


def base(mode: str) -> str:
    return mode.split()[0]


def after_restart(pool: shmpool.Pool, mode: str, result) -> str:
    """After a step that replaced a worker: which envs came back truncated and marked, then
    whether the pool steps on."""
    *_, trunc, infos = result
    ids = infos.get("env_id", np.arange(4))
    marked = sorted(int(ids[i]) for i in np.flatnonzero(infos.get("_worker_restarted", np.zeros(len(ids), bool))))
    cut = sorted(int(ids[i]) for i in np.flatnonzero(trunc))
    *_, trunc, infos = step_all(pool, base(mode))
    ids = infos.get("env_id", np.arange(4))
    late = sorted(int(ids[i]) for i in np.flatnonzero(infos.get("_worker_restarted", np.zeros(len(ids), bool))))
    return (f"usable; envs {cut} truncated, {marked} worker_restarted"
            + (f", then {late}" if late else "") + f"; restarts={pool.restarts}")


def probe_state(pool: shmpool.Pool, mode: str, result=None) -> str:
    """What the pool does now: closed, refuses until reset, or steps on."""
    if mode.endswith("restart") and not pool.closed:
        return after_restart(pool, mode, result)
    mode = base(mode)
    if pool.closed:
        try:
            pool.step(ZEROS)
        except PoolClosedError:
            return "closed (PoolClosedError after)"
        return "closed but still stepped"
    try:
        step_all(pool, mode)
        return "usable"
    except RuntimeError as exc:
        if "reset()" not in str(exc):
            raise
    pool.reset()
    step_all(pool, mode)
    return "usable after reset()"


def outcome(exc: BaseException | None, timing: Timing, state: str, pool: shmpool.Pool | None = None) -> Outcome:
    """What came out.  With no exception the message is what ``pool.restart_log`` says
    happened (``worker 1 was killed by SIGKILL during step``), or empty."""
    if exc is None:
        log = [] if pool is None else pool.restart_log
        said = "; ".join(f"worker {e['worker']} {e['cause']} during {e['op']}" for e in log)
        return Outcome("none", said, timing, state)
    # Notes count as message: KeyboardInterrupt has no text, only the pool's note.
    said = "\n".join([str(exc).split("\n--- remote traceback")[0], *getattr(exc, "__notes__", ())])
    return Outcome(type(exc).__name__, said, timing, state)


# --- the cases ------------------------------------------------------------------------------

def env_fails(fail_in: str, how: str = "raise", at: int = 2, **kwargs) -> Callable[[str], Outcome]:
    """The env fails inside a step, a reset or a call the pool makes."""
    def run(mode: str) -> Outcome:
        with pool_with(faulty(fail_in, at, how), **kwargs, **restart_kwargs(mode)) as pool:
            if fail_in == "reset":
                if mode == "sync":
                    exc, dt, _ = timed(pool.reset)
                else:
                    pool.async_reset()
                    exc, dt, _ = timed(lambda: (pool.recv(), pool.recv()) if pool.batch_size < 4 else pool.recv())
                return outcome(exc, dt, "closed" if pool.closed else refuses_then(pool, mode))
            pool.reset()
            pool.step(ZEROS)  # step 1: fine
            exc, dt, result = timed(lambda: step_all(pool, base(mode)), gone=pool.worker_pids[1])
            return outcome(exc, dt, probe_state(pool, mode, result), pool)
    return run


def env_forks(mode: str) -> Outcome:
    """Env 3 forks a child inside every step from step 2 on, and the child returns from ``step``:
    three more steps, whose rows must be the envs' own (each env's observation is its step count)."""
    with pool_with(faulty("step", 2, "fork")) as pool:
        pool.reset()
        pool.step(ZEROS)

        def three_steps() -> int:
            wrong = 0
            for t in range(2, 5):
                obs = step_all(pool, mode)[0]   # async: all 4 (batch_size 4), in completion order
                wrong += int((obs[:, 0] != t).sum())
            return wrong
        exc, timing, wrong = timed(three_steps)
        if exc is not None:
            return outcome(exc, timing, "failed", pool)
        state = "usable, every row the env's own" if not wrong else f"usable, {wrong} rows wrong"
        return outcome(None, timing, state, pool)


def refuses_then(pool: shmpool.Pool, mode: str) -> str:
    """After a failed reset: stepping is refused with an error that asks for reset()."""
    try:
        step_all(pool, mode)
    except RuntimeError as exc:
        return "refuses to step: " + re.sub(r"env \d+ ", "env N ", str(exc))
    return "steps an env whose reset failed"


def constructor_fails(mode: str) -> Outcome:
    exc, dt, _ = timed(lambda: pool_with(faulty("make")))
    return outcome(exc, dt, "no pool (workers reaped)")


def message_fails(name: str) -> Callable[[str], Outcome]:
    """``call(name)`` (render, a method) raises in env 3; async: while a batch is in flight."""
    def run(mode: str) -> Outcome:
        with pool_with(faulty(name if name == "render" else "call")) as pool:
            pool.reset()
            if mode == "async":
                pool.send(ZEROS)
            exc, dt, _ = timed(lambda: pool.call("render" if name == "render" else "probe"))
            if mode == "async":
                obs, rew, *_ = pool.recv()      # the batch in flight is not lost
                assert len(rew) == 4
            return outcome(exc, dt, probe_state(pool, mode))
    return run


def close_fails(mode: str) -> Outcome:
    pool = pool_with(faulty("close"))
    pool.reset()
    if mode == "async":
        pool.send(ZEROS)
    exc, dt, _ = timed(pool.close)
    return outcome(exc, dt, probe_state(pool, mode))


def worker_dies(how: str) -> Callable[[str], Outcome]:
    """The worker of env 3 dies inside ``step`` (SIGKILL or ``os._exit(3)``)."""
    return env_fails("step", how)


def killed_while_idle(mode: str) -> Outcome:
    with pool_with(faulty(), **restart_kwargs(mode)) as pool:
        pool.reset()
        pid = pool.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        # Dead but not reaped: the pool finds out at its next call (reaping it here, e.g. with
        # psutil's wait(), would hide the exit code from multiprocessing).
        while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.005)
        exc, dt, result = timed(lambda: step_all(pool, base(mode)), gone=pid)
        return outcome(exc, dt, probe_state(pool, mode, result), pool)


def reaped_elsewhere(mode: str) -> Outcome:
    """The worker is killed and reaped by someone else (a SIGCHLD handler, ``os.wait()``),
    so multiprocessing never learns its exit code: the pool must still notice."""
    with pool_with(faulty()) as pool:
        pool.reset()
        pid = pool.worker_pids[1]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        exc, dt, _ = timed(lambda: step_all(pool, mode), gone=pid)
        return outcome(exc, dt, probe_state(pool, mode))


def hangs(with_timeout: bool) -> Callable[[str], Outcome]:
    """Env 3 hangs in ``step``: ``step_timeout`` fires, or (without one) someone kills the
    hung worker after 0.3 s and the pool must notice that."""
    def run(mode: str) -> Outcome:
        kwargs = {"step_timeout": 0.3} if with_timeout else {}
        with pool_with(faulty("step", 2, "hang"), **kwargs, **restart_kwargs(mode)) as pool:
            pool.reset()
            pool.step(ZEROS)
            if not with_timeout:
                pid = pool.worker_pids[1]
                threading.Timer(0.3, lambda: os.kill(pid, signal.SIGKILL)).start()
            exc, dt, result = timed(lambda: step_all(pool, base(mode)), gone=pool.worker_pids[1])
            return outcome(exc, dt, probe_state(pool, mode, result), pool)
    return run


def keyboard_interrupt(after: float) -> Callable[[str], Outcome]:
    """Ctrl-C (SIGINT to the parent) ``after`` seconds into a step/recv that takes ``SLOW_STEP_S``
    (0.01 s: inside the wait's first slice; 0.1 s: a later one)."""
    def run(mode: str) -> Outcome:
        pool = pool_with(faulty("step", 2, "sleep"))
        pool.reset()
        pool.step(ZEROS)
        # Python's own Ctrl-C handler, as in a terminal: a runner started in the background
        # (no job control) hands its children SIGINT ignored, and then no Ctrl-C arrives.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)

        def interrupt(timing: Timing) -> None:
            timing.signal_at = timing.looks.count
            os.kill(os.getpid(), signal.SIGINT)
        try:
            exc, dt, _ = timed(lambda: step_all(pool, mode),
                               before=lambda timing: threading.Timer(after, interrupt, (timing,)).start())
        finally:
            signal.signal(signal.SIGINT, previous)
        return outcome(exc, dt, probe_state(pool, mode))
    return run


PARENT_SCRIPT = """
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np, shmpool
    pool = shmpool.Pool("CartPole-v1", 4, num_workers=2, batch_size={batch})
    pool.reset()
    print(*pool.worker_pids, flush=True)
    acts = np.zeros(4, dtype=np.int64)
    if {batch} == 4:
        while True:
            pool.step(acts)
    pool.async_reset()
    while True:
        *_, info = pool.recv()
        pool.send(acts[:{batch}], info["env_id"])
"""


def parent_killed(mode: str) -> Outcome:
    """The trainer process gets SIGKILL mid-run: its workers must follow within 2 s and
    nothing may be left in /dev/shm."""
    before = set(os.listdir("/dev/shm"))
    script = textwrap.dedent(PARENT_SCRIPT).format(tests=os.path.dirname(HERE), batch=4 if mode == "sync" else 2)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        if time.monotonic() - t0 > 2.0:
            break
        time.sleep(0.01)
    dt = time.monotonic() - t0
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    left = set(os.listdir("/dev/shm")) - before
    state = f"workers left: {alive}, /dev/shm left: {sorted(left)}" if alive or left else "workers gone, /dev/shm clean"
    return Outcome("none", "", Timing(dt), state)


# case name -> (runner, modes)
CASES: dict[str, tuple[Callable[[str], Outcome], tuple[str, ...]]] = {
    "exception in constructor": (constructor_fails, ("-",)),
    "exception in reset": (env_fails("reset"), MODES),
    "exception in step": (env_fails("step"), MODES),
    "exception in close": (close_fails, MODES),
    "exception in render": (message_fails("render"), MODES),
    "exception in call": (message_fails("call"), MODES),
    "SIGKILL while stepping": (worker_dies("kill"), DEATH_MODES),
    "SIGKILL while idle": (killed_while_idle, DEATH_MODES),
    "os._exit(3) in step": (worker_dies("exit"), DEATH_MODES),
    "worker reaped by someone else": (reaped_elsewhere, MODES),
    "hang in step, step_timeout=0.3": (hangs(True), DEATH_MODES),
    "hang in step, no timeout, worker killed": (hangs(False), DEATH_MODES),
    "observation of the wrong shape": (env_fails("step", "bad_obs"), MODES),
    "observation of the wrong dtype": (env_fails("step", "bad_dtype"), MODES),
    "non-finite reward": (env_fails("step", "nan_reward"), MODES),
    "KeyboardInterrupt in step/recv": (keyboard_interrupt(0.1), MODES),
    "KeyboardInterrupt early in step/recv": (keyboard_interrupt(0.01), MODES),
    "parent killed (SIGKILL)": (parent_killed, MODES),
    "a child forked in step returns": (env_forks, MODES),
}

ENV3 = r"env 3 \(worker 1, pid \d+\)"
WORKER1 = r"worker 1 \(pid \d+, cpu \d+, envs 2..3\)"
USABLE_AFTER_RESET = "usable after reset()"
CLOSED = "closed (PoolClosedError after)"
REFUSES = "refuses to step: env N raised ValueError in reset; call reset() before stepping again"

EXPECTED: dict[str, Expected] = {
    "exception in constructor": Expected(
        "EnvError", ENV3 + r" raised in make: ValueError: injected failure in make; the pool was not created",
        "no pool (workers reaped)"),
    "exception in reset": Expected("EnvError", ENV3 + r" raised in reset: ValueError: injected failure in reset",
                                   REFUSES),
    "exception in step": Expected("EnvError", ENV3 + r" raised in step: ValueError: injected failure in step; "
                                  r"call reset\(\) before stepping again", USABLE_AFTER_RESET),
    "exception in close": Expected("EnvError", ENV3 + r" raised in close: ValueError: injected failure in close",
                                   CLOSED),
    "exception in render": Expected("EnvError", ENV3 + r" raised in call 'render': ValueError: injected failure "
                                    r"in render", "usable"),
    "exception in call": Expected("EnvError", ENV3 + r" raised in call 'probe': ValueError: injected failure in call",
                                  "usable"),
    "SIGKILL while stepping": Expected("WorkerDiedError", WORKER1 + r" was killed by SIGKILL during (step|recv)",
                                       CLOSED, DEATH),
    "SIGKILL while idle": Expected("WorkerDiedError", WORKER1 + r" was killed by SIGKILL during (step|send|recv)",
                                   CLOSED, DEATH),
    "os._exit(3) in step": Expected("WorkerDiedError", WORKER1 + r" exited with code 3 during (step|recv)", CLOSED,
                                    DEATH),
    "worker reaped by someone else": Expected(
        "WorkerDiedError", WORKER1 + r" is gone \(reaped outside shmpool, exit status unknown\) during (step|recv)",
        CLOSED, DEATH),
    # The timeout (or the kill) at 0.3 s ends the call at its look.  The at_least (seconds: a lower bound no
    # load makes flaky) shows the timeout did wait; the message, that the timeout (or the death) ended it.
    "hang in step, step_timeout=0.3": Expected(
        "TimeoutError", r"did not finish within step_timeout=0.3 s: workers \[1\] \(envs 2..3\)", CLOSED,
        TIMEOUT, at_least=0.3),
    "hang in step, no timeout, worker killed": Expected(
        "WorkerDiedError", WORKER1 + r" was killed by SIGKILL during (step|recv)", CLOSED, DEATH, at_least=0.3),
    "observation of the wrong shape": Expected(
        "EnvError", ENV3 + r" raised in step: shmpool.workers.shard.ResultError: observation has shape \(5,\), "
        r"the space says \(4,\)",
        USABLE_AFTER_RESET),
    "observation of the wrong dtype": Expected(
        "EnvError", ENV3 + r" raised in step: shmpool.workers.shard.ResultError: observation has dtype complex64, "
        r"which the space's float32 cannot hold", USABLE_AFTER_RESET),
    "non-finite reward": Expected(
        "EnvError", ENV3 + r" raised in step: shmpool.workers.shard.ResultError: reward is nan: rewards must be finite",
        USABLE_AFTER_RESET),
    # The interrupt ends the call once the slice it landed in ends: a call that waited for the env's 3 s step
    # to end, and only then saw the interrupt, would make a look per 50 ms slice meanwhile.
    "KeyboardInterrupt in step/recv": Expected(
        "KeyboardInterrupt", r"^\nshmpool: the pool was closed and its workers killed \((step|recv) was interrupted\)$",
        CLOSED, INTERRUPT),
    "KeyboardInterrupt early in step/recv": Expected(
        "KeyboardInterrupt", r"^\nshmpool: the pool was closed and its workers killed \((step|recv) was interrupted\)$",
        CLOSED, INTERRUPT),
    # The workers follow their parent by the parent-death signal: no slice of this process waits for that, so
    # seconds: parent_killed polls for 2 s and its state names any worker still alive; the bound restates that.
    "parent killed (SIGKILL)": Expected("none", "", "workers gone, /dev/shm clean", NO_SLICE, limit=2.0),
    # Three steps, ~40 ms idle, no look needed.  Steps that waited for the forked child, which ends itself
    # CHILD_LIVES_S later, would look once per 50 ms slice meanwhile (6); up to 5 looks leave a loaded CI room.
    "a child forked in step returns": Expected("none", "", "usable, every row the env's own", STEPS,
                                               looks=math.ceil(CHILD_LIVES_S / SLICE_S) - 1),
}


# With on_worker_error="restart" the same faults raise nothing: worker 1 is replaced and only
# its envs (2 and 3) come back truncated with info["worker_restarted"].  Async, env 2's step
# result published before env 3 killed the worker is delivered as it is, and env 2 (rebuilt
# too) reports the restart at its next step.
RESTARTED = "usable; envs [2, 3] truncated, [2, 3] worker_restarted; restarts=1"
RESTARTED_LATE = "usable; envs [3] truncated, [3] worker_restarted, then [2]; restarts=1"


# What restart_log says for each restart cell (the raise-mode message of the same fault, the
# worker's words without its pid, since the replacement says nothing).
RESTART_CAUSE = {
    "SIGKILL while stepping": r"worker 1 was killed by SIGKILL during (step|recv)",
    "SIGKILL while idle": r"worker 1 was killed by SIGKILL during (step|send|recv)",
    "os._exit(3) in step": r"worker 1 exited with code 3 during (step|recv)",
    "hang in step, step_timeout=0.3": r"worker 1 did not finish (step|recv) within step_timeout=0.3 s and was killed "
                                      r"during (step|recv)",
    "hang in step, no timeout, worker killed": r"worker 1 was killed by SIGKILL during (step|recv)",
}


def expected(name: str, mode: str) -> Expected:
    if not mode.endswith("restart"):
        return EXPECTED[name]
    state = RESTARTED if mode.startswith("sync") or name == "SIGKILL while idle" else RESTARTED_LATE
    # The same look replaces the worker as would have raised (forking the replacement comes after it).
    raised = EXPECTED[name]
    return Expected("none", RESTART_CAUSE[name], state, raised.detection, at_least=raised.at_least)


def run_case(name: str, mode: str) -> Outcome:
    runner, _ = CASES[name]
    return runner(mode)


def cells() -> list[tuple[str, str]]:
    return [(name, mode) for name, (_, modes) in CASES.items() for mode in modes]


def markdown(results: dict[tuple[str, str], Outcome]) -> str:
    lines = ["| case | mode | raises | detected in | afterwards |", "| --- | --- | --- | --- | --- |"]
    for (name, mode), out in results.items():
        at = out.timing.detected_at
        look = "" if at is None else f" (look {at})"
        lines.append(f"| {name} | {mode} | {out.error} | {out.seconds * 1000:.0f} ms{look} | {out.state} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown({cell: run_case(*cell) for cell in cells()}))
